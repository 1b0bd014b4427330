// Command sluice runs any Sluice service, or all of them in one process on
// an embedded NATS server, and talks to a running Sluice as a client.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-dtr/sluice/internal/app"
)

// Config is the services' configuration; see app.Config.
type Config = app.Config

const usage = `sluice moves files for jobs, sharing transfer slots fairly between groups of users.

Usage:
  sluice all [flags]                 run every service in one process on an embedded NATS server
  sluice scheduler|generator|processor|delivery [flags]
                                     run one role against NATS_URL
  sluice demo [flags]                run a demo job of real files on the embedded default
  sluice submit [flags] JOBFILE      submit a job description (JSON or xRSL); --wait follows it
  sluice status JOB_OR_DTR           show a job and its DTRs, or one DTR
  sluice shares                      show running/pending per share (like ARC's gm-jobs -s)
  sluice why DTR                     say why a DTR waits: its share, place, slots, estimated start
  sluice priority DTR N              change a DTR's priority (1–100)
  sluice cancel DTR_OR_JOB           cancel a DTR or every unfinished DTR of a job
  sluice reconfigure SHARE=P,...     set share priorities of the running scheduler (until it restarts)
  sluice simulate [flags] WORKLOAD   replay a workload through the scheduler under one or more policies
                                     (-policies arc,dirac,sam,enstore; -svg FILE draws the slots; -example)
  sluice bench [-quick] [-out FILE]  measure throughput, latency, slot use, memory, restart and scale-out
                                     against a bare JetStream pipeline; writes BENCHMARKS.md
  sluice healthcheck [-url URL]      exit 0 if the process at SLUICE_HTTP_ADDR is healthy (its /healthz)
  sluice help [GROUP]                show this text and the environment variables by role, or
                                     only GROUP's: common, client, scheduler, policies, generator,
                                     processor or delivery

Every serving process (all, a role, demo) serves HTTP at SLUICE_HTTP_ADDR: /healthz,
/metrics (Prometheus) and, where the scheduler runs, a live web page at /.
With SLUICE_HTTP_TLS_CERT and SLUICE_HTTP_TLS_KEY it serves HTTPS instead.

NATS logins: a user and password, a credentials file (SLUICE_NATS_CREDS) or an nkey
(SLUICE_NATS_NKEY); TLS with a tls:// URL or SLUICE_NATS_TLS_*. The client commands (submit,
status, shares, why, priority, cancel, reconfigure) also connect with a nats context: the one
named by --context or NATS_CONTEXT, else the one selected with "nats context select"; flags
and SLUICE_* settings win over it.

Who is asking: the client commands speak on the operator's subjects unless SLUICE_AS_USER names
a user, whose own subjects (dtr.submit.<user>, sluice.api.*.<user>) the NATS server lets only
that user publish to; a bearer token in BEARER_TOKEN or BEARER_TOKEN_FILE is sent with every
request. A user sees and changes only their own jobs and DTRs (docs/security.md).

Run "sluice COMMAND -h" for a command's flags.

Traces (one per DTR) go over OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
when set, from the service sluice-<role> ("sluice" for all and demo) unless OTEL_SERVICE_NAME names it.
`

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "sluice:", err)
		}
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stdout, usage)
		return errors.New("no command given")
	}
	cmd, rest := args[0], args[1:]
	if cmd == "simulate" && simulateExample(rest) {
		setExampleSettings()
	}
	// The environment is read here, once, for every command.
	var cfg Config
	if err := processEnv(&cfg); err != nil {
		return fmt.Errorf("environment: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch cmd {
	case "all", "scheduler", "generator", "processor", "delivery":
		return traced(ctx, cmd, func() error { return serve(ctx, cmd, &cfg, rest) })
	case "demo":
		return traced(ctx, cmd, func() error { return demo(ctx, &cfg, rest, stdout) })
	case "submit":
		return submit(ctx, &cfg, rest, stdout)
	case "status":
		return status(ctx, &cfg, rest, stdout)
	case "shares":
		return shares(ctx, &cfg, rest, stdout)
	case "priority":
		return priority(ctx, &cfg, rest, stdout)
	case "cancel":
		return cancel(ctx, &cfg, rest, stdout)
	case "reconfigure":
		return reconfigure(ctx, &cfg, rest, stdout)
	case "why":
		return why(ctx, &cfg, rest, stdout)
	case "simulate":
		return simulateCmd(&cfg, rest, stdout)
	case "healthcheck":
		return healthcheck(ctx, &cfg, rest, stdout)
	case "bench":
		return benchCmd(ctx, &cfg, rest, stdout)
	case "help", "-h", "--help":
		if len(rest) > 0 {
			return app.PrintSettings(stdout, rest[0])
		}
		fmt.Fprint(stdout, usage)
		fmt.Fprint(stdout, "\nEnvironment, by role (flags win over it):\n\n")
		return app.PrintSettings(stdout, "")
	}
	fmt.Fprint(stdout, usage)
	return fmt.Errorf("unknown command %q", cmd)
}

// traced runs f with tracing set up for role, and exports the spans still
// buffered before it returns.
func traced(ctx context.Context, role string, f func() error) error {
	shutdown, err := app.Tracing(ctx, role)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			slog.Warn("traces not all exported", "err", err)
		}
	}()
	return f()
}

// flags returns a flag set for a command with the flags every command has.
func flags(name string, cfg *Config) *flag.FlagSet {
	fs := flag.NewFlagSet("sluice "+name, flag.ContinueOnError)
	fs.StringVar(&cfg.NATSURL, "nats", cfg.NATSURL, "NATS server URL (env NATS_URL)")
	return fs
}

func newLogger(cfg *Config, w io.Writer) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	if strings.EqualFold(cfg.LogFormat, "text") {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// defaultStore is the embedded server's store under the user's data dir.
func defaultStore() string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "sluice")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "share", "sluice")
	}
	return filepath.Join(os.TempDir(), "sluice")
}
