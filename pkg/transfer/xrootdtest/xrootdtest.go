// Package xrootdtest runs, for a test, the real xrootd server of the grid
// (Debian's xrootd-server, 5.5), exporting a temporary directory on free
// ports: root:// always, and on request HTTPS/WebDAV (XrdHttp) with a
// certificate of a throwaway CA, the HTTP third-party-copy handler
// (XrdHttpTPC) and SciTokens authorisation (XrdAccSciTokens) trusting an
// issuer the test runs, such as pkg/token/tokentest's.
//
// A test that calls Start is skipped, with what to install, when xrootd or
// one of the plugins it asks for is missing.
//
// xrootd refuses to run as root ("Security reasons prohibit running as
// superuser"). Started by root, as in CI, it runs as the system's xrootd
// user (nobody where there is none), and the helper's directory is made
// that user's: so files the test puts into the exported directory
// behind the server's back should go through WriteFile and MkdirAll,
// which give them to that user too.
package xrootdtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Install is what a machine without xrootd needs, as the skip banner says.
const Install = "xrootd-server xrootd-server-plugins xrootd-plugins xrootd-scitokens-plugins xrootd-client"

// Options say what the server offers besides root://.
type Options struct {
	// HTTP serves HTTPS and WebDAV (XrdHttp) on a port of its own, with a
	// certificate of CA.
	HTTP bool
	// TPC loads the HTTP third-party-copy handler (COPY, pull and push);
	// it implies HTTP. The server trusts CA alone as the other end of a
	// copy: servers started with the same CA copy between each other.
	TPC bool
	// CA signs the server's certificate and is the one CA it trusts; nil:
	// a new one (Server.CA).
	CA *CA
	// Checksum is the algorithm of xrootd.chksum, such as "adler32",
	// which the server answers for over HTTP (Want-Digest) and root://
	// (kXR_Qcksum); "": none configured, as on a storage that keeps no
	// checksums.
	Checksum string
	// Tokens turns SciTokens authorisation on; nil: none, everything is
	// allowed to everyone.
	Tokens *Tokens
}

// Tokens configures the SciTokens authorisation of the server: it allows
// a request whose bearer token is signed by Issuer, names one of
// Audience, and has a scope (storage.read, storage.create,
// storage.modify) that covers the path, relative to BasePath.
type Tokens struct {
	// Issuer is the issuer's URL, as the iss of its tokens. Its key set
	// is fetched from it (discovery, then jwks_uri) when the server
	// starts and by RefreshIssuerKeys.
	Issuer string
	// Audience are the audiences accepted besides the server's own HTTPS
	// URLs (Server.HTTPS, https://127.0.0.1:<port>, as transfer.Audience
	// writes it, and https://localhost:<port>), which are always
	// accepted: a storage is the audience of tokens for it.
	Audience []string
	// BasePath is the directory of the export that scopes are relative
	// to; "": "/".
	BasePath string
	// HTTPClient fetches the issuer's keys; nil: one that trusts the
	// server's CA (for an https issuer) and plain http.
	HTTPClient *http.Client
}

// Server is a running xrootd.
type Server struct {
	// Dir is the exported directory: root://…//x and https://…/x are
	// Dir/x.
	Dir string
	// Root is the root:// URL of the export, root://127.0.0.1:<port>/:
	// Root plus an absolute path ("/x", giving root://…//x) names a file.
	Root string
	// HTTPS is the https:// URL of the export, without a trailing slash;
	// "" unless HTTP or TPC was asked for.
	HTTPS string
	// HTTP is the same port spoken to in plain http (XrdHttp takes both),
	// for a client that cannot be given the CA; "" unless HTTP or TPC was
	// asked for.
	HTTP string
	// CA signed the server's certificate.
	CA *CA

	opt      Options
	base     string // the helper's directory
	cacheDir string // XDG_CACHE_HOME of the server
	uid, gid int    // the server's user, or -1 when not changed
	cmd      *exec.Cmd
	exited   chan struct{}
	log      *syncBuffer
}

// Start starts an xrootd exporting a new empty directory, and stops it
// when the test ends. The server's log is shown if the test fails.
func Start(t testing.TB, opt Options) *Server {
	t.Helper()
	if opt.TPC {
		opt.HTTP = true
	}
	bin := Require(t, opt)
	if opt.CA == nil {
		opt.CA = NewCA(t)
	}
	if opt.Tokens != nil && !opt.HTTP {
		// Tokens reach xrootd over HTTP here: go-hep's root:// client,
		// Sluice's, speaks none of xrootd's token protocols (ztn).
		t.Fatal("xrootdtest: Tokens need HTTP")
	}
	base, err := os.MkdirTemp("", "xrootdtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	s := &Server{
		Dir: filepath.Join(base, "export"), CA: opt.CA, opt: opt, base: base,
		cacheDir: filepath.Join(base, "cache"), uid: -1, gid: -1,
	}
	runAs := s.userFor(t)
	for _, d := range []string{s.Dir, s.cacheDir, filepath.Join(base, "admin"), filepath.Join(base, "cadir")} {
		s.mkdir(t, d)
	}
	if opt.HTTP {
		certPEM, keyPEM := opt.CA.Issue(t)
		s.write(t, filepath.Join(base, "host.pem"), certPEM, 0o644)
		// XrdTls refuses a key that others may read.
		s.write(t, filepath.Join(base, "host.key"), keyPEM, 0o600)
		// xrootd gives the CAs of this directory to libcurl for
		// third-party copies (it concatenates them into a file of its
		// own), so the hashed names OpenSSL looks up are not needed.
		s.write(t, filepath.Join(base, "cadir", "ca.pem"), opt.CA.PEM, 0o644)
	}
	if opt.Tokens != nil {
		s.RefreshIssuerKeys(t)
	}
	log := &syncBuffer{}
	s.log = log
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("xrootd's log (%s):\n%s", s.Root, log.String())
		}
	})
	// The ports are free when chosen, but another process may take one
	// before xrootd binds it: then it is started again on others.
	for attempt := 1; ; attempt++ {
		rootPort, httpPort := freePort(t), 0
		if opt.HTTP {
			httpPort = freePort(t)
		}
		cfg := filepath.Join(base, "xrootd.cfg")
		s.write(t, cfg, []byte(s.config(rootPort, httpPort)), 0o644)
		if opt.Tokens != nil {
			s.writeSciTokensConfig(t, fmt.Sprintf("https://127.0.0.1:%d", httpPort), fmt.Sprintf("https://localhost:%d", httpPort))
		}
		args := []string{"-c", cfg, "-n", "xrootdtest"}
		if runAs != "" && !switchesUser {
			args = append(args, "-R", runAs)
		}
		log.Reset()
		s.cmd = exec.Command(bin, args...)
		s.cmd.Dir = base
		s.cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+s.cacheDir, "HOME="+base)
		s.cmd.Stdout, s.cmd.Stderr = log, log
		s.cmd.SysProcAttr = sysProcAttr(s.uid, s.gid)
		if err := s.cmd.Start(); err != nil {
			t.Fatalf("xrootdtest: starting %s: %v", bin, err)
		}
		s.exited = make(chan struct{})
		go func(cmd *exec.Cmd, exited chan struct{}) { _ = cmd.Wait(); close(exited) }(s.cmd, s.exited)
		s.Root = fmt.Sprintf("root://127.0.0.1:%d/", rootPort)
		if opt.HTTP {
			s.HTTPS = fmt.Sprintf("https://127.0.0.1:%d", httpPort)
			s.HTTP = fmt.Sprintf("http://127.0.0.1:%d", httpPort)
		}
		err := s.waitReady(rootPort, httpPort)
		if err == nil {
			t.Cleanup(s.stop)
			return s
		}
		s.stop()
		if attempt < 3 && strings.Contains(log.String(), "already in use") {
			continue
		}
		t.Fatalf("xrootdtest: %v; its log:\n%s", err, log.String())
	}
}

// Require skips the test, saying what to install, unless xrootd and the
// plugins opt needs are installed; it returns the path of xrootd.
func Require(t testing.TB, opt Options) string {
	t.Helper()
	if why := Missing(opt); why != "" {
		t.Skip(why)
	}
	bin, _ := exec.LookPath("xrootd")
	return bin
}

// Missing says why a server with opt cannot run here, as the banner of a
// skipped test: "" when xrootd and the plugins opt needs are installed. A
// test that runs real xrootd beside other servers uses it to leave out
// xrootd's part rather than skip the whole test.
func Missing(opt Options) string {
	if _, err := exec.LookPath("xrootd"); err != nil {
		return "real xrootd tests skipped: no xrootd on PATH; install " + Install
	}
	var plugins []string
	if opt.HTTP || opt.TPC {
		plugins = append(plugins, "libXrdHttp-5.so")
	}
	if opt.TPC {
		plugins = append(plugins, "libXrdHttpTPC-5.so")
	}
	if opt.Tokens != nil {
		plugins = append(plugins, "libXrdAccSciTokens-5.so")
	}
	for _, p := range plugins {
		if !pluginInstalled(p) {
			return "real xrootd tests skipped: no " + p + "; install " + Install
		}
	}
	return ""
}

// pluginInstalled says whether the loader finds the plugin library in one
// of the directories plugins are installed to.
func pluginInstalled(name string) bool {
	dirs := filepath.SplitList(os.Getenv("LD_LIBRARY_PATH"))
	multiarch, _ := filepath.Glob("/usr/lib/*-linux-gnu")
	dirs = append(dirs, multiarch...)
	dirs = append(dirs, "/usr/lib64", "/usr/lib", "/usr/local/lib", "/usr/local/lib64")
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, name)); err == nil {
			return true
		}
	}
	return false
}

// config is xrootd's configuration file.
func (s *Server) config(rootPort, httpPort int) string {
	var b strings.Builder
	line := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	line("all.export /")
	line("oss.localroot %s", s.Dir)
	line("all.adminpath %s", filepath.Join(s.base, "admin"))
	line("all.pidpath %s", filepath.Join(s.base, "admin"))
	line("xrd.port %d", rootPort)
	if s.opt.HTTP {
		line("xrd.protocol XrdHttp:%d libXrdHttp.so", httpPort)
		line("xrd.tls %s %s", filepath.Join(s.base, "host.pem"), filepath.Join(s.base, "host.key"))
		line("xrd.tlsca certdir %s", filepath.Join(s.base, "cadir"))
	}
	if s.opt.TPC {
		line("http.exthandler xrdtpc libXrdHttpTPC.so")
	}
	if s.opt.Checksum != "" {
		line("xrootd.chksum %s", s.opt.Checksum)
	}
	if s.opt.Tokens != nil {
		line("ofs.authorize 1")
		line("scitokens.trace all")
		if s.opt.HTTP {
			line("http.header2cgi Authorization authz")
		}
		line("ofs.authlib libXrdAccSciTokens.so config=%s", filepath.Join(s.base, "scitokens.cfg"))
	}
	return b.String()
}

// writeSciTokensConfig writes the configuration of XrdAccSciTokens.
func (s *Server) writeSciTokensConfig(t testing.TB, self ...string) {
	t.Helper()
	tok := s.opt.Tokens
	aud, err := json.Marshal(append(self, tok.Audience...))
	if err != nil {
		t.Fatal(err)
	}
	basePath := tok.BasePath
	if basePath == "" {
		basePath = "/"
	}
	cfg := fmt.Sprintf("[Global]\naudience_json = %s\n\n[Issuer test]\nissuer = %s\nbase_path = %s\n", aud, tok.Issuer, basePath)
	s.write(t, filepath.Join(s.base, "scitokens.cfg"), []byte(cfg), 0o644)
}

// RefreshIssuerKeys fetches the key set of the Tokens issuer again and
// gives it to the server, which verifies tokens with the keys it last got:
// call it after the issuer rotates to a new key.
func (s *Server) RefreshIssuerKeys(t testing.TB) {
	t.Helper()
	tok := s.opt.Tokens
	if tok == nil {
		t.Fatal("xrootdtest: RefreshIssuerKeys of a server without Tokens")
	}
	client := tok.HTTPClient
	if client == nil {
		client = s.CA.Client()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var disc struct {
		JWKSURI string `json:"jwks_uri"`
	}
	if err := getJSON(ctx, client, strings.TrimSuffix(tok.Issuer, "/")+"/.well-known/openid-configuration", &disc); err != nil {
		t.Fatalf("xrootdtest: discovery of the issuer: %v", err)
	}
	var jwks json.RawMessage
	if err := getJSON(ctx, client, disc.JWKSURI, &jwks); err != nil {
		t.Fatalf("xrootdtest: the issuer's keys: %v", err)
	}
	// Due for no update while a test runs: the library would then ask the
	// issuer, over HTTPS with the system's CAs.
	now := time.Now()
	entry, err := keyCacheEntry(jwks, now.Add(24*time.Hour).Unix(), now.Add(48*time.Hour).Unix())
	if err != nil {
		t.Fatal(err)
	}
	db, err := keyCacheDB(tok.Issuer, entry)
	if err != nil {
		t.Fatalf("xrootdtest: %v", err)
	}
	file := filepath.Join(s.cacheDir, keyCacheFile)
	s.mkdir(t, filepath.Dir(file))
	// The library opens the database at every lookup: a new file is
	// seen at the next token.
	tmp := file + ".new"
	s.write(t, tmp, db, 0o600)
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
}

func getJSON(ctx context.Context, client *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}

// Client is an HTTP client that trusts the server's CA.
func (s *Server) Client() *http.Client { return s.CA.Client() }

// Path is the local path of name, a path in the export.
func (s *Server) Path(name string) string {
	return filepath.Join(s.Dir, filepath.FromSlash(strings.TrimPrefix(name, "/")))
}

// WriteFile puts a file at name, a path in the export, as the server's
// own, making its parents.
func (s *Server) WriteFile(t testing.TB, name string, data []byte) {
	t.Helper()
	p := s.Path(name)
	s.MkdirAll(t, filepath.Dir(strings.TrimPrefix(p, s.Dir)))
	s.write(t, p, data, 0o644)
}

// MkdirAll makes a directory at name, a path in the export, and its
// parents, as the server's own.
func (s *Server) MkdirAll(t testing.TB, name string) {
	t.Helper()
	rel := strings.Trim(filepath.ToSlash(name), "/")
	if rel == "" || rel == "." {
		return
	}
	p := s.Dir
	for _, part := range strings.Split(rel, "/") {
		p = filepath.Join(p, part)
		s.mkdir(t, p)
	}
}

// Log is what the server has logged so far.
func (s *Server) Log() string { return s.log.String() }

// userFor returns the user xrootd is to run as, and makes the helper's
// directory theirs; "" when the test does not run as root.
func (s *Server) userFor(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		return ""
	}
	for _, name := range []string{"xrootd", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err1 != nil || err2 != nil {
			continue
		}
		s.uid, s.gid = uid, gid
		if err := os.Chown(s.base, uid, gid); err != nil {
			t.Fatal(err)
		}
		return name
	}
	t.Skip("real xrootd tests skipped: xrootd will not run as root, and there is no xrootd or nobody user to run it as")
	return ""
}

// mkdir makes a directory (if missing) that the server's user owns.
func (s *Server) mkdir(t testing.TB, dir string) {
	t.Helper()
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		t.Fatal(err)
	}
	s.chown(t, dir)
}

// write writes a file that the server's user owns.
func (s *Server) write(t testing.TB, name string, data []byte, perm os.FileMode) {
	t.Helper()
	if err := os.WriteFile(name, data, perm); err != nil {
		t.Fatal(err)
	}
	s.chown(t, name)
}

func (s *Server) chown(t testing.TB, name string) {
	t.Helper()
	if s.uid < 0 {
		return
	}
	if err := os.Chown(name, s.uid, s.gid); err != nil {
		t.Fatal(err)
	}
}

// waitReady waits until xrootd accepts connections on its ports.
func (s *Server) waitReady(ports ...int) error {
	deadline := time.Now().Add(30 * time.Second)
	for _, port := range ports {
		if port == 0 {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		for {
			conn, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				conn.Close()
				break
			}
			select {
			case <-s.exited:
				return fmt.Errorf("xrootd exited before it listened on %s (%v)", addr, s.cmd.ProcessState)
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("xrootd does not listen on %s after 30s", addr)
			}
		}
	}
	return nil
}

// stop ends xrootd: SIGTERM, then SIGKILL if it has not exited in 5s.
func (s *Server) stop() {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// freePort returns a TCP port free on every address at the moment: xrootd
// listens on all of them.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// syncBuffer is a log written by the server's process and read by the
// test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *syncBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Reset()
}
