package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// queuedDTR is a DTR as a real job's would be, waiting in TRANSFER: URLs,
// identity, job id, trace context.
func queuedDTR(i, shares int, now time.Time) *dtr.DTR {
	share := i % shares
	return &dtr.DTR{
		ID:           uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "bench-%d", i)),
		JobID:        fmt.Sprintf("job-%07d", i/100),
		Source:       fmt.Sprintf("https://storage-%d.example.org/atlas/data/run-%06d/file-%07d.root", share%7, i/1000, i),
		Destination:  fmt.Sprintf("file:///scratch/session/%07d/file-%07d.root", i/100, i),
		Owner:        dtr.Identity{DN: fmt.Sprintf("/DC=org/DC=example/CN=user-%04d", share)},
		Direction:    dtr.Download,
		UserPriority: 1 + i%100,
		Share:        fmt.Sprintf("/DC=org/DC=example/CN=user-%04d-download", share),
		Priority:     1 + i%100,
		State:        dtr.Transfer,
		MaxAttempts:  10,
		Created:      now,
		Updated:      now,
		TraceParent:  fmt.Sprintf("00-%032x-%016x-01", i, i),
	}
}

// MemoryPerQueued returns the heap a queued DTR holds in the scheduler's
// core, its data included, with n queued in 1,000 shares.
func MemoryPerQueued(n int) float64 {
	// The heap with the core and again right after it is freed: what else
	// the process frees meanwhile stays out of the difference.
	var with, without runtime.MemStats
	cfg := core.DefaultConfig()
	cfg.SharePolicy = core.PolicyDN
	cfg.MaxDelivery, cfg.MaxProcessor, cfg.MaxEmergency = 1000, 1000, 0
	c := core.New(cfg)
	now := time.Now()
	for i := 0; i < n; i++ {
		if err := c.Restore(now, queuedDTR(i, 1000, now)); err != nil {
			panic(err) // ids are distinct by construction
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&with)
	runtime.KeepAlive(c)
	c = nil
	runtime.GC()
	runtime.ReadMemStats(&without)
	return float64(int64(with.HeapAlloc)-int64(without.HeapAlloc)) / float64(n)
}

// RestartToFirstGrant stores n DTRs as queued for transfer in the
// sluice_dtrs bucket of a fresh embedded server, starts a scheduler and
// returns how long it took from its start to its first grant: recovery
// reads every record back.
func RestartToFirstGrant(ctx context.Context, dir string, n int) (time.Duration, error) {
	ns, err := bus.Embedded(dir, 0)
	if err != nil {
		return 0, err
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return 0, fmt.Errorf("restart: %w", err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := bus.Ensure(ctx, js, bus.Setup{}); err != nil {
		return 0, err
	}
	out := bus.NewBatch(ctx, js)
	now := time.Now()
	for i := 0; i < n; i++ {
		d := queuedDTR(i, 1, now)
		d.Share = "_default-download"
		m := nats.NewMsg("$KV." + bus.BucketDTRs + "." + d.ID.String())
		m.Data, _ = json.Marshal(d)
		out.Add(m)
		if out.Len() == 5000 {
			if err := out.Wait(ctx); err != nil {
				return 0, err
			}
		}
	}
	if err := out.Wait(ctx); err != nil {
		return 0, err
	}
	first, stopWatch, err := watchFirstGrant(nc)
	if err != nil {
		return 0, fmt.Errorf("restart: %w", err)
	}
	defer stopWatch()
	s, err := scheduler.New(scheduler.Config{MaxDelivery: 10, MaxProcessor: 10, MaxEmergency: 1, MaxTransferTries: 10,
		RetryBase: time.Second, Lease: time.Hour, ChainPreClean: true}, nc, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	go func() { _ = s.Run(rctx) }()
	select {
	case at := <-first:
		return at.Sub(start), nil
	case <-time.After(time.Minute):
		return 0, fmt.Errorf("restart: no grant within a minute of the scheduler's start with %d queued", n)
	}
}

// watchFirstGrant hears when the first transfer grant is published on nc.
func watchFirstGrant(nc *nats.Conn) (first <-chan time.Time, stop func(), err error) {
	return watchFirst(nc, api.GrantSubject(dtr.StageDelivery))
}

// watchFirst hears when the first message is published on subject.
func watchFirst(nc *nats.Conn, subject string) (first <-chan time.Time, stop func(), err error) {
	at := make(chan time.Time, 1)
	sub, err := nc.Subscribe(subject, func(*nats.Msg) {
		select {
		case at <- time.Now():
		default:
		}
	})
	if err != nil {
		return nil, nil, err
	}
	return at, func() { _ = sub.Unsubscribe() }, nil
}
