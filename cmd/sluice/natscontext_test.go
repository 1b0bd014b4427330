package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/internal/app/securetest"
)

// shares runs `sluice shares` with args until the scheduler answers.
func sharesUntilAnswered(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	var err error
	for range 100 {
		out.Reset()
		err = run(append([]string{"shares"}, args...), &out)
		if err == nil || !strings.Contains(err.Error(), "no service answers") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return out.String(), err
}

func TestClientCommandsConnectWithTheUsersNATSContext(t *testing.T) {
	pki := securetest.NewPKI(t)
	keys := t.TempDir()
	seed, pub := securetest.Nkey(t, keys)
	_, url := securetest.Server(t, pki.TLSConf(true)+`authorization { users: [
  { user: scheduler, password: "pw-scheduler", `+securetest.NoDefaultInbox+` }
  { user: client, password: "pw-client", `+securetest.NoDefaultInbox+` }
  { nkey: `+pub+`, `+securetest.NoDefaultInbox+` }
] }
`)
	// The scheduler, from the environment.
	var cfg Config
	t.Setenv("SLUICE_NATS_URL", url)
	t.Setenv("SLUICE_NATS_USER", "scheduler")
	t.Setenv("SLUICE_NATS_PASSWORD", "pw-scheduler")
	t.Setenv("SLUICE_NATS_TLS_CA", pki.CA)
	t.Setenv("SLUICE_NATS_TLS_CERT", pki.ClientCert)
	t.Setenv("SLUICE_NATS_TLS_KEY", pki.ClientKey)
	t.Setenv("SLUICE_HTTP_ADDR", "")
	if err := processEnv(&cfg); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, cfg, []string{"scheduler"}, slog.New(slog.DiscardHandler)) }()
	defer func() { stop(); <-done }()
	for _, v := range []string{"SLUICE_NATS_URL", "SLUICE_NATS_USER", "SLUICE_NATS_PASSWORD", "SLUICE_NATS_TLS_CA", "SLUICE_NATS_TLS_CERT", "SLUICE_NATS_TLS_KEY"} {
		os.Unsetenv(v) // t.Setenv restores them at the end
	}

	// The client's contexts, as `nats context add` writes them.
	home := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", home)
	write := func(name string, c map[string]any) {
		b, _ := json.MarshalIndent(c, "", "  ")
		p := filepath.Join(home, "nats", "context", name+".json")
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tlsFiles := map[string]any{"ca": pki.CA, "cert": pki.ClientCert, "key": pki.ClientKey}
	with := func(m map[string]any) map[string]any {
		for k, v := range tlsFiles {
			m[k] = v
		}
		return m
	}
	write("ops", with(map[string]any{"description": "operator", "url": url, "user": "client", "password": "pw-client"}))
	write("keys", with(map[string]any{"url": url, "nkey": seed}))
	write("noca", map[string]any{"url": url, "user": "client", "password": "pw-client", "cert": pki.ClientCert, "key": pki.ClientKey})
	if err := os.WriteFile(filepath.Join(home, "nats", "context.txt"), []byte("ops"), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("the selected context", func(t *testing.T) {
		out, err := sharesUntilAnswered(t)
		if err != nil || !strings.Contains(out, "SHARE") {
			t.Fatalf("sluice shares: %v\n%s", err, out)
		}
	})
	t.Run("NATS_CONTEXT over the selected one", func(t *testing.T) {
		t.Setenv("NATS_CONTEXT", "keys")
		out, err := sharesUntilAnswered(t)
		if err != nil || !strings.Contains(out, "SHARE") {
			t.Fatalf("sluice shares: %v\n%s", err, out)
		}
		// The context picked is the one that fails.
		t.Setenv("NATS_CONTEXT", "noca")
		if _, err := sharesUntilAnswered(t); err == nil || !strings.Contains(err.Error(), "not signed by a CA") {
			t.Fatalf("NATS_CONTEXT=noca: %v, want the CA refused", err)
		}
	})
	t.Run("--context over NATS_CONTEXT", func(t *testing.T) {
		t.Setenv("NATS_CONTEXT", "noca")
		out, err := sharesUntilAnswered(t, "--context", "keys")
		if err != nil || !strings.Contains(out, "SHARE") {
			t.Fatalf("sluice shares --context keys: %v\n%s", err, out)
		}
	})
	t.Run("SLUICE settings over the context", func(t *testing.T) {
		t.Setenv("SLUICE_NATS_TLS_CA", pki.OtherCA)
		if _, err := sharesUntilAnswered(t); err == nil || !strings.Contains(err.Error(), "not signed by a CA of SLUICE_NATS_TLS_CA") {
			t.Fatalf("SLUICE_NATS_TLS_CA of another CA: %v, want the CA refused", err)
		}
		t.Setenv("SLUICE_NATS_TLS_CA", "")
		os.Unsetenv("SLUICE_NATS_TLS_CA")
		closed := freeAddr(t)
		if _, err := sharesUntilAnswered(t, "-nats", "tls://"+closed); err == nil || !strings.Contains(err.Error(), closed) {
			t.Fatalf("-nats: %v, want the flag's server", err)
		}
		t.Setenv("NATS_URL", "tls://"+closed)
		if _, err := sharesUntilAnswered(t); err == nil || !strings.Contains(err.Error(), closed) {
			t.Fatalf("NATS_URL: %v, want its server", err)
		}
	})
	t.Run("a selected context that is gone", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(home, "nats", "context.txt"), []byte("gone\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := sharesUntilAnswered(t); err == nil || !strings.Contains(err.Error(), `nats context "gone"`) {
			t.Fatalf("%v, want the missing context named", err)
		}
	})
	t.Run("roles do not take --context", func(t *testing.T) {
		if err := run([]string{"processor", "--context", "ops"}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "context") {
			t.Fatalf("sluice processor --context: %v", err)
		}
	})
}

// freeAddr returns a 127.0.0.1 address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
