package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/internal/app/securetest"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
)

// defaults is the configuration with its built-in defaults only.
func defaults(t *testing.T) Config {
	t.Helper()
	var cfg Config
	// A prefix no one sets: the defaults and nothing from the environment.
	if err := envconfig.Process("sluice_conn_test_unset", &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.StateFile = ""
	return cfg
}

// syncBuffer is a log destination that roles write from many goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// running is a role run by runRoles.
type running struct {
	health string // URL of its /healthz
	log    *syncBuffer
	done   chan error
}

// runRoles runs roles with cfg, its HTTP server on a free port, until the
// test ends.
func runRoles(t *testing.T, cfg Config, roles ...string) *running {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.HTTP = ln
	scheme := "http"
	if cfg.HTTPTLSCert != "" {
		scheme = "https"
	}
	r := &running{health: scheme + "://" + ln.Addr().String() + "/healthz", log: &syncBuffer{}, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.NewTextHandler(r.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	go func() { r.done <- Run(ctx, cfg, roles, log) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			t.Error("roles did not stop")
		}
	})
	return r
}

// healthy waits until /healthz says every role is ok.
func (r *running) healthy(t *testing.T, client *http.Client) Health {
	t.Helper()
	if client == nil {
		client = http.DefaultClient
	}
	deadline := time.Now().Add(20 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		select {
		case err := <-r.done:
			t.Fatalf("roles stopped: %v\n%s", err, r.log)
		default:
		}
		resp, err := client.Get(r.health)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var h Health
			if json.Unmarshal(b, &h) == nil && h.OK {
				return h
			}
			last = string(b)
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("not healthy after 20s: %s\nlog:\n%s", last, r.log)
	return Health{}
}

// askShares asks the scheduler for its share table over a connection made
// with cfg, as the client commands do.
func askShares(t *testing.T, cfg Config) {
	t.Helper()
	opts, err := cfg.NATSOptions()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(cfg.NATSURL, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// A scheduler is healthy once warm, a moment before it has won its
	// term and serves.
	var reply *nats.Msg
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		reply, err = nc.Request(api.SubjectShares, nil, 10*time.Second)
		if !errors.Is(err, nats.ErrNoResponders) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("sluice.api.shares: %v", err)
	}
	if !bytes.Contains(reply.Data, []byte(`"limits"`)) {
		t.Fatalf("sluice.api.shares answered %s", reply.Data)
	}
}

// secureServers are real NATS servers that require TLS: one verifies
// clients' certificates and has a user with a password and an nkey user;
// one is in operator mode, its users in JWTs signed by an account that a
// memory resolver holds. No user may subscribe to nats.go's default
// inboxes (_INBOX.>), so only a connection with its own prefix gets
// replies.
type secureServers struct {
	pki                *securetest.PKI
	verifyURL, opURL   string
	nkeySeed, nkeyPub  string
	op                 *securetest.Operator
	password, credsDir string
}

func startSecureServers(t *testing.T) *secureServers {
	t.Helper()
	s := &secureServers{pki: securetest.NewPKI(t), credsDir: t.TempDir(), password: "pw-" + t.Name()}
	s.password = strings.NewReplacer("/", "-", " ", "-").Replace(s.password)
	s.nkeySeed, s.nkeyPub = securetest.Nkey(t, s.credsDir)
	_, s.verifyURL = securetest.Server(t, s.pki.TLSConf(true)+`authorization { users: [
  { user: alice, password: "`+s.password+`", `+securetest.NoDefaultInbox+` }
  { nkey: `+s.nkeyPub+`, `+securetest.NoDefaultInbox+` }
] }
`)
	s.op = securetest.NewOperator(t)
	_, s.opURL = securetest.Server(t, s.pki.TLSConf(false)+s.op.Conf())
	return s
}

func TestEachNATSLoginRunsARoleOverTLS(t *testing.T) {
	s := startSecureServers(t)
	named, _ := s.op.Creds(t, s.credsDir, "carol")
	unnamed, unnamedPub := s.op.Creds(t, s.credsDir, "")
	tests := []struct {
		name   string
		set    func(*Config)
		prefix string
	}{
		{"a user and password, with a client certificate", func(c *Config) {
			c.NATSURL, c.NATSUser, c.NATSPassword = s.verifyURL, "alice", s.password
			c.NATSTLSCert, c.NATSTLSKey = s.pki.ClientCert, s.pki.ClientKey
		}, "_INBOX_alice"},
		{"an nkey, with a client certificate", func(c *Config) {
			c.NATSURL, c.NATSNkey = s.verifyURL, s.nkeySeed
			c.NATSTLSCert, c.NATSTLSKey = s.pki.ClientCert, s.pki.ClientKey
		}, "_INBOX_" + s.nkeyPub},
		{"an nkey and an inbox prefix of its own", func(c *Config) {
			c.NATSURL, c.NATSNkey, c.NATSInboxPrefix = s.verifyURL, s.nkeySeed, "_INBOX_sluice.nkey"
			c.NATSTLSCert, c.NATSTLSKey = s.pki.ClientCert, s.pki.ClientKey
		}, "_INBOX_sluice.nkey"},
		{"credentials of a named user (operator mode)", func(c *Config) {
			c.NATSURL, c.NATSCreds = s.opURL, named
		}, "_INBOX_carol"},
		{"credentials of a user without a name", func(c *Config) {
			c.NATSURL, c.NATSCreds = s.opURL, unnamed
		}, "_INBOX_" + unnamedPub},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := defaults(t)
			cfg.NATSTLSCA = s.pki.CA
			tt.set(&cfg)
			var o nats.Options
			for _, opt := range cfg.Options() {
				if err := opt(&o); err != nil {
					t.Fatal(err)
				}
			}
			if o.InboxPrefix != tt.prefix {
				t.Fatalf("inbox prefix %q, want %q", o.InboxPrefix, tt.prefix)
			}
			r := runRoles(t, cfg, "scheduler")
			h := r.healthy(t, nil)
			if h.Roles["scheduler"].NATS != "CONNECTED" {
				t.Fatalf("healthz %+v", h)
			}
			askShares(t, cfg)
			if strings.Contains(r.log.String(), "Violation") {
				t.Fatalf("the server refused something:\n%s", r.log)
			}
		})
	}
}

func TestTheDefaultInboxIsRefusedWhereTheUserMayNotUseIt(t *testing.T) {
	// The servers of TestEachNATSLoginRunsARoleOverTLS do keep users from
	// _INBOX: a request on it gets no reply.
	s := startSecureServers(t)
	cfg := defaults(t)
	cfg.NATSURL, cfg.NATSNkey, cfg.NATSTLSCA = s.verifyURL, s.nkeySeed, s.pki.CA
	cfg.NATSTLSCert, cfg.NATSTLSKey = s.pki.ClientCert, s.pki.ClientKey
	opts, err := cfg.NATSOptions()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(cfg.NATSURL, append(opts, nats.CustomInboxPrefix("_INBOX"),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, _ := nc.SubscribeSync("echo")
	defer sub.Unsubscribe()
	_, err = nc.Request("echo", nil, 500*time.Millisecond)
	if err == nil || errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("a request on _INBOX: %v, want it refused or timed out", err)
	}
}

func TestAWrongOrMissingCAOrCertificateFailsWithAClearError(t *testing.T) {
	s := startSecureServers(t)
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := func() Config {
		cfg := defaults(t)
		cfg.NATSURL, cfg.NATSUser, cfg.NATSPassword = s.verifyURL, "alice", s.password
		cfg.NATSTLSCA, cfg.NATSTLSCert, cfg.NATSTLSKey = s.pki.CA, s.pki.ClientCert, s.pki.ClientKey
		return cfg
	}
	t.Run("at start: files that are missing or hold no certificate", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "missing.pem")
		for _, tt := range []struct {
			name string
			set  func(*Config)
			want []string
		}{
			{"a missing CA", func(c *Config) { c.NATSTLSCA = missing }, []string{"SLUICE_NATS_TLS_CA", missing, "no such file"}},
			{"a CA that is no PEM", func(c *Config) { c.NATSTLSCA = notPEM }, []string{"SLUICE_NATS_TLS_CA", notPEM, "no PEM certificate"}},
			{"a certificate without its key", func(c *Config) { c.NATSTLSKey = "" }, []string{"SLUICE_NATS_TLS_CERT and SLUICE_NATS_TLS_KEY go together"}},
			{"a key that is not the certificate's", func(c *Config) { c.NATSTLSKey = s.pki.OtherKey }, []string{"SLUICE_NATS_TLS_CERT", "SLUICE_NATS_TLS_KEY", s.pki.OtherKey}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				cfg := base()
				tt.set(&cfg)
				cfg.HTTPAddr = ""
				err := Run(context.Background(), cfg, []string{"scheduler"}, slog.New(slog.DiscardHandler))
				for _, w := range tt.want {
					if err == nil || !strings.Contains(err.Error(), w) {
						t.Fatalf("error %v, want one naming %q", err, w)
					}
				}
			})
		}
	})
	t.Run("on connecting", func(t *testing.T) {
		for _, tt := range []struct {
			name string
			set  func(*Config)
			want string
		}{
			{"the CA of another", func(c *Config) { c.NATSTLSCA = s.pki.OtherCA }, "not signed by a CA of SLUICE_NATS_TLS_CA"},
			{"no CA: the system's", func(c *Config) { c.NATSTLSCA = "" }, "not signed by a CA of SLUICE_NATS_TLS_CA (or of the system's"},
			{"no client certificate", func(c *Config) { c.NATSTLSCert, c.NATSTLSKey = "", "" }, "client certificate"},
			{"a client certificate of another CA", func(c *Config) { c.NATSTLSCert, c.NATSTLSKey = s.pki.OtherCert, s.pki.OtherKey }, "client certificate"},
			{"a nats:// URL to a server that requires TLS, and no TLS setting", func(c *Config) {
				c.NATSURL = strings.Replace(s.verifyURL, "tls://", "nats://", 1)
				c.NATSTLSCA, c.NATSTLSCert, c.NATSTLSKey = "", "", ""
			}, "certificate"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				cfg := base()
				tt.set(&cfg)
				// A client command: the error at once.
				opts, err := cfg.NATSOptions()
				if err != nil {
					t.Fatal(err)
				}
				nc, err := nats.Connect(cfg.NATSURL, append(opts, nats.Timeout(5*time.Second))...)
				if err == nil {
					nc.Close()
					t.Fatal("connected")
				}
				if err := ExplainConnectError(err); !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("error %q, want one saying %q", err, tt.want)
				}
				// A role: it keeps trying and says why.
				r := runRoles(t, cfg, "scheduler")
				deadline := time.Now().Add(10 * time.Second)
				for !strings.Contains(r.log.String(), "cannot connect to NATS") && time.Now().Before(deadline) {
					time.Sleep(50 * time.Millisecond)
				}
				host := strings.TrimPrefix(strings.TrimPrefix(cfg.NATSURL, "tls://"), "nats://")
				if l := r.log.String(); !strings.Contains(l, "cannot connect to NATS; trying again") || !strings.Contains(l, tt.want) || !strings.Contains(l, host) {
					t.Fatalf("the role's log does not say why it cannot connect (%q):\n%s", tt.want, l)
				}
				resp, err := http.Get(r.health)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusServiceUnavailable {
					t.Fatalf("healthz answered %s while the role cannot connect", resp.Status)
				}
			})
		}
	})
}

func TestLoginFilesThatCannotBeUsedAreRefusedNamingTheVariableAndFileButNotTheirContent(t *testing.T) {
	dir := t.TempDir()
	seed, _ := securetest.Nkey(t, dir)
	seedBytes, _ := os.ReadFile(seed)
	op := securetest.NewOperator(t)
	creds, _ := op.Creds(t, dir, "dave")
	credsBytes, _ := os.ReadFile(creds)
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// A credentials file whose seed is another user's.
	lines := strings.Split(string(credsBytes), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "SU") {
			lines[i] = strings.TrimSpace(string(seedBytes))
		}
	}
	mismatched := write("mismatched.creds", strings.Join(lines, "\n"))
	secretish := "SUAM-not-really-a-seed-but-secret"
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"a missing credentials file", Config{NATSCreds: filepath.Join(dir, "none.creds")}, []string{"SLUICE_NATS_CREDS", "none.creds", "no such file"}},
		{"a credentials file without a JWT", Config{NATSCreds: write("bad.creds", secretish)}, []string{"SLUICE_NATS_CREDS", "bad.creds", "no user JWT"}},
		{"a credentials file whose seed is not its user's", Config{NATSCreds: mismatched}, []string{"SLUICE_NATS_CREDS", "mismatched.creds", "not the key of its user JWT"}},
		{"an nkey file without a seed", Config{NATSNkey: write("bad.nk", secretish)}, []string{"SLUICE_NATS_NKEY", "bad.nk", "no user nkey seed"}},
		{"an nkey file holding credentials of an account", Config{NATSNkey: write("acct.nk", "SAAGNWBKRLHVQ5ZB35OTX7QGNSXA7CMQVOBNMVEJZGSHCDOOC2FNB6PGLE")}, []string{"SLUICE_NATS_NKEY", "acct.nk"}},
		{"credentials and an nkey", Config{NATSCreds: creds, NATSNkey: seed}, []string{"SLUICE_NATS_CREDS and SLUICE_NATS_NKEY", "one way to log in"}},
		{"a user and credentials", Config{NATSUser: "alice", NATSCreds: creds}, []string{"SLUICE_NATS_USER and SLUICE_NATS_CREDS"}},
		{"an inbox prefix with a wildcard", Config{NATSInboxPrefix: "_INBOX_*"}, []string{"SLUICE_NATS_INBOX_PREFIX", "wildcards"}},
		{"a user name that is no subject", Config{NATSUser: "alice smith"}, []string{"inbox prefix of the NATS user", "SLUICE_NATS_INBOX_PREFIX"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.NATSURL = "nats://127.0.0.1:1"
			_, err := tt.cfg.NATSOptions()
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			for _, secret := range []string{secretish, strings.TrimSpace(string(seedBytes))} {
				if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), secret[:12]) {
					t.Errorf("error %q shows a file's content", err)
				}
			}
			// Connecting with Options fails with the same reason.
			if _, cerr := nats.Connect(tt.cfg.NATSURL, tt.cfg.Options()...); cerr == nil || cerr.Error() != err.Error() {
				t.Errorf("nats.Connect with Options: %v, want %v", cerr, err)
			}
		})
	}
}

func TestTheHTTPServerServesHTTPSWithTheConfiguredCertificate(t *testing.T) {
	pki := securetest.NewPKI(t)
	ns, err := bus.Embedded(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	cfg := defaults(t)
	cfg.NATSURL = ns.ClientURL()
	cfg.HTTPTLSCert, cfg.HTTPTLSKey = pki.ServerCert, pki.ServerKey
	r := runRoles(t, cfg, "processor")
	pool := x509.NewCertPool()
	ca, _ := os.ReadFile(pki.CA)
	pool.AppendCertsFromPEM(ca)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if !strings.HasPrefix(r.health, "https://") {
		t.Fatal(r.health)
	}
	h := r.healthy(t, client)
	if !h.Roles["processor"].OK {
		t.Fatalf("healthz %+v", h)
	}
	for _, path := range []string{"/metrics", "/debug/pprof/", "/"} {
		resp, err := client.Get(strings.TrimSuffix(r.health, "/healthz") + path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s", path, resp.Status)
		}
	}
	// Plain HTTP is not served, and a client that does not trust the CA
	// does not get through.
	resp, err := http.Get(strings.Replace(r.health, "https://", "http://", 1))
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP served /healthz")
		}
	}
	if _, err := http.Get(r.health); err == nil {
		t.Fatal("a client without the CA got /healthz")
	}
	if !strings.Contains(r.log.String(), "serving HTTPS") {
		t.Fatalf("log:\n%s", r.log)
	}
}

func TestHTTPSFilesThatCannotBeUsedAreRefusedAtStart(t *testing.T) {
	pki := securetest.NewPKI(t)
	for _, tt := range []struct {
		name      string
		cert, key string
		want      []string
	}{
		{"a certificate without a key", pki.ServerCert, "", []string{"SLUICE_HTTP_TLS_CERT and SLUICE_HTTP_TLS_KEY go together"}},
		{"a missing key", pki.ServerCert, filepath.Join(pki.Dir, "none.pem"), []string{"SLUICE_HTTP_TLS_KEY", "none.pem", "no such file"}},
		{"the key of another certificate", pki.ServerCert, pki.ClientKey, []string{"SLUICE_HTTP_TLS_CERT", pki.ServerCert, "SLUICE_HTTP_TLS_KEY", pki.ClientKey}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := defaults(t)
			cfg.NATSURL, cfg.HTTPAddr = "nats://127.0.0.1:1", "127.0.0.1:0"
			cfg.HTTPTLSCert, cfg.HTTPTLSKey = tt.cert, tt.key
			err := Run(context.Background(), cfg, []string{"processor"}, slog.New(slog.DiscardHandler))
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Fatalf("error %v, want one naming %q", err, w)
				}
			}
		})
	}
}
