package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/worker"
	"github.com/sluice-dtr/sluice/services/scheduler"
)

// DepthResult is what a scheduler started over many stored DTRs showed.
type DepthResult struct {
	// FirstGrant is the time from the scheduler's start (the child
	// process's, or Run's) to its first grant; Loaded the time until it
	// held every DTR stored. Restart is the time from its second start,
	// after it was killed holding them, to its first grant then.
	FirstGrant, Loaded, Restart time.Duration
	// Held is the number of DTRs it held (queued or running).
	Held int
	// RSS is the scheduler process's resident memory while it held them
	// all, settled (the smallest of the samples over the seconds after
	// it held them), and PeakRSS the largest seen from its start; both 0
	// when the scheduler ran in this process.
	RSS, PeakRSS int64
}

// Depth stores n DTRs queued for transfer, in 1,000 shares, directly in
// the checkpoint bucket of a fresh embedded server (as a scheduler that
// had taken them in would have left them, but with no restart index),
// starts a scheduler over them with 10 slots per state and no workers, and
// measures its start: the time to its first grant, the time until it
// holds them all and, with exe set (the scheduler then runs as a child
// process of that binary, alone, so that its memory can be read), its
// resident memory holding them. Then it restarts the scheduler: killed
// once it has stored a restart index, workers that answer every transfer
// at once are started (they take the grants it gave, which wait in their
// stream), and the scheduler is started again over the same store; the
// time from that start to its first grant (of any stage) is Restart.
func Depth(ctx context.Context, dir string, n int, exe string) (DepthResult, error) {
	var res DepthResult
	ns, err := bus.Embedded(filepath.Join(dir, "jetstream"), 0)
	if err != nil {
		return res, err
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return res, fmt.Errorf("depth: %w", err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := bus.Ensure(ctx, js, bus.Setup{}); err != nil {
		return res, err
	}
	if err := storeQueuedOnce(ctx, js, n); err != nil {
		return res, fmt.Errorf("depth: store: %w", err)
	}

	first, stopWatch, err := watchFirstGrant(nc)
	if err != nil {
		return res, fmt.Errorf("depth: %w", err)
	}
	defer stopWatch()
	if err := nc.Flush(); err != nil {
		return res, fmt.Errorf("depth: %w", err)
	}

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	stop, pid, err := startDepthScheduler(rctx, nc, exe, ns.ClientURL())
	if err != nil {
		return res, err
	}
	defer func() { stop() }()
	peak := func() {
		if pid != 0 {
			res.PeakRSS = max(res.PeakRSS, rssKB(pid)*1024)
		}
	}

	wait := time.Duration(max(120, n/20_000)) * time.Second
	limit := time.After(wait)
	select {
	case at := <-first:
		res.FirstGrant = at.Sub(start)
	case <-limit:
		return res, fmt.Errorf("depth: no grant within %s of the scheduler's start with %d stored", wait, n)
	}
	// Held once the shares it reports hold every DTR stored.
	for {
		peak()
		var sh api.SharesReply
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		reply, err := nc.RequestWithContext(rctx, api.SubjectShares, nil)
		rcancel()
		if err == nil && json.Unmarshal(reply.Data, &sh) == nil {
			held := 0
			for _, st := range sh.Shares {
				held += st.Queued + st.Running
			}
			if held >= n {
				res.Held, res.Loaded = held, time.Since(start)
				break
			}
		} else if err != nil && !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, context.DeadlineExceeded) {
			return res, fmt.Errorf("depth: %w", err)
		}
		select {
		case <-limit:
			return res, fmt.Errorf("depth: the scheduler held %d of %d stored after %s", res.Held, n, time.Since(start))
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	// It keeps the term it holds them in for the next 30 s (over
	// 10,000,000 a scheduler once lost it about 14 s after it began to
	// lead), in which its resident memory settles: the smallest over
	// them, the process's collector having set its limit several times
	// (every 10 s) and given back what it freed loading.
	leading, err := leaderNow(ctx, js)
	if err != nil {
		return res, fmt.Errorf("depth: holding them all: %w", err)
	}
	if pid != 0 {
		res.RSS = rssKB(pid) * 1024
	}
	for range 60 {
		time.Sleep(500 * time.Millisecond)
		if pid == 0 {
			continue // the scheduler runs in this process: no memory of its own
		}
		if kb := rssKB(pid) * 1024; kb > 0 {
			res.PeakRSS = max(res.PeakRSS, kb)
			res.RSS = min(res.RSS, kb)
		}
	}
	// The key's term is set at the first renewal of a term; a term won
	// again has a later Since.
	if now, err := leaderNow(ctx, js); err != nil || now.Instance != leading.Instance || !now.Since.Equal(leading.Since) {
		return res, fmt.Errorf("depth: the scheduler did not keep its term for 30 s once it held them all: it led %+v, then %+v (%v)", leading, now, err)
	}

	// The restart: once the scheduler has stored a restart index (each
	// checkpoint of a leader does), it is killed.
	kv, err := js.KeyValue(ctx, bus.BucketDTRs)
	if err != nil {
		return res, fmt.Errorf("depth: %w", err)
	}
	if err := until(ctx, time.Minute, func() bool {
		e, err := kv.Get(ctx, bus.IndexKey)
		return err == nil && e.Created().After(leading.Since)
	}); err != nil {
		return res, fmt.Errorf("depth: the leader stored no restart index: %w", err)
	}
	stop()
	wctx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	w, err := worker.NewPool(nc, dtr.StageDelivery, 20, func(context.Context, api.Grant, func(int64, int64)) api.Result { return api.Result{} },
		slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		return res, fmt.Errorf("depth: %w", err)
	}
	go func() { _ = w.Run(wctx) }()
	// Any grant: with few DTRs stored, the first after the restart may be
	// the post-processing of one whose transfer the workers answered.
	again, stopAgain, err := watchFirst(nc, api.SubjectGrantPrefix+">")
	if err != nil {
		return res, fmt.Errorf("depth: %w", err)
	}
	defer stopAgain()
	if err := nc.Flush(); err != nil {
		return res, fmt.Errorf("depth: %w", err)
	}
	start = time.Now()
	if stop, _, err = startDepthScheduler(rctx, nc, exe, ns.ClientURL()); err != nil {
		return res, err
	}
	select {
	case at := <-again:
		res.Restart = at.Sub(start)
	case <-time.After(wait):
		return res, fmt.Errorf("depth: no grant within %s of the scheduler's restart with %d stored", wait, n)
	case <-ctx.Done():
		return res, ctx.Err()
	}
	return res, nil
}

// startDepthScheduler starts the depth measurement's scheduler: a child
// process of exe (its pid returned), or in this process if exe is empty.
// stop kills it (SIGKILL, for the child) and waits for it to end.
func startDepthScheduler(ctx context.Context, nc *nats.Conn, exe, url string) (stop func(), pid int, err error) {
	if exe != "" {
		cmd := exec.Command(exe, "scheduler")
		cmd.Env = append(os.Environ(), "NATS_URL="+url, "SLUICE_HTTP_ADDR=127.0.0.1:0",
			// Quiet unless the bench's own environment asks for a level.
			"SLUICE_LOG_LEVEL="+cmp.Or(os.Getenv("SLUICE_LOG_LEVEL"), "error"),
			"SLUICE_MAXDELIVERY=10", "SLUICE_MAXPROCESSOR=10", "SLUICE_MAXEMERGENCY=1", "SLUICE_RETRY_BASE=1s", "SLUICE_LEASE=1h",
			// The bucket was made without a limit and holds more than the
			// default one (2 GiB, about 3.5 million DTRs of these): set
			// over it, the limit would refuse the scheduler's barrier, and
			// it could never lead. The scheduler run in this process has
			// no limit either (Config's zero StoreLimits).
			"SLUICE_DTRS_MAX_BYTES=0")
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return nil, 0, fmt.Errorf("depth: start %s scheduler: %w", exe, err)
		}
		var once sync.Once
		return func() { once.Do(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }) }, cmd.Process.Pid, nil
	}
	s, err := scheduler.New(scheduler.Config{MaxDelivery: 10, MaxProcessor: 10, MaxEmergency: 1, MaxTransferTries: 10,
		RetryBase: time.Second, Lease: time.Hour, ChainPreClean: true, RestoreHeads: scheduler.DefaultRestoreHeads}, nc, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(rctx) }()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }, 0, nil
}

// leaderNow reads who leads, and in which term.
func leaderNow(ctx context.Context, js jetstream.JetStream) (api.Leader, error) {
	var l api.Leader
	kv, err := js.KeyValue(ctx, bus.BucketLeader)
	if err != nil {
		return l, err
	}
	e, err := kv.Get(ctx, bus.LeaderKey)
	if err != nil {
		return l, fmt.Errorf("the leader's key: %w", err)
	}
	if err := json.Unmarshal(e.Value(), &l); err != nil {
		return l, fmt.Errorf("the leader's key: %w", err)
	}
	l.Since = l.Since.UTC()
	return l, nil
}

// storeQueuedOnce is storeQueued, skipped when the bucket holds n records
// or more already: a work directory used again, measuring by hand (the
// scheduler that ran over them has added its term's record, and changed
// the records of the DTRs it granted).
func storeQueuedOnce(ctx context.Context, js jetstream.JetStream, n int) error {
	if st, err := js.Stream(ctx, "KV_"+bus.BucketDTRs); err == nil {
		if info, err := st.Info(ctx); err == nil && info.State.Msgs >= uint64(n) {
			return nil
		}
	}
	return storeQueued(ctx, js, n)
}
