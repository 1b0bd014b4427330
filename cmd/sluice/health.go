package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// healthcheck asks a process's /healthz whether its roles run and reach
// NATS: the docker compose healthcheck of every role, from an image with no
// shell or curl in it.
func healthcheckCommand(cfg *Config) *cobra.Command {
	var url string
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "healthcheck [flags]",
		Short: "Exit 0 if the process at SLUICE_HTTP_ADDR is healthy (its /healthz)",
		Long: "Ask a process's /healthz whether its roles run and reach NATS, print its answer, and exit 0\n" +
			"if it is healthy, 1 if not: the docker compose healthcheck of every role.",
		Args: exactArgs(0, "healthcheck takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return healthcheck(cmd.Context(), cfg, url, timeout, cmd.OutOrStdout())
		},
	}
	c.Flags().StringVar(&url, "url", "", "URL to ask (default: /healthz at SLUICE_HTTP_ADDR, on 127.0.0.1 if it names no host; over HTTPS with SLUICE_HTTP_TLS_CERT, which the server's certificate must be)")
	c.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "how long to wait for the answer")
	return c
}

func healthcheck(ctx context.Context, cfg *Config, urlGiven string, timeoutGiven time.Duration, stdout io.Writer) error {
	url, timeout := &urlGiven, &timeoutGiven
	if *url == "" {
		u, err := healthURL(cfg.HTTPAddr)
		if err != nil {
			return err
		}
		*url = u
	}
	client := http.DefaultClient
	if cfg.HTTPTLSCert != "" {
		c, err := pinnedClient(cfg.HTTPTLSCert)
		if err != nil {
			return err
		}
		client = c
		*url = strings.Replace(*url, "http://", "https://", 1)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	fmt.Fprint(stdout, string(body))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: %s answered %s", *url, resp.Status)
	}
	return nil
}

// healthURL turns a listen address into the URL of its /healthz.
func healthURL(addr string) (string, error) {
	if addr == "" {
		return "", errors.New("healthcheck: SLUICE_HTTP_ADDR is empty, so the process serves no /healthz; give -url")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("healthcheck: SLUICE_HTTP_ADDR %q: %w", addr, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return "http://" + host + ":" + port + "/healthz", nil
}

// pinnedClient is an HTTPS client that trusts exactly the certificate in
// certFile (SLUICE_HTTP_TLS_CERT, its first one): the process's own, which
// need not name 127.0.0.1 nor be signed by a CA the system knows.
func pinnedClient(certFile string) (*http.Client, error) {
	b, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("healthcheck: SLUICE_HTTP_TLS_CERT: %w", err)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("healthcheck: SLUICE_HTTP_TLS_CERT %s: no PEM certificate in it", certFile)
	}
	want := block.Bytes
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Verified below, against the one certificate, instead.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || !bytes.Equal(raw[0], want) {
				return errors.New("the server's certificate is not the one in SLUICE_HTTP_TLS_CERT")
			}
			return nil
		},
	}
	return &http.Client{Transport: tr}, nil
}
