// Command sluice runs any Sluice service, or all of them in one process on
// an embedded NATS server, and talks to a running Sluice as a client.
//
// main stays thin: the commands are cobra commands (root.go), each in the
// file of what it does; the services are wired in internal/app.
package main

import (
	"context"
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

func main() {
	err := run(os.Args[1:], os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice:", err)
	}
	os.Exit(exitCode(err))
}

// run runs the command line args, printing what it prints to stdout.
func run(args []string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "simulate" {
		if settings := simulateExampleSettings(args[1:]); settings != nil {
			setExampleSettings(settings)
		}
	}
	// The environment is read here, once, for every command; a command
	// that needs no settings (help, completion, man, --version) runs even
	// when it cannot be read.
	var cfg Config
	envErr := processEnv(&cfg)
	if envErr != nil {
		envErr = fmt.Errorf("environment: %w", envErr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRoot(&cfg, envErr, stdout)
	root.SetArgs(longFlags(root, args))
	return root.ExecuteContext(ctx)
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
