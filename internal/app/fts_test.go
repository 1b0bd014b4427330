package app

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/internal/app/securetest"
	"github.com/sluice-dtr/sluice/pkg/bus"
)

func TestTheFTS3APIListensInClearOnLoopbackOnly(t *testing.T) {
	for _, tt := range []struct {
		name   string
		listen string
		tls    bool
		want   string // the address's host, or the error
	}{
		{"a port alone is loopback", "0", false, "127.0.0.1"},
		{"loopback in clear", "127.0.0.1:0", false, "127.0.0.1"},
		{"every address in clear", "0.0.0.0:0", false, "bearer tokens would cross the network in clear"},
		{"a name in clear", "sluice.example.org:0", false, "not a loopback address"},
		{"every address over TLS", "0.0.0.0:0", true, "0.0.0.0"},
		{"not an address", "127.0.0.1:x:y", false, "SLUICE_FTS_LISTEN"},
	} {
		cfg := Config{FTSListen: tt.listen}
		ln, err := cfg.ftsListener([]string{"generator"}, tt.tls)
		if ln != nil {
			host := ln.Addr().String()
			ln.Close()
			if !strings.HasPrefix(host, tt.want) && !(tt.want == "0.0.0.0" && strings.HasPrefix(host, "[::]")) {
				t.Errorf("%s: listens on %s, want %s", tt.name, host, tt.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error saying %q", tt.name, err, tt.want)
		}
	}
	if ln, err := (Config{FTSListen: "127.0.0.1:0"}).ftsListener([]string{"delivery"}, false); ln != nil || err != nil {
		t.Errorf("a process without the generator serves the FTS3 API: %v %v", ln, err)
	}
}

func TestTheFTS3APIServesHTTPSWithTheHTTPServersCertificate(t *testing.T) {
	pki := securetest.NewPKI(t)
	ns, err := bus.Embedded(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	cfg := defaults(t)
	cfg.NATSURL = ns.ClientURL()
	cfg.HTTPTLSCert, cfg.HTTPTLSKey = pki.ServerCert, pki.ServerKey
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.FTS = ln
	r := runRoles(t, cfg, "generator")
	pool := x509.NewCertPool()
	ca, _ := os.ReadFile(pki.CA)
	pool.AppendCertsFromPEM(ca)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	url := "https://" + ln.Addr().String() + "/whoami"
	var resp *http.Response
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err = client.Get(url); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	resp.Body.Close()
	// No token: 401, over HTTPS.
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
		t.Fatalf("GET /whoami without a token: %s", resp.Status)
	}
	if resp, err := http.Get("http://" + ln.Addr().String() + "/whoami"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusUnauthorized {
			t.Fatal("plain HTTP served the FTS3 API")
		}
	}
	if !strings.Contains(r.log.String(), "serving HTTPS: the FTS3 REST API") {
		t.Fatalf("log:\n%s", r.log)
	}
}

func TestAnUnusableSciTagSettingStopsTheProcessAtStart(t *testing.T) {
	cfg := defaults(t)
	cfg.HTTPAddr = ""
	cfg.SciTags.Experiments = "atlas=2048"
	err := Run(t.Context(), cfg, []string{"delivery"}, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), `SLUICE_SCITAG_EXPERIMENTS: entry "atlas=2048"`) {
		t.Fatalf("start with an experiment id past 1023: %v", err)
	}
}
