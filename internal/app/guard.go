package app

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// guard is what the roles' connections to storage may reach: public
// addresses and SLUICE_ALLOW_NETWORKS, but never Sluice's own ports, which
// a DTR would otherwise read or write like any storage: the NATS servers
// of NATS_URL (and of the embedded server), their monitoring port
// (SLUICE_NATS_MONITOR_PORT, on the same hosts), this process's HTTP
// server (ln: /metrics, /debug/pprof), its FTS3 REST API and
// SLUICE_DENY_ADDRESSES.
func (cfg Config) guard(ln net.Listener) (*transfer.Guard, error) {
	g, err := transfer.NewGuard(cfg.AllowNetworks...)
	if err != nil {
		return nil, fmt.Errorf("SLUICE_ALLOW_NETWORKS: %w", err)
	}
	var servers, monitors []string
	for _, raw := range strings.Split(cfg.NATSURL, ",") {
		if strings.TrimSpace(raw) == "" {
			continue
		}
		u, err := parseURL(raw)
		if err != nil || u.Hostname() == "" {
			continue // the connection reports it
		}
		port := u.Port()
		if port == "" {
			port = map[string]string{"ws": "80", "wss": "443"}[u.Scheme]
		}
		if port == "" {
			port = strconv.Itoa(nats.DefaultPort)
		}
		servers = append(servers, net.JoinHostPort(u.Hostname(), port))
		if cfg.NATSMonitorPort > 0 {
			monitors = append(monitors, net.JoinHostPort(u.Hostname(), strconv.Itoa(cfg.NATSMonitorPort)))
		}
	}
	if ns := cfg.InProcess; ns != nil {
		if a := ns.Addr(); a != nil {
			servers = append(servers, a.String())
		}
		if a := ns.MonitorAddr(); a != nil {
			monitors = append(monitors, a.String())
		}
	}
	if err := g.Deny("Sluice's own NATS server", servers...); err != nil {
		return nil, fmt.Errorf("NATS_URL: %w", err)
	}
	if err := g.Deny("Sluice's own NATS monitoring port", monitors...); err != nil {
		return nil, fmt.Errorf("SLUICE_NATS_MONITOR_PORT: %w", err)
	}
	if ln != nil {
		if err := g.Deny("this process's own HTTP server (SLUICE_HTTP_ADDR: /metrics, /debug/pprof)", ln.Addr().String()); err != nil {
			return nil, fmt.Errorf("SLUICE_HTTP_ADDR: %w", err)
		}
	}
	if cfg.FTS != nil {
		if err := g.Deny("this process's own FTS3 REST API (SLUICE_FTS_LISTEN)", cfg.FTS.Addr().String()); err != nil {
			return nil, fmt.Errorf("SLUICE_FTS_LISTEN: %w", err)
		}
	}
	if err := g.Deny("an address SLUICE_DENY_ADDRESSES names", cfg.DenyAddresses...); err != nil {
		return nil, fmt.Errorf("SLUICE_DENY_ADDRESSES: %w", err)
	}
	return g, nil
}
