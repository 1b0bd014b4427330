package core

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// cacheWorker answers grants as processors and deliverers with a cache
// would: entries holds the sources in the cache, locked those being
// downloaded.
type cacheWorker struct {
	entries, locked map[string]bool
	transfers       map[uuid.UUID]int
	targets         map[uuid.UUID]string
	cleanups        int
}

func newCacheWorker() *cacheWorker {
	return &cacheWorker{entries: map[string]bool{}, locked: map[string]bool{}, transfers: map[uuid.UUID]int{}, targets: map[uuid.UUID]string{}}
}

func (w *cacheWorker) resultFor(g Grant) Result {
	r := Result{DTR: g.DTR.ID, Grant: g.ID}
	src := g.DTR.Source
	switch g.State {
	case dtr.CheckingCache:
		r.CacheFile = "file:///cache/" + src
		switch {
		case w.locked[src]:
			r.Cache = dtr.CacheLocked
		case w.entries[src]:
			r.Cache = dtr.CacheHit
		default:
			r.Cache = dtr.CacheDownload
			w.locked[src] = true
		}
	case dtr.Transferring:
		w.transfers[g.DTR.ID]++
		w.targets[g.DTR.ID] = g.DTR.Target()
	case dtr.ProcessingCache:
		if g.DTR.Cache == dtr.CacheDownload {
			delete(w.locked, src)
			if !g.Cleanup {
				w.entries[src] = true
			}
		}
		if g.Cleanup {
			w.cleanups++
		}
	}
	return r
}

func (h *harness) serve(w *cacheWorker, steps int, fail func(Grant) *dtr.Failure) {
	for i := 0; i < steps && h.c.Len() > 0; i++ {
		for _, g := range h.tick(500 * time.Millisecond) {
			r := w.resultFor(g)
			if fail != nil {
				r.Error = fail(g)
			}
			delete(h.running, g.ID)
			if err := h.c.Result(h.now, r); err != nil {
				h.t.Fatal(err)
			}
			h.collect()
		}
	}
}

func cacheConfig() Config {
	cfg := DefaultConfig()
	cfg.Cache = true
	cfg.CacheWait = time.Second
	cfg.RetryBase = time.Second
	return cfg
}

func TestACachedFileIsLinkedAndNotTransferredAgain(t *testing.T) {
	h := newHarness(t, cacheConfig())
	w := newCacheWorker()
	first := newDTR(1, "alice", dtr.Download)
	h.submit(first)
	h.serve(w, 100, nil)
	if h.final[first.ID].State != dtr.Done || w.transfers[first.ID] != 1 {
		t.Fatalf("first download ended %s with %d transfers", h.final[first.ID].State, w.transfers[first.ID])
	}
	if w.targets[first.ID] != "file:///cache/"+first.Source {
		t.Fatalf("the first download wrote to %s, want the cache entry", w.targets[first.ID])
	}
	again := newDTR(2, "bob", dtr.Download)
	again.Source = first.Source
	h.submit(again)
	h.serve(w, 100, nil)
	if h.final[again.ID].State != dtr.Done || w.transfers[again.ID] != 0 {
		t.Fatalf("a cached file ended %s with %d transfers, want DONE with none", h.final[again.ID].State, w.transfers[again.ID])
	}
}

func TestConcurrentDTRsForOneFileWaitForOneDownloadWhichTakesTheHighestPriority(t *testing.T) {
	cfg := cacheConfig()
	cfg.MaxDelivery = 1
	h := newHarness(t, cfg)
	w := newCacheWorker()
	low := newDTR(1, "alice", dtr.Download)
	low.UserPriority = 10
	h.submit(low)
	// The low-priority DTR checks the cache and takes the lock.
	for _, g := range h.tick(time.Second) {
		if err := h.c.Result(h.now, w.resultFor(g)); err != nil {
			t.Fatal(err)
		}
		delete(h.running, g.ID)
	}
	h.collect()
	high := newDTR(2, "bob", dtr.Download)
	high.Source, high.UserPriority = low.Source, 90
	h.submit(high)
	h.collect()
	if d, _ := h.c.Get(high.ID); d.State != dtr.CacheWait {
		t.Fatalf("the second DTR for the same file is %s, want CACHE_WAIT", d.State)
	}
	if d, _ := h.c.Get(low.ID); d.Priority != DTRPriority(50, 90) {
		t.Fatalf("the downloading DTR has priority %d, want the waiter's %d", d.Priority, DTRPriority(50, 90))
	}
	h.serve(w, 200, nil)
	if h.final[high.ID].State != dtr.Done || h.final[low.ID].State != dtr.Done {
		t.Fatalf("ended %s and %s", h.final[low.ID].State, h.final[high.ID].State)
	}
	if w.transfers[low.ID]+w.transfers[high.ID] != 1 {
		t.Fatalf("%d transfers for one file, want 1", w.transfers[low.ID]+w.transfers[high.ID])
	}
}

func TestAFailedDownloadIntoTheCacheIsCleanedUpAndRetried(t *testing.T) {
	h := newHarness(t, cacheConfig())
	w := newCacheWorker()
	d := newDTR(1, "alice", dtr.Download)
	h.submit(d)
	failed := false
	h.serve(w, 200, func(g Grant) *dtr.Failure {
		if g.State == dtr.Transferring && !failed {
			failed = true
			return &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "503", Location: dtr.LocationSource}
		}
		return nil
	})
	f := h.final[d.ID]
	if f.State != dtr.Done || f.Attempts != 2 || w.cleanups != 1 || len(w.locked) != 0 {
		t.Fatalf("ended %s after %d attempts, %d cache cleanups, locks %v; want DONE after 2, 1 cleanup, no lock left", f.State, f.Attempts, w.cleanups, w.locked)
	}
}

func TestALockHeldElsewhereIsWaitedFor(t *testing.T) {
	h := newHarness(t, cacheConfig())
	w := newCacheWorker()
	d := newDTR(1, "alice", dtr.Download)
	w.locked[d.Source] = true // another process downloads it
	h.submit(d)
	h.serve(w, 10, nil)
	if got, _ := h.c.Get(d.ID); got.State != dtr.CacheWait && got.State != dtr.CheckCache && got.State != dtr.CheckingCache {
		t.Fatalf("state %s while the file is locked elsewhere", got.State)
	}
	delete(w.locked, d.Source)
	w.entries[d.Source] = true // the other download finished
	h.serve(w, 100, nil)
	if h.final[d.ID].State != dtr.Done || w.transfers[d.ID] != 0 {
		t.Fatalf("ended %s with %d transfers, want DONE from the cache", h.final[d.ID].State, w.transfers[d.ID])
	}
}

func TestUploadsLocalSourcesAndOptedOutFilesSkipTheCache(t *testing.T) {
	h := newHarness(t, cacheConfig())
	w := newCacheWorker()
	up := newDTR(1, "alice", dtr.Upload)
	up.Source, up.Destination = "file:///data/out", "https://storage.example/out"
	local := newDTR(2, "alice", dtr.Download)
	local.Source = "file:///data/in"
	no := newDTR(3, "alice", dtr.Download)
	no.Options.NoCache = true
	h.submit(up, local, no)
	checks := 0
	h.serve(w, 100, func(g Grant) *dtr.Failure {
		if g.State == dtr.CheckingCache {
			checks++
		}
		return nil
	})
	if checks != 0 || len(h.final) != 3 {
		t.Fatalf("%d cache checks, %d final; want none and 3", checks, len(h.final))
	}
}

// TestTheCacheDownloadOfAnAbandonedReplicaIsForgotten: a DTR that
// downloads its first replica into the cache and moves on to its next
// replica is forgotten as that download when it ends; a later DTR for the
// first source does not wait in CACHE_WAIT for ever.
func TestTheCacheDownloadOfAnAbandonedReplicaIsForgotten(t *testing.T) {
	h := newHarness(t, cacheConfig())
	w := newCacheWorker()
	a := newDTR(1, "alice", dtr.Download)
	a.Replicas = []string{a.Source, "http://other.example/alice/1"}
	h.submit(a)
	first := a.Source // the submitted slice is reordered in place; keep S1
	failed := false
	h.serve(w, 100, func(g Grant) *dtr.Failure {
		if g.State == dtr.QueryingReplica && !failed {
			failed = true
			return &dtr.Failure{Kind: dtr.ErrPermanentRemote, Text: "404", Location: dtr.LocationSource}
		}
		return nil
	})
	if h.final[a.ID].State != dtr.Done {
		t.Fatalf("first DTR ended %s", h.final[a.ID].State)
	}
	delete(w.locked, first) // whatever the worker did, no lock is held on disk
	b := newDTR(2, "bob", dtr.Download)
	b.Source = first
	h.submit(b)
	h.serve(w, 200, nil)
	if got, ok := h.final[b.ID]; !ok || got.State != dtr.Done {
		d, _ := h.c.Get(b.ID)
		t.Fatalf("a later DTR for %s is %s after 100 s, want DONE (caching still maps it to %v)", first, d.State, h.c.caching[first] != nil)
	}
}
