package transfer_test

import (
	"bytes"
	"cmp"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"go-hep.org/x/hep/xrootd"
	"golang.org/x/net/webdav"

	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/httpstore"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// protocolStore is one protocol under test: base is the URL of an empty directory
// on a real server (or the local file system), local the directory that
// holds its files, to look behind the protocol's back.
type protocolStore struct {
	name, base, local string
	// nested says whether the protocolStore needs parents made (file: mkdir,
	// WebDAV: MKCOL) and shows them as directories.
	nested bool
	// http is the HTTP client the row's transfer client is built on (nil:
	// the default), such as one that trusts the server's CA; tokens, if
	// set, gives the bearer token of each request.
	http   *http.Client
	tokens transfer.TokenSource
	// spaced is the directory the suite writes into, with a space in its
	// name to test escaping; "": "a b". A row whose storage cannot take a
	// space says what it uses instead, and a test of its own asserts why.
	spaced string
	// keepsAbortedPuts says the server keeps what an aborted PUT wrote
	// (x/net/webdav, xrootd), and Copy's DELETE can reach it before the
	// PUT does (the server still reading the body, or, for xrootd, not
	// yet opening the file): the partial object may stay until
	// post-processing's cleanup deletes it.
	keepsAbortedPuts bool
}

// dir is the name of the directory the suite writes into.
func (s protocolStore) dir() string { return cmp.Or(s.spaced, "a b") }

// client is a transfer client for the row, reaching what guard allows.
func (s protocolStore) client(guard *transfer.Guard) *transfer.Client {
	c := transfer.New(s.http).WithGuard(guard)
	if s.tokens != nil {
		c = c.WithTokenSource(s.tokens)
	}
	return c
}

func protocolStores(t *testing.T) []protocolStore {
	t.Helper()
	fileDir := t.TempDir()
	httpDir := t.TempDir()
	httpSrv := httptest.NewServer(httpstore.Handler(httpDir))
	t.Cleanup(httpSrv.Close)
	davDir := t.TempDir()
	dav := httptest.NewServer(&webdav.Handler{FileSystem: webdav.Dir(davDir), LockSystem: webdav.NewMemLS()})
	t.Cleanup(dav.Close)
	// S3: gofakes3, the S3 server inside "rclone serve s3", on loopback.
	s3backend := s3mem.New()
	if err := s3backend.CreateBucket("bucket"); err != nil {
		t.Fatal(err)
	}
	s3srv := httptest.NewServer(gofakes3.New(s3backend).Server())
	t.Cleanup(s3srv.Close)
	t.Setenv("AWS_ACCESS_KEY_ID", "sluice")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "sluice-secret")
	// xrootd: go-hep's server on loopback.
	xrdDir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	xrdSrv := xrootd.NewServer(xrootd.NewFSHandler(xrdDir), nil)
	go func() { _ = xrdSrv.Serve(l) }()
	t.Cleanup(func() { _ = xrdSrv.Shutdown(context.Background()) })
	stores := []protocolStore{
		{name: "xrootd (go-hep server)", base: "root://" + l.Addr().String() + "/", local: xrdDir, nested: true},
		{name: "s3 (gofakes3)", base: "s3://" + strings.TrimPrefix(s3srv.URL, "http://") + "/bucket"},
		{name: "file", base: fileURL(fileDir), local: fileDir, nested: true},
		{name: "http", base: httpSrv.URL, local: httpDir},
		{name: "webdav (golang.org/x/net/webdav)", base: dav.URL, local: davDir, nested: true, keepsAbortedPuts: true},
		{name: "dav:// scheme", base: "dav://" + strings.TrimPrefix(dav.URL, "http://"), local: davDir, nested: true, keepsAbortedPuts: true},
	}
	return append(stores, realXrootdStores(t)...)
}

// TestEveryProtocolPassesTheSameConformanceSuite runs one suite of
// operations against every protocol Sluice moves data with, each against
// a real server started on loopback.
func TestEveryProtocolPassesTheSameConformanceSuite(t *testing.T) {
	data := bytes.Repeat([]byte("conformance "), 50000)
	src := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	want, _ := checksum.File(src, "adler32")
	ctx := context.Background()
	for _, s := range protocolStores(t) {
		t.Run(s.name, func(t *testing.T) {
			c := s.client(loopback)
			obj := s.base + "/run/" + s.dir() + "/file"
			if info, err := c.Stat(ctx, obj); err != nil || info.Exists {
				t.Fatalf("stat of a missing object: %+v, %v", info, err)
			}
			if err := c.MakeParents(ctx, obj); err != nil {
				t.Fatalf("make parents: %v", err)
			}
			if s.nested && s.local != "" {
				if fi, err := os.Stat(filepath.Join(s.local, "run", s.dir())); err != nil || !fi.IsDir() {
					t.Fatalf("parents not made: %v", err)
				}
			}
			res, err := c.Copy(ctx, fileURL(src), obj, transfer.CopyOptions{})
			if err != nil {
				t.Fatalf("upload: %v", err)
			}
			if res.Bytes != int64(len(data)) || res.Checksums["adler32"] != want {
				t.Fatalf("upload moved %d bytes with %s, want %d with %s", res.Bytes, res.Checksums["adler32"], len(data), want)
			}
			if s.local != "" {
				if b, err := os.ReadFile(filepath.Join(s.local, "run", s.dir(), "file")); err != nil || !bytes.Equal(b, data) {
					t.Fatalf("the stored object differs: %v", err)
				}
			}
			if info, err := c.Stat(ctx, obj); err != nil || !info.Exists || info.Size != int64(len(data)) {
				t.Fatalf("stat: %+v, %v", info, err)
			}
			back := filepath.Join(t.TempDir(), "back")
			res, err = c.Copy(ctx, obj, fileURL(back), transfer.CopyOptions{ChecksumTypes: []string{"adler32", "crc32c"}})
			if err != nil || res.Checksums["adler32"] != want {
				t.Fatalf("download: %v, %v", res.Checksums, err)
			}
			if b, _ := os.ReadFile(back); !bytes.Equal(b, data) {
				t.Fatal("the downloaded file differs")
			}
			// A source of another size than queried fails at the source
			// and is retried (TEMPORARY_REMOTE), whichever protocol it is
			// read with or written to, and nothing of it is left; one
			// larger than the maximum is refused for good.
			bad := filepath.Join(t.TempDir(), "bad")
			_, err = c.Copy(ctx, obj, fileURL(bad), transfer.CopyOptions{ExpectedSize: int64(len(data)) + 1})
			sizeErr(t, err, obj, dtr.ErrTemporaryRemote, "size changed")
			checkAbsent(t, bad)
			_, err = c.Copy(ctx, obj, fileURL(bad), transfer.CopyOptions{MaxSize: int64(len(data)) - 1})
			sizeErr(t, err, obj, map[bool]dtr.ErrorKind{true: dtr.ErrLocalFile, false: dtr.ErrPermanentRemote}[s.name == "file"], "maximum file size")
			checkAbsent(t, bad)
			for _, sends := range []int{len(data) - 1000, len(data) + 1000} {
				short, _ := closeDelimitedServer(t, sized(sends))
				// A name of its own: an aborted upload may still hold
				// the last one (xrootd answers 423 Locked meanwhile).
				into := s.base + "/run/" + s.dir() + "/resized-" + strconv.Itoa(sends)
				_, err = c.Copy(ctx, short+"/f", into, transfer.CopyOptions{ExpectedSize: int64(len(data))})
				sizeErr(t, err, short+"/f", dtr.ErrTemporaryRemote, "size changed")
				if s.keepsAbortedPuts {
					continue
				}
				if info, err := c.Stat(ctx, into); err != nil || info.Exists {
					t.Fatalf("a source of %d bytes, not the %d queried, left %+v, %v", sends, len(data), info, err)
				}
			}
			_, err = c.Copy(ctx, s.base+"/no/such/object", fileURL(filepath.Join(t.TempDir(), "x")), transfer.CopyOptions{})
			checkKind(t, err, map[bool]dtr.ErrorKind{true: dtr.ErrLocalFile, false: dtr.ErrPermanentRemote}[s.name == "file"])
			if err := c.Delete(ctx, obj); err != nil {
				t.Fatalf("delete: %v", err)
			}
			if info, err := c.Stat(ctx, obj); err != nil || info.Exists {
				t.Fatalf("after delete: %+v, %v", info, err)
			}
			if err := c.Delete(ctx, obj); err != nil {
				t.Fatalf("deleting a missing object: %v", err)
			}
		})
	}
}

func TestS3UploadsLargeObjectsInPartsAndReadsThemBack(t *testing.T) {
	backend := s3mem.New()
	if err := backend.CreateBucket("big"); err != nil {
		t.Fatal(err)
	}
	s3 := gofakes3.New(backend).Server()
	var parts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.URL.Query().Get("partNumber") != "" {
			parts.Add(1)
		}
		s3.ServeHTTP(w, r)
	}))
	defer srv.Close()
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys")
	if err := os.WriteFile(keys, []byte("sluice sluice-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	c := transfer.New(nil).WithGuard(loopback).WithS3Credentials(map[string]string{host: keys})
	data := make([]byte, 40<<20) // more than two 16 MiB parts
	for i := range data {
		data[i] = byte(i * 7 / 3)
	}
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	obj := "s3://" + host + "/big/large.bin"
	ctx := context.Background()
	up, err := c.Copy(ctx, fileURL(src), obj, transfer.CopyOptions{ChecksumTypes: []string{"md5"}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Stat(ctx, obj)
	if err != nil || info.Size != int64(len(data)) {
		t.Fatalf("stat: %+v, %v", info, err)
	}
	if n := parts.Load(); n < 3 {
		t.Fatalf("the 40 MiB object went up in %d parts, want 3 of at most 16 MiB", n)
	}
	down, err := c.Copy(ctx, obj, fileURL(filepath.Join(dir, "back")), transfer.CopyOptions{ChecksumTypes: []string{"md5"}})
	if err != nil || down.Checksums["md5"] != up.Checksums["md5"] {
		t.Fatalf("download: %v, %s against %s", err, down.Checksums["md5"], up.Checksums["md5"])
	}
	// Wrong keys are refused by the server... gofakes3 accepts any, so a
	// missing key file stands for them: this site's problem, LOCAL_FILE.
	bad := transfer.New(nil).WithGuard(loopback).WithS3Credentials(map[string]string{host: filepath.Join(dir, "missing")})
	_, err = bad.Stat(ctx, obj)
	checkKind(t, err, dtr.ErrLocalFile)
}

// TestEveryProtocolThatRenamesReplacesTheFinalNameWithItsTemporaryOne
// writes a file under a grant's temporary name and renames it over an
// existing object, on every protocol that renames; the others keep the
// final name as their temporary one.
func TestEveryProtocolThatRenamesReplacesTheFinalNameWithItsTemporaryOne(t *testing.T) {
	dir := t.TempDir()
	old, fresh := filepath.Join(dir, "old"), filepath.Join(dir, "new")
	if err := os.WriteFile(old, []byte("the old file"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fresh, bytes.Repeat([]byte("the new file "), 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(fresh)
	ctx := context.Background()
	for _, s := range protocolStores(t) {
		t.Run(s.name, func(t *testing.T) {
			c := s.client(loopback)
			obj := s.base + "/renamed/file"
			if err := c.MakeParents(ctx, obj); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Copy(ctx, fileURL(old), obj, transfer.CopyOptions{}); err != nil {
				t.Fatal(err)
			}
			tmp := transfer.TempURL(obj, "0e8b3c1a-0000-4000-8000-000000000001.2")
			u, _ := url.Parse(obj)
			if renames := transfer.Renames(u.Scheme); renames != (tmp != obj) {
				t.Fatalf("Renames(%s) is %v but the temporary name is %s", u.Scheme, renames, tmp)
			}
			if tmp == obj {
				return // written in place
			}
			if !strings.Contains(tmp, "/renamed/.file.sluice-0e8b3c1a-0000-4000-8000-000000000001.2.part") {
				t.Fatalf("temporary name %s, want one in the same directory", tmp)
			}
			if _, err := c.Copy(ctx, fileURL(fresh), tmp, transfer.CopyOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := c.Rename(ctx, tmp, obj); err != nil {
				t.Fatalf("rename over an existing object: %v", err)
			}
			if info, err := c.Stat(ctx, tmp); err != nil || info.Exists {
				t.Fatalf("the temporary name after the rename: %+v, %v", info, err)
			}
			back := filepath.Join(t.TempDir(), "back")
			if _, err := c.Copy(ctx, obj, fileURL(back), transfer.CopyOptions{}); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(back); !bytes.Equal(b, want) {
				t.Fatalf("the final name holds %q…, want the new file", b[:min(len(b), 20)])
			}
			if err := c.Rename(ctx, tmp, obj); err == nil || transfer.KindOf(err) == dtr.ErrInternalLogic {
				t.Fatalf("renaming a temporary name that is gone: %v, want a storage error", err)
			}
		})
	}
}

// TestEveryProtocolReachesOnlyWhatItsGuardAllows runs every operation of
// every network protocol against its real server on loopback with a Guard
// that refuses it: loopback not allowed (the default), and loopback
// allowed but the server's address denied as Sluice's own. Each is refused
// before anything reaches the server, PERMANENT_REMOTE, naming the
// address and why.
func TestEveryProtocolReachesOnlyWhatItsGuardAllows(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(src, []byte("confined"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, s := range protocolStores(t) {
		if s.name == "file" {
			continue
		}
		u, _ := url.Parse(s.base)
		own := mustGuard("127.0.0.0/8", "::1")
		if err := own.Deny("Sluice's own NATS server", u.Host); err != nil {
			t.Fatal(err)
		}
		guards := []struct {
			name  string
			guard *transfer.Guard
			want  string
		}{
			{"loopback not allowed", nil, "connection to " + u.Host + " refused: it is loopback; SLUICE_ALLOW_NETWORKS does not allow it"},
			{"Sluice's own address with loopback allowed", own, "connection to " + u.Host + " refused: it is Sluice's own NATS server, which no transfer may reach"},
		}
		for _, g := range guards {
			t.Run(s.name+"/"+g.name, func(t *testing.T) {
				c := s.client(g.guard)
				obj := s.base + "/confined/file"
				back := filepath.Join(t.TempDir(), "back")
				ops := map[string]func() error{
					"stat": func() error { _, err := c.Stat(ctx, obj); return err },
					"upload": func() error {
						_, err := c.Copy(ctx, fileURL(src), obj, transfer.CopyOptions{})
						return err
					},
					"download": func() error {
						_, err := c.Copy(ctx, obj, fileURL(back), transfer.CopyOptions{})
						return err
					},
					"delete": func() error { return c.Delete(ctx, obj) },
				}
				if !transfer.AppearsWhole(obj) { // S3 has no directories to make: it connects to nothing
					ops["make parents"] = func() error { return c.MakeParents(ctx, obj) }
				}
				if transfer.Renames(u.Scheme) {
					ops["rename"] = func() error { return c.Rename(ctx, transfer.TempURL(obj, "g.1"), obj) }
				}
				for op, do := range ops {
					if err := do(); transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), g.want) {
						t.Errorf("%s: %v (%s), want PERMANENT_REMOTE saying %q", op, err, transfer.KindOf(err), g.want)
					}
				}
				checkAbsent(t, back)
				if s.local != "" {
					if _, err := os.Stat(filepath.Join(s.local, "confined")); err == nil {
						t.Error("the refused server got a directory")
					}
				}
			})
		}
	}
}
