package app

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sluice-dtr/sluice/pkg/bus"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// newMetrics returns a meter provider whose instruments a Prometheus
// handler serves, with the Go runtime's and the process's own metrics.
func newMetrics(service string) (*sdkmetric.MeterProvider, http.Handler, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo())
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	res := resource.NewSchemaless(attribute.String("service.name", service))
	return sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res)),
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}

// registerStoreFull serves the sluice_store_full gauge: 1 for each role
// whose writes JetStream refuses for want of space, else 0.
func registerStoreFull(meter metric.Meter, h *health) error {
	full, err := meter.Int64ObservableGauge("sluice.store.full",
		metric.WithDescription("1 while JetStream refuses the role's writes for want of space (a full store, stream, bucket or disk) and the role holds them back, trying again; else 0"))
	if err != nil {
		return err
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for role, f := range h.full() {
			v := int64(0)
			if f {
				v = 1
			}
			o.ObserveInt64(full, v, metric.WithAttributes(attribute.String("role", role)))
		}
		return nil
	}, full)
	return err
}

// health follows the roles of a process for /healthz.
type health struct {
	mu    sync.Mutex
	roles map[string]*roleHealth
}

type roleHealth struct {
	nc      *nats.Conn
	space   *bus.Space  // the role's writes refused for want of space
	ready   func() bool // nil: ready once running
	running bool
	err     string
}

// RoleHealth is one role's entry in /healthz.
type RoleHealth struct {
	OK   bool   `json:"ok"`
	NATS string `json:"nats"`
	// Detail says what is wrong when OK is false.
	Detail string `json:"detail,omitempty"`
}

// Health is the answer of /healthz.
type Health struct {
	OK    bool                  `json:"ok"`
	Roles map[string]RoleHealth `json:"roles"`
}

func (h *health) add(role string, nc *nats.Conn, ready func() bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.roles == nil {
		h.roles = map[string]*roleHealth{}
	}
	h.roles[role] = &roleHealth{nc: nc, space: bus.SpaceOf(nc), ready: ready}
}

// full reports, for the sluice_store_full metric, which roles have their
// writes refused for want of space.
func (h *health) full() map[string]bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]bool, len(h.roles))
	for name, r := range h.roles {
		out[name], _, _ = r.space.Full()
	}
	return out
}

func (h *health) set(role string, running bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.roles[role]
	r.running = running
	if err != nil {
		r.err = err.Error()
	}
}

func (h *health) check() Health {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := Health{OK: true, Roles: map[string]RoleHealth{}}
	for name, r := range h.roles {
		rh := RoleHealth{NATS: r.nc.Status().String(), OK: true}
		switch {
		case !r.running && r.err != "":
			rh.OK, rh.Detail = false, "stopped: "+r.err
		case !r.running:
			rh.OK, rh.Detail = false, "not running"
		case !r.nc.IsConnected():
			rh.OK, rh.Detail = false, "not connected to NATS"
		case r.space.Detail() != "":
			rh.OK, rh.Detail = false, r.space.Detail()
		case r.ready != nil && !r.ready():
			rh.OK, rh.Detail = false, "starting"
		}
		out.OK = out.OK && rh.OK
		out.Roles[name] = rh
	}
	return out
}

func (h *health) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	st := h.check()
	w.Header().Set("Content-Type", "application/json")
	if !st.OK {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(st)
}

// index lists what a process serves, for a process without the scheduler's
// page.
func index(paths []string) http.Handler {
	sort.Strings(paths)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "Sluice. This process serves:")
		for _, p := range paths {
			fmt.Fprintln(w, " ", p)
		}
	})
}

// httpCert loads the HTTP server's certificate (SLUICE_HTTP_TLS_CERT and
// SLUICE_HTTP_TLS_KEY).
func httpCert(certFile, keyFile string) (*tls.Certificate, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("SLUICE_HTTP_TLS_CERT and SLUICE_HTTP_TLS_KEY go together: set both or neither")
	}
	cert, err := loadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("SLUICE_HTTP_TLS_CERT %s, SLUICE_HTTP_TLS_KEY %s: %w", certFile, keyFile, err)
	}
	return &cert, nil
}

// serveHTTP serves mux on ln until ctx ends: HTTPS with cert, if set.
func serveHTTP(ctx context.Context, ln net.Listener, mux http.Handler, cert *tls.Certificate, log *slog.Logger, what string) error {
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if cert != nil {
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{*cert}, MinVersion: tls.VersionTLS12}
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	serve := srv.Serve
	if cert != nil {
		log.Info("serving HTTPS: "+what, "addr", ln.Addr().String())
		serve = func(ln net.Listener) error { return srv.ServeTLS(ln, "", "") }
	} else {
		log.Info("serving HTTP: "+what, "addr", ln.Addr().String())
	}
	if err := serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("HTTP server: %w", err)
	}
	return nil
}

// ftsListener opens the FTS3 REST API's listener (SLUICE_FTS_LISTEN) for a
// process that runs the generator; nil if it is not served here. Bearer
// tokens must not cross the network in clear: without TLS only a loopback
// address is served.
func (cfg Config) ftsListener(roles []string, tls bool) (net.Listener, error) {
	if !slices.Contains(roles, "generator") {
		return nil, nil
	}
	if cfg.FTS != nil {
		return cfg.FTS, nil
	}
	addr := strings.TrimSpace(cfg.FTSListen)
	if addr == "" {
		return nil, nil
	}
	if !strings.Contains(addr, ":") {
		addr = "127.0.0.1:" + addr // a port alone
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("SLUICE_FTS_LISTEN %q: %w", cfg.FTSListen, err)
	}
	if ip := net.ParseIP(host); !tls && (ip == nil || !ip.IsLoopback()) && host != "localhost" {
		return nil, fmt.Errorf("SLUICE_FTS_LISTEN %q is not a loopback address: bearer tokens would cross the network in clear; set SLUICE_HTTP_TLS_CERT and SLUICE_HTTP_TLS_KEY to serve HTTPS", cfg.FTSListen)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("FTS3 REST API (SLUICE_FTS_LISTEN): %w", err)
	}
	return ln, nil
}
