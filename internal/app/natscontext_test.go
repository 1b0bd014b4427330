package app

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// writeContext writes a nats context under the XDG_CONFIG_HOME dir.
func writeContext(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, "nats", "context", name+".json")
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestANATSContextIsReadAsTheNatsToolWritesIt(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", dir)
	t.Setenv("HOME", "/home/tester")
	t.Setenv("CTX_TEST_PASSWORD", "pw-from-env")
	t.Setenv("CTX_TEST_DIR", "/etc/sluice")
	if name, err := SelectedNATSContext(); err != nil || name != "" {
		t.Fatalf("no context.txt: %q, %v; want none", name, err)
	}
	writeContext(t, dir, "prod", `{
  "description": "production",
  "url": "tls://nats.example:4222",
  "user": "client",
  "password": "env://CTX_TEST_PASSWORD",
  "token": "",
  "creds": "",
  "nkey": "",
  "cert": "~/certs/client.pem",
  "key": "file://$CTX_TEST_DIR/client-key.pem",
  "ca": "${CTX_TEST_DIR}/ca.pem",
  "nsc": "",
  "jetstream_domain": "hub",
  "jetstream_api_prefix": "",
  "jetstream_event_prefix": "",
  "inbox_prefix": "_INBOX_client",
  "user_jwt": "",
  "color_scheme": "",
  "tls_first": false,
  "windows_cert_store": ""
}`)
	if err := os.WriteFile(filepath.Join(dir, "nats", "context.txt"), []byte("prod\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	name, err := SelectedNATSContext()
	if err != nil || name != "prod" {
		t.Fatalf("selected %q, %v; want prod", name, err)
	}
	c, err := LoadNATSContext(name)
	if err != nil {
		t.Fatal(err)
	}
	want := NATSContext{Name: "prod", Path: filepath.Join(dir, "nats", "context", "prod.json"),
		URL: "tls://nats.example:4222", User: "client", Password: "pw-from-env",
		Cert: "/home/tester/certs/client.pem", Key: "/etc/sluice/client-key.pem", CA: "/etc/sluice/ca.pem", InboxPrefix: "_INBOX_client"}
	if !reflect.DeepEqual(*c, want) {
		t.Fatalf("context\n%+v\nwant\n%+v", *c, want)
	}
}

func TestANATSContextSluiceCannotFollowIsRefusedWithoutShowingItsSecrets(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", dir)
	tests := []struct{ name, body, want string }{
		{"an nsc lookup", `{"nsc": "nsc://op/acct/user"}`, "nsc is set"},
		{"an inline JWT", `{"user_jwt": "eyJ0eXAi", "user_seed": "SUAB"}`, "is set: Sluice does not follow it"},
		{"tls first", `{"tls_first": true}`, "tls_first is set"},
		{"a SOCKS proxy", `{"socks_proxy": "socks5://proxy:1080"}`, "socks_proxy"},
		{"a 1Password reference", `{"password": "op://vault/nats/s3cr3t-value"}`, "password is a reference Sluice does not follow"},
		{"an unset variable", `{"token": "env://CTX_TEST_UNSET_TOKEN"}`, "CTX_TEST_UNSET_TOKEN is not set"},
		{"creds from nsc", `{"creds": "nsc://op/acct/user"}`, "creds is a nsc:// reference"},
		{"not JSON", `{"password": "s3cr3t-value", oops}`, "not JSON (at byte"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeContext(t, dir, "bad", tt.body)
			_, err := LoadNATSContext("bad")
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), p) {
				t.Fatalf("error %v, want one saying %q and naming %s", err, tt.want, p)
			}
			if strings.Contains(err.Error(), "s3cr3t") {
				t.Fatalf("error %q shows a secret", err)
			}
		})
	}
	for _, name := range []string{"", "..", "../prod", "a/b", `a\b`} {
		if _, err := LoadNATSContext(name); err == nil || !strings.Contains(err.Error(), "not a context name") {
			t.Errorf("context %q: %v", name, err)
		}
	}
	if _, err := LoadNATSContext("missing"); err == nil || !strings.Contains(err.Error(), `nats context "missing"`) {
		t.Errorf("a missing context: %v", err)
	}
}

func TestSluicesOwnSettingsWinOverTheNATSContext(t *testing.T) {
	ctx := &NATSContext{Name: "dev", URL: "nats://ctxuser:ctxpw@ctx.example:4222", User: "ctxuser", Password: "ctxpw",
		CA: "/ctx/ca.pem", Cert: "/ctx/cert.pem", Key: "/ctx/key.pem", InboxPrefix: "_INBOX_ctx"}
	tests := []struct {
		name     string
		cfg      Config
		urlGiven bool
		want     Config
	}{
		{"nothing set: all of the context", Config{NATSURL: "nats://127.0.0.1:4222"}, false,
			Config{NATSURL: ctx.URL, NATSUser: "ctxuser", NATSPassword: "ctxpw", NATSTLSCA: "/ctx/ca.pem",
				NATSTLSCert: "/ctx/cert.pem", NATSTLSKey: "/ctx/key.pem", NATSInboxPrefix: "_INBOX_ctx"}},
		{"a URL given: the context's login and TLS with it", Config{NATSURL: "tls://mine:4222"}, true,
			Config{NATSURL: "tls://mine:4222", NATSUser: "ctxuser", NATSPassword: "ctxpw", NATSTLSCA: "/ctx/ca.pem",
				NATSTLSCert: "/ctx/cert.pem", NATSTLSKey: "/ctx/key.pem", NATSInboxPrefix: "_INBOX_ctx"}},
		{"a URL with a user given: no login of the context", Config{NATSURL: "nats://me:pw@mine:4222"}, true,
			Config{NATSURL: "nats://me:pw@mine:4222", NATSTLSCA: "/ctx/ca.pem",
				NATSTLSCert: "/ctx/cert.pem", NATSTLSKey: "/ctx/key.pem", NATSInboxPrefix: "_INBOX_ctx"}},
		{"credentials of its own: the context's URL without its user", Config{NATSURL: "nats://127.0.0.1:4222", NATSCreds: "/mine.creds"}, false,
			Config{NATSURL: "nats://ctx.example:4222", NATSCreds: "/mine.creds", NATSTLSCA: "/ctx/ca.pem",
				NATSTLSCert: "/ctx/cert.pem", NATSTLSKey: "/ctx/key.pem", NATSInboxPrefix: "_INBOX_ctx"}},
		{"TLS files and a prefix of its own", Config{NATSURL: "nats://127.0.0.1:4222", NATSTLSCA: "/my/ca.pem", NATSTLSKey: "/my/key.pem", NATSInboxPrefix: "_INBOX_me"}, false,
			Config{NATSURL: ctx.URL, NATSUser: "ctxuser", NATSPassword: "ctxpw", NATSTLSCA: "/my/ca.pem",
				NATSTLSKey: "/my/key.pem", NATSInboxPrefix: "_INBOX_me"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.UseNATSContext(ctx, tt.urlGiven)
			got := [...]string{cfg.NATSURL, cfg.NATSUser, cfg.NATSPassword, cfg.NATSCreds, cfg.NATSNkey, cfg.NATSTLSCA, cfg.NATSTLSCert, cfg.NATSTLSKey, cfg.NATSInboxPrefix}
			w := tt.want
			want := [...]string{w.NATSURL, w.NATSUser, w.NATSPassword, w.NATSCreds, w.NATSNkey, w.NATSTLSCA, w.NATSTLSCert, w.NATSTLSKey, w.NATSInboxPrefix}
			if got != want {
				t.Fatalf("got  %q\nwant %q", got, want)
			}
		})
	}
	// Errors about a setting from the context name the context.
	cfg := Config{NATSURL: "nats://127.0.0.1:4222"}
	cfg.UseNATSContext(&NATSContext{Name: "dev", CA: "/nonexistent/ca.pem"}, false)
	if _, err := cfg.NATSOptions(); err == nil || !strings.Contains(err.Error(), `ca of nats context "dev"`) {
		t.Fatalf("error %v, want one naming the context", err)
	}
}
