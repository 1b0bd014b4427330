package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/bus"
)

// serve runs one role, or all of them on an embedded NATS server.
func serve(ctx context.Context, role string, cfg *Config, args []string) error {
	if err := serveFlags(role, cfg).Parse(args); err != nil {
		return err
	}
	log := newLogger(cfg, os.Stderr)
	go collectLess(ctx)
	roles := []string{role}
	if role == "all" {
		roles = app.Roles
		if cfg.Store == "" {
			cfg.Store = defaultStore()
		}
		if err := os.MkdirAll(cfg.Store, 0o755); err != nil {
			return fmt.Errorf("store: %w", err)
		}
		if cfg.StateFile == "" {
			cfg.StateFile = filepath.Join(cfg.Store, "dtr.state")
		}
		ns, err := bus.Embedded(cfg.Store, cfg.NATSPort)
		if err != nil {
			return err
		}
		defer ns.Shutdown()
		cfg.NATSURL = ns.ClientURL()
		log.Info("embedded NATS server with JetStream", "url", cfg.NATSURL, "store", cfg.Store)
	}
	return app.Run(ctx, *cfg, roles, log)
}

// serveFlags returns the flags of a role; each defaults to what the
// environment said, so a flag given wins over the environment, which wins
// over the built-in default.
func serveFlags(role string, cfg *Config) *flag.FlagSet {
	fs := flags(role, cfg)
	if role == "all" {
		fs.StringVar(&cfg.Store, "store", cfg.Store, "JetStream store directory (env SLUICE_STORE; default the user's data dir/sluice)")
		fs.IntVar(&cfg.NATSPort, "port", cfg.NATSPort, "port of the embedded NATS server on 127.0.0.1, 0 for a free one (env SLUICE_NATS_PORT)")
	}
	if role == "all" || role == "scheduler" {
		fs.StringVar(&cfg.Policy, "policy", cfg.Policy, "fair-share policy: arc, dirac, sam or enstore (env SLUICE_POLICY; each reads its SLUICE_<POLICY>_* settings)")
		fs.StringVar(&cfg.SharePolicy, "sharepolicy", cfg.SharePolicy, "share policy: dn, voms:vo, voms:group, voms:role (env SLUICE_SHAREPOLICY)")
		fs.StringVar(&cfg.SharePriority, "sharepriority", cfg.SharePriority, "share priorities, e.g. atlas=80,cms=20 (env SLUICE_SHAREPRIORITY)")
		fs.IntVar(&cfg.MaxDelivery, "maxdelivery", cfg.MaxDelivery, "transfer slots (env SLUICE_MAXDELIVERY)")
		fs.IntVar(&cfg.MaxProcessor, "maxprocessor", cfg.MaxProcessor, "slots per processing state (env SLUICE_MAXPROCESSOR)")
		fs.IntVar(&cfg.MaxEmergency, "maxemergency", cfg.MaxEmergency, "emergency slots per state (env SLUICE_MAXEMERGENCY)")
		fs.IntVar(&cfg.MaxPerHost, "maxperhost", cfg.MaxPerHost, "transfers at once per storage endpoint, 0 for no limit (env SLUICE_MAXPERHOST)")
		fs.IntVar(&cfg.MaxPrepared, "maxprepared", cfg.MaxPrepared, "staged copies a share may hold (env SLUICE_MAXPREPARED)")
	}
	return fs
}
