package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/bus"
)

// serveCommands are the commands that run Sluice: all roles on an
// embedded NATS server, one role against NATS_URL, and the demo.
func serveCommands(cfg *Config) []*cobra.Command {
	all := &cobra.Command{
		Use:   "all",
		Short: "Run every service in one process on an embedded NATS server",
		Args:  exactArgs(0, "all takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return traced(cmd.Context(), "all", func() error { return serve(cmd, "all", cfg) })
		},
	}
	serveFlags(all.Flags(), "all", cfg)
	completeSchedulerFlags(all)
	cmds := []*cobra.Command{all}
	for _, r := range []struct{ role, short string }{
		{"scheduler", "Run the scheduler against NATS_URL: the queues, the shares and the slot grants"},
		{"generator", "Run the generator against NATS_URL: jobs in, DTRs out, jobs followed to the end"},
		{"processor", "Run a processor against NATS_URL: pre- and post-processing (scale freely)"},
		{"delivery", "Run a deliverer against NATS_URL: the transfers (scale freely)"},
	} {
		role := r.role
		c := &cobra.Command{
			Use:   role,
			Short: r.short,
			Long:  r.short + ".\n\nIts settings: sluice help " + role + ".",
			Args:  exactArgs(0, role+" takes no arguments"),
			RunE: func(cmd *cobra.Command, _ []string) error {
				return traced(cmd.Context(), role, func() error { return serve(cmd, role, cfg) })
			},
		}
		serveFlags(c.Flags(), role, cfg)
		if role == "scheduler" {
			completeSchedulerFlags(c)
		}
		cmds = append(cmds, c)
	}
	return append(cmds, demoCommand(cfg))
}

// serve runs one role, or all of them on an embedded NATS server.
func serve(cmd *cobra.Command, role string, cfg *Config) error {
	ctx := cmd.Context()
	log := newLogger(cfg, os.Stderr)
	go collectLess(ctx, role)
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

// completeValues completes a flag's value from a fixed list.
func completeValues(c *cobra.Command, flag string, values ...string) {
	_ = c.RegisterFlagCompletionFunc(flag, func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return values, cobra.ShellCompDirectiveNoFileComp
	})
}

// completeSchedulerFlags completes the values of a scheduler's flags.
func completeSchedulerFlags(c *cobra.Command) {
	completeValues(c, "policy", app.Policies()...)
	completeValues(c, "sharepolicy", "dn", "voms:vo", "voms:group", "voms:role", "dn+activity", "voms:vo+activity", "voms:group+activity", "voms:role+activity", "activity")
}

// natsFlag adds --nats, the NATS server URL.
func natsFlag(fs *pflag.FlagSet, cfg *Config) {
	fs.StringVar(&cfg.NATSURL, "nats", cfg.NATSURL, "NATS server URL, or several comma-separated (env NATS_URL)")
}

// serveFlags adds the flags of a role; each defaults to what the
// environment said, so a flag given wins over the environment, which wins
// over the built-in default.
func serveFlags(fs *pflag.FlagSet, role string, cfg *Config) {
	if role != "all" {
		natsFlag(fs, cfg)
	}
	if role == "all" {
		fs.StringVar(&cfg.Store, "store", cfg.Store, "JetStream store directory (env SLUICE_STORE; default the user's data dir/sluice)")
		fs.IntVar(&cfg.NATSPort, "port", cfg.NATSPort, "port of the embedded NATS server on 127.0.0.1, 0 for a free one (env SLUICE_NATS_PORT)")
	}
	if role == "all" || role == "scheduler" {
		fs.StringVar(&cfg.Policy, "policy", cfg.Policy, "fair-share policy: "+strings.Join(app.Policies(), ", ")+" (env SLUICE_POLICY; each reads its SLUICE_<POLICY>_* settings)")
		fs.StringVar(&cfg.SharePolicy, "sharepolicy", cfg.SharePolicy, "share policy: dn, voms:vo, voms:group, voms:role, each also +activity (voms:vo+activity), or activity (env SLUICE_SHAREPOLICY)")
		fs.StringVar(&cfg.SharePriority, "sharepriority", cfg.SharePriority, "share priorities, e.g. atlas=80,cms=20 (env SLUICE_SHAREPRIORITY)")
		fs.StringVar(&cfg.ActivityShares, "activity-shares", cfg.ActivityShares, `activity weights per VO as JSON, e.g. {"atlas":{"Production Input":0.6,"default":0.4}} (env SLUICE_ACTIVITY_SHARES)`)
		fs.StringVar(&cfg.ActivityLimits, "activity-limits", cfg.ActivityLimits, `per-activity limits at an endpoint as JSON, e.g. [{"activity":"Express","destination":"se.example.org","max":5}]; an endpoint is host:port as URLs write it, a host name (every port of it) or * (each endpoint) (env SLUICE_ACTIVITY_LIMITS)`)
		fs.IntVar(&cfg.MaxActivitiesPerIdentity, "activity-max-per-identity", cfg.MaxActivitiesPerIdentity, `under a +activity share policy, distinct activities of one identity without a weights table that make shares of their own; the rest share default (env SLUICE_ACTIVITY_MAX_PER_IDENTITY)`)
		fs.IntVar(&cfg.MaxDelivery, "maxdelivery", cfg.MaxDelivery, "transfer slots (env SLUICE_MAXDELIVERY)")
		fs.IntVar(&cfg.MaxProcessor, "maxprocessor", cfg.MaxProcessor, "slots per processing state (env SLUICE_MAXPROCESSOR)")
		fs.IntVar(&cfg.MaxEmergency, "maxemergency", cfg.MaxEmergency, "emergency slots per state (env SLUICE_MAXEMERGENCY)")
		fs.IntVar(&cfg.MaxPerHost, "maxperhost", cfg.MaxPerHost, "transfers at once per storage endpoint, 0 for no limit (env SLUICE_MAXPERHOST)")
		fs.IntVar(&cfg.MaxPrepared, "maxprepared", cfg.MaxPrepared, "staged copies a share may hold (env SLUICE_MAXPREPARED)")
		fs.StringVar(&cfg.Optimizer, "optimizer", cfg.Optimizer, "per-link adaptive concurrency, on or off (env SLUICE_OPTIMIZER)")
		fs.IntVar(&cfg.OptimizerMin, "optimizer-min", cfg.OptimizerMin, "lowest per-link limit (env SLUICE_OPTIMIZER_MIN)")
		fs.IntVar(&cfg.OptimizerMax, "optimizer-max", cfg.OptimizerMax, "highest per-link limit (env SLUICE_OPTIMIZER_MAX)")
		fs.IntVar(&cfg.OptimizerStart, "optimizer-start", cfg.OptimizerStart, "a new link's limit (env SLUICE_OPTIMIZER_START)")
		fs.DurationVar(&cfg.OptimizerInterval, "optimizer-interval", cfg.OptimizerInterval, "how often each link's limit is decided (env SLUICE_OPTIMIZER_INTERVAL)")
	}
}
