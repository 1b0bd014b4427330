package app

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

func TestSluicesOwnAddressesAreRefusedEvenWhenLoopbackIsAllowed(t *testing.T) {
	ns, err := bus.EmbeddedWith(t.TempDir(), 0, func(o *server.Options) { o.HTTPHost, o.HTTPPort = "127.0.0.1", -1 })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	monitor := ns.MonitorAddr()
	// The monitoring port answers: what a DTR would read if it could.
	resp, err := http.Get("http://" + monitor.String() + "/connz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the NATS monitoring port: %v", err)
	}
	resp.Body.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "# metrics") }))
	denied := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(denied.Close)
	storage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "data") }))
	t.Cleanup(storage.Close)
	natsPort := strconv.Itoa(ns.Addr().(*net.TCPAddr).Port)

	tests := []struct {
		name, natsURL string
		inProcess     bool
	}{
		{"NATS by address", ns.ClientURL(), false},
		{"NATS by name", "nats://user:pw@localhost:" + natsPort, false},
		{"NATS in process", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{NATSURL: tt.natsURL, NATSMonitorPort: monitor.Port,
				AllowNetworks: []string{"127.0.0.0/8", "::1"}, DenyAddresses: []string{strings.TrimPrefix(denied.URL, "http://")}}
			if tt.inProcess {
				cfg.InProcess, cfg.NATSMonitorPort = ns, 0
			}
			g, err := cfg.guard(ln)
			if err != nil {
				t.Fatal(err)
			}
			c := transfer.New(nil).WithGuard(g)
			ctx := context.Background()
			for src, want := range map[string]string{
				"http://" + monitor.String() + "/connz":              "it is Sluice's own NATS monitoring port, which no transfer may reach",
				"http://127.0.0.1:" + natsPort + "/":                 "it is Sluice's own NATS server, which no transfer may reach",
				"http://" + ln.Addr().String() + "/metrics":          "it is this process's own HTTP server (SLUICE_HTTP_ADDR: /metrics, /debug/pprof), which no transfer may reach",
				"http://" + ln.Addr().String() + "/debug/pprof/heap": "it is this process's own HTTP server",
				denied.URL + "/": "it is an address SLUICE_DENY_ADDRESSES names, which no transfer may reach",
				"http://127.0.0.2:" + strconv.Itoa(monitor.Port) + "/": "it is Sluice's own NATS monitoring port", // another loopback address of this machine
			} {
				dst := filepath.Join(t.TempDir(), "f")
				_, err := c.Copy(ctx, src, "file://"+dst, transfer.CopyOptions{})
				if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), want) {
					t.Errorf("%s: %v (%s), want PERMANENT_REMOTE saying %q", src, err, transfer.KindOf(err), want)
				}
			}
			if _, err := c.Copy(ctx, storage.URL+"/f", "file://"+filepath.Join(t.TempDir(), "f"), transfer.CopyOptions{}); err != nil {
				t.Errorf("storage on an allowed loopback port: %v", err)
			}
		})
	}
}

func TestTheGuardsSettingsAreCheckedAtStart(t *testing.T) {
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{AllowNetworks: []string{"10.0.0.0/33"}}, "SLUICE_ALLOW_NETWORKS: allowed network \"10.0.0.0/33\""},
		{Config{DenyAddresses: []string{"nats"}}, "SLUICE_DENY_ADDRESSES: denied address \"nats\": want host:port"},
	} {
		if _, err := tt.cfg.guard(nil); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("error %v, want %q", err, tt.want)
		}
	}
}
