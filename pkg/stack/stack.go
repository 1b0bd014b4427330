// Package stack wires Sluice's services together: one process can run any
// set of roles, each on its own NATS connection, with an embedded NATS
// server when asked. The command and the end-to-end tests both use it.
package stack

import (
	"context"
	"fmt"
	"github.com/sluice-dtr/sluice/pkg/transfer"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"golang.org/x/sync/errgroup"

	"github.com/sluice-dtr/sluice/services/delivery"
	"github.com/sluice-dtr/sluice/services/generator"
	"github.com/sluice-dtr/sluice/services/processor"
	"github.com/sluice-dtr/sluice/services/scheduler"
)

// Config is everything the services read from the environment (SLUICE_*,
// and NATS_URL).
type Config struct {
	NATSURL   string `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222" desc:"NATS server of the roles and client commands (also read from NATS_URL)"`
	Store     string `envconfig:"STORE" desc:"JetStream store of the embedded server (default: the user's data dir/sluice)"`
	NATSPort  int    `envconfig:"NATS_PORT" default:"4222" desc:"port of the embedded server on 127.0.0.1; 0 picks a free one"`
	LogLevel  string `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
	LogFormat string `envconfig:"LOG_FORMAT" default:"json" desc:"json or text"`
	// HTTPTokens names bearer token files per host.
	HTTPTokens string `envconfig:"HTTP_TOKENS" desc:"bearer tokens for HTTP(S) storage: host[:port]=/path/of/token/file,... (read at every request; sent to that host only)"`
	// CacheDir is the cache of downloads, shared by every processor and
	// deliverer; the scheduler routes downloads through it when it is set.
	CacheDir string `envconfig:"CACHE_DIR" desc:"cache of downloads (ARC's cache), shared by processors and deliverers: a remote file wanted again is linked from it instead of transferred; empty: no cache"`
	// S3Credentials names key files per S3 endpoint.
	S3Credentials string `envconfig:"S3_CREDENTIALS" desc:"keys for S3 endpoints: host[:port]=/path/of/file holding \"ACCESS_KEY SECRET_KEY\",...; others use AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"`
	// FileRoots are the only directories file:// URLs may reach.
	FileRoots []string `envconfig:"FILE_ROOTS" desc:"comma-separated directories that file:// sources and destinations must lie under (\"..\" and symbolic links out of them are refused); processors add their staging area; empty: any path"`
	scheduler.Config
	Generator generator.Config `envconfig:"GENERATOR"`
	Processor processor.Config `envconfig:"PROCESSOR"`
	Delivery  delivery.Config  `envconfig:"DELIVERY"`
	// InProcess, if set, is an embedded server that the services reach
	// through nats.go's in-process connection instead of NATSURL.
	InProcess *server.Server `ignored:"true"`
}

// Tracing installs an OpenTelemetry tracer provider, so that every DTR's
// trace has real ids that the logs can name. Spans are not exported yet.
func Tracing() func(context.Context) error {
	tp := sdktrace.NewTracerProvider()
	otel.SetTracerProvider(tp)
	return tp.Shutdown
}

// Roles are the services one process can run.
var Roles = []string{"scheduler", "generator", "processor", "delivery"}

// Connect opens a NATS connection that keeps trying to reconnect for ever.
func Connect(url, name string) (*nats.Conn, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	return nc, nil
}

func (cfg Config) connect(name string) (*nats.Conn, error) {
	if cfg.InProcess == nil {
		return Connect(cfg.NATSURL, name)
	}
	nc, err := nats.Connect("", nats.Name(name), nats.InProcessServer(cfg.InProcess))
	if err != nil {
		return nil, fmt.Errorf("connect to the embedded NATS server in process: %w", err)
	}
	return nc, nil
}

// Run runs the given roles until ctx ends or one of them fails.
func Run(ctx context.Context, cfg Config, roles []string, log *slog.Logger) error {
	tokens, err := transfer.ParseTokens(cfg.HTTPTokens)
	if err != nil {
		return err
	}
	s3keys, err := transfer.ParseTokens(cfg.S3Credentials)
	if err != nil {
		return fmt.Errorf("S3 credentials: %w", err)
	}
	g, ctx := errgroup.WithContext(ctx)
	for _, role := range roles {
		nc, err := cfg.connect("sluice-" + role)
		if err != nil {
			return err
		}
		defer nc.Close()
		var run func(context.Context) error
		switch role {
		case "scheduler":
			sc := cfg.Config
			sc.Cache = cfg.CacheDir != ""
			s, err := scheduler.New(sc, nc, log)
			if err != nil {
				return err
			}
			run = s.Run
		case "generator":
			s, err := generator.New(cfg.Generator, nc, log)
			if err != nil {
				return err
			}
			run = s.Run
		case "processor":
			pc := cfg.Processor
			pc.FileRoots, pc.Tokens, pc.S3Keys, pc.CacheDir = cfg.FileRoots, tokens, s3keys, cfg.CacheDir
			run = processor.New(pc, nc, log).Run
		case "delivery":
			dc := cfg.Delivery
			dc.Tokens, dc.S3Keys = tokens, s3keys
			if len(cfg.FileRoots) > 0 {
				// Deliverers read the staged copies that processors write.
				dc.FileRoots = append(slices.Clone(cfg.FileRoots), cfg.Processor.StageDirOrDefault())
				if cfg.CacheDir != "" {
					dc.FileRoots = append(dc.FileRoots, cfg.CacheDir)
				}
			}
			run = delivery.New(dc, nc, log).Run
		default:
			return fmt.Errorf("unknown role %q (roles: scheduler, generator, processor, delivery)", role)
		}
		g.Go(func() error {
			if err := run(ctx); err != nil {
				return fmt.Errorf("%s: %w", role, err)
			}
			return nil
		})
	}
	return g.Wait()
}
