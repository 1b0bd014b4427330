package core

import (
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

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
