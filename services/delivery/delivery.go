// Package delivery is the delivery service: it moves the bytes of granted
// transfers (TRANSFER state) from source to a temporary destination,
// computing checksums while streaming and reporting progress, which renews
// the grant's lease.
package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
	"github.com/sluice-dtr/sluice/pkg/worker"
)

// Config is the delivery service's configuration, read from
// SLUICE_DELIVERY_*.
type Config struct {
	Workers int `envconfig:"WORKERS" default:"11" desc:"concurrent transfers; at least maxdelivery + maxemergency"`
	// MaxInactivity ends a transfer that moved no data for this long with a
	// TRANSFER_SPEED error, which is retried (ARC: speedcontrol max_inact).
	MaxInactivity time.Duration `envconfig:"MAX_INACTIVITY" default:"5m" desc:"a transfer that moves no data for this long fails (TRANSFER_SPEED, retried)"`
	// FileRoots limits file:// reads and writes (SLUICE_FILE_ROOTS); none
	// means no limit.
	FileRoots []string `ignored:"true"`
	// Tokens are bearer token files per host (SLUICE_HTTP_TOKENS).
	Tokens map[string]string `ignored:"true"`
}

// errInactive ends a transfer that stopped moving data.
var errInactive = errors.New("no data moved")

// Service is a running delivery service.
type Service struct {
	cfg    Config
	nc     *nats.Conn
	client *transfer.Client
	log    *slog.Logger
}

// New prepares a delivery service on nc.
func New(cfg Config, nc *nats.Conn, log *slog.Logger) *Service {
	return &Service{cfg: cfg, nc: nc, client: transfer.New(nil), log: log.With("service", "delivery")}
}

// Run serves transfer grants until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	s.client = s.client.WithTokens(s.cfg.Tokens)
	if len(s.cfg.FileRoots) > 0 {
		files, err := transfer.OpenFiles(s.cfg.FileRoots...)
		if err != nil {
			return fmt.Errorf("delivery: %w", err)
		}
		s.client = s.client.WithFiles(files)
	}
	p, err := worker.NewPool(s.nc, dtr.StageDelivery, s.cfg.Workers, s.Handle, s.log)
	if err != nil {
		return err
	}
	return p.Run(ctx)
}

// watchInactivity cancels a transfer whose byte count has not grown for
// MaxInactivity.
func (s *Service) watchInactivity(ctx context.Context, cancel context.CancelCauseFunc, lastMove *atomic.Int64) (stop func()) {
	limit := s.cfg.MaxInactivity
	if limit <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(min(limit/4, time.Second))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				if time.Since(time.Unix(0, lastMove.Load())) > limit {
					cancel(errInactive)
					return
				}
			}
		}
	}()
	return func() { close(done) }
}

// Handle moves one file. The checksum type is the expected checksum's, else
// adler32.
func (s *Service) Handle(ctx context.Context, g bus.Grant, report func(int64, int64)) bus.Result {
	d := g.DTR
	typ := "adler32"
	if d.Options.Checksum != "" {
		if t, _, err := dtr.ParseChecksum(d.Options.Checksum); err == nil {
			typ = t
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var lastMove atomic.Int64 // when the byte count last grew
	lastMove.Store(time.Now().UnixNano())
	var moved int64
	stop := s.watchInactivity(ctx, cancel, &lastMove)
	defer stop()
	src := d.Source
	if d.TURL != "" {
		src = d.TURL // the staged copy
	}
	cr, err := s.client.Copy(ctx, src, transfer.TempURLOf(&d), transfer.CopyOptions{
		ChecksumTypes: []string{typ},
		Progress: func(b int64) {
			if b > moved {
				moved = b
				lastMove.Store(time.Now().UnixNano())
			}
			report(b, d.Size)
		},
	})
	res := bus.Result{Bytes: cr.Bytes, Size: cr.Bytes, Started: cr.Started, Ended: cr.Ended}
	if err != nil {
		kind, text := transfer.KindOf(err), err.Error()
		if errors.Is(context.Cause(ctx), errInactive) {
			kind, text = dtr.ErrTransferSpeed, fmt.Sprintf("%s for %s (max inactivity); %d bytes moved", errInactive, s.cfg.MaxInactivity, cr.Bytes)
		}
		res.Error = &dtr.Failure{Kind: kind, Text: text}
		return res
	}
	res.Checksum = cr.Checksums[typ]
	return res
}
