package core

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// queuedDTR is a DTR as a real job's would be, waiting in TRANSFER: URLs,
// identity, job id, trace context.
func queuedDTR(i, shares int) *dtr.DTR {
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
		Created:      t0,
		Updated:      t0,
		TraceParent:  fmt.Sprintf("00-%032x-%016x-01", i, i),
	}
}

func benchCore(n, shares, slots int) *Core {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.MaxDelivery = slots
	cfg.MaxProcessor = slots
	cfg.MaxEmergency = 0
	cfg.Lease = 24 * time.Hour
	c := New(cfg)
	for i := 0; i < n; i++ {
		if err := c.Restore(t0, queuedDTR(i, shares)); err != nil {
			panic(err)
		}
	}
	return c
}

// BenchmarkGrantDecisions measures how fast the core decides grants with
// 1,000,000 DTRs queued in 1,000 shares: each round every running grant
// completes and the freed slots are granted again (1,000 transfer slots).
func BenchmarkGrantDecisions(b *testing.B) {
	c := benchCore(1_000_000, 1000, 1000)
	now := t0
	var running []Grant
	decisions := 0
	b.ResetTimer()
	start := time.Now()
	for decisions < b.N {
		now = now.Add(50 * time.Millisecond)
		for _, g := range running {
			if err := c.Result(now, Result{DTR: g.DTR.ID, Grant: g.ID}); err != nil {
				b.Fatal(err)
			}
		}
		c.Tick(now)
		out := c.Take()
		running = out.Grants
		decisions += len(out.Grants)
		if len(out.Grants) == 0 {
			b.Fatal("no grants")
		}
	}
	b.ReportMetric(float64(decisions)/time.Since(start).Seconds(), "decisions/s")
}

// BenchmarkMemoryPerQueuedDTR measures the heap a queued DTR holds in the
// core, its data included, with 1,000,000 queued in 1,000 shares.
func BenchmarkMemoryPerQueuedDTR(b *testing.B) {
	const n = 1_000_000
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		c := benchCore(n, 1000, 1000)
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/DTR")
		runtime.KeepAlive(c)
	}
}

// BenchmarkChainedLifecycle runs file→file DTRs through every stage at
// ARC's 10 slots per state with chaining on, a steady flow: each step (a
// tick) 50 DTRs arrive and every running grant ends. It reports the grants
// per DTR and how many of the DTRs' pre-cleans ran under their query's
// grant (chained/DTR; 1 is every one). With unchained=N, one chained
// query in N is answered without its pre-clean (as a worker that knows no
// chaining would), so that now and then a DTR waits in PRE_CLEAN: while
// QUERY_REPLICA and PRE_CLEAN are both saturated, each such DTR keeps one
// query a tick unchained from then on (its separate pre-clean holds the
// PRE_CLEAN slot the query would need), and before a tick granted
// PRE_CLEAN first, one such DTR kept every query unchained.
func BenchmarkChainedLifecycle(b *testing.B) {
	for _, unchained := range []int{0, 100} {
		b.Run(fmt.Sprintf("unchained=%d", unchained), func(b *testing.B) { benchChainedLifecycle(b, unchained) })
	}
}

func benchChainedLifecycle(b *testing.B, unchainedEvery int) {
	cfg := DefaultConfig()
	cfg.ChainPreClean = true
	cfg.Lease = time.Hour
	c := New(cfg)
	now := t0
	var running []Grant
	submitted, done, grants, chained, answered := 0, 0, 0, 0, 0
	b.ResetTimer()
	for done < b.N {
		now = now.Add(10 * time.Millisecond)
		for range 50 {
			d := &dtr.DTR{ID: uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "chain-%d", submitted)),
				Source: fmt.Sprintf("file:///in/%d", submitted), Destination: fmt.Sprintf("file:///out/%d", submitted),
				Owner: dtr.Identity{DN: fmt.Sprintf("/CN=user-%d", submitted%3)}, Direction: dtr.Download}
			if err := c.Submit(now, d); err != nil {
				b.Fatal(err)
			}
			submitted++
		}
		for _, g := range running {
			r := Result{DTR: g.DTR.ID, Grant: g.ID, State: g.State, Size: 1024, Bytes: 1024}
			if g.Then != nil {
				if answered++; unchainedEvery == 0 || answered%unchainedEvery != 0 {
					r.Then = &Result{DTR: g.DTR.ID, Grant: g.Then.Grant, State: g.Then.State}
				}
			}
			if err := c.Result(now, r); err != nil {
				b.Fatal(err)
			}
		}
		c.Tick(now)
		out := c.Take()
		running = out.Grants
		grants += len(out.Grants) + len(out.Chained)
		chained += len(out.Chained)
		done += len(out.Final)
	}
	b.ReportMetric(float64(chained)/float64(done), "chained/DTR")
	b.ReportMetric(float64(grants)/float64(done), "grants/DTR")
}
