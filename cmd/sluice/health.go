package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// healthcheck asks a process's /healthz whether its roles run and reach
// NATS: the docker compose healthcheck of every role, from an image with no
// shell or curl in it.
func healthcheck(ctx context.Context, cfg *Config, args []string, stdout io.Writer) error {
	fs := flags("healthcheck", cfg)
	url := fs.String("url", "", "URL to ask (default: /healthz at SLUICE_HTTP_ADDR, on 127.0.0.1 if it names no host)")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" {
		u, err := healthURL(cfg.HTTPAddr)
		if err != nil {
			return err
		}
		*url = u
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
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
