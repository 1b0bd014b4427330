package main

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-dtr/sluice/internal/app/securetest"
)

func TestHealthcheckSpeaksHTTPSToTheConfiguredCertificate(t *testing.T) {
	pki := securetest.NewPKI(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"ok":true}`)
	})}
	go srv.ServeTLS(ln, pki.ServerCert, pki.ServerKey)
	defer srv.Close()
	t.Setenv("SLUICE_HTTP_ADDR", ln.Addr().String())
	t.Setenv("SLUICE_HTTP_TLS_CERT", pki.ServerCert)
	t.Setenv("SLUICE_HTTP_TLS_KEY", pki.ServerKey)
	var out bytes.Buffer
	if err := run([]string{"healthcheck"}, &out); err != nil || !strings.Contains(out.String(), `"ok":true`) {
		t.Fatalf("healthcheck over HTTPS: %v, %q", err, out.String())
	}
	// Another certificate is not trusted, even one of the same CA.
	t.Setenv("SLUICE_HTTP_TLS_CERT", pki.ClientCert)
	if err := run([]string{"healthcheck"}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "not the one in SLUICE_HTTP_TLS_CERT") {
		t.Fatalf("healthcheck trusting another certificate: %v", err)
	}
}
