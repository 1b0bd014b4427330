package core

import (
	"errors"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestAResultFromAnotherStageThanItsGrantsIsRefusedAndChangesNothing(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	d := newDTR(1, "x", "")
	h.submit(d)
	g := h.tick(time.Second)[0]
	if g.Stage != dtr.StagePre {
		t.Fatalf("first grant of stage %s", g.Stage)
	}
	for _, stage := range []dtr.Stage{dtr.StageDelivery, dtr.StagePost} {
		err := h.c.Result(h.now, Result{DTR: d.ID, Grant: g.ID, Stage: stage, Failure: &dtr.Failure{Kind: dtr.ErrPermanentRemote}})
		if !errors.Is(err, ErrStaleResult) {
			t.Fatalf("a %s result for a pre grant: %v, want ErrStaleResult", stage, err)
		}
	}
	if got, _ := h.c.Get(d.ID); got.State != dtr.QueryingReplica || got.Error != nil {
		t.Fatalf("the DTR changed: %s, %+v", got.State, got.Error)
	}
	// From its own stage (or a caller that does not say) it is taken.
	if err := h.c.Result(h.now, Result{DTR: d.ID, Grant: g.ID, Stage: dtr.StagePre}); err != nil {
		t.Fatal(err)
	}
}

// A worker that stops gives back the grants it holds: each DTR goes back to
// the queue it was granted from, its slot is free at once, no attempt is
// spent and no retry delay applies; the returned grant is no longer current.
func TestAReturnedGrantPutsTheDTRBackInItsQueueWithoutSpendingAnAttempt(t *testing.T) {
	for _, state := range []dtr.State{dtr.QueryingReplica, dtr.PreCleaning, dtr.Transferring, dtr.RegisteringReplica} {
		t.Run(state.String(), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxDelivery, cfg.MaxProcessor, cfg.MaxEmergency = 1, 1, 0
			cfg.RetryBase = time.Hour // a retry would not come back within the test
			h := newHarness(t, cfg)
			d := newDTR(1, "x", "")
			h.submit(d)
			var returned Grant
			for returned.ID == "" {
				gs := h.tick(time.Second)
				if len(gs) == 0 && len(h.running) == 0 {
					t.Fatalf("no grant in %s came", state)
				}
				for _, g := range gs {
					if g.State == state {
						returned = g
						continue
					}
					h.answer(g, nil)
				}
			}
			delete(h.running, returned.ID)
			if err := h.c.Result(h.now, Result{DTR: d.ID, Grant: returned.ID, Returned: true}); err != nil {
				t.Fatal(err)
			}
			out := h.collect()
			queue, _ := dtr.QueueOf(state)
			if len(out.Changed) != 1 || out.Changed[0].State != queue || len(out.Grants) != 0 {
				t.Fatalf("after the return: changed %v, grants %v; want the DTR back in %s", out.Changed, out.Grants, queue)
			}
			if err := h.c.Result(h.now, Result{DTR: d.ID, Grant: returned.ID}); !errors.Is(err, ErrStaleResult) {
				t.Fatalf("a result of the returned grant: %v, want it refused as stale", err)
			}
			// The next tick grants it again, under a new grant id.
			again := h.tick(time.Second)
			if len(again) != 1 || again[0].State != state || again[0].ID == returned.ID {
				t.Fatalf("after the return the next grants are %v, want one new grant in %s", again, state)
			}
			h.drain()
			if f := h.final[d.ID]; f.State != dtr.Done || f.Attempts != 1 {
				t.Fatalf("ended %s after %d attempts, want DONE after 1", f.State, f.Attempts)
			}
		})
	}
}

// The size delivery holds a source to is the one the latest QUERY_REPLICA
// found: neither an earlier query's nor what a failed transfer moved.
func TestATransferExpectsTheSizeOfTheLatestQueryOfItsSource(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxTransferTries = 3
	h := newHarness(t, cfg)
	d := newDTR(1, "alice", dtr.Download)
	h.submit(d)
	queried := []int64{1000, 0} // the second query finds no size
	var expected []int64        // d.Size in each transfer grant
	for i := 0; len(h.final) == 0 && i < 1000; i++ {
		for _, g := range h.tick(time.Second) {
			r := Result{DTR: g.DTR.ID, Grant: g.ID}
			switch g.State {
			case dtr.QueryingReplica:
				r.Size, queried = queried[0], queried[1:]
			case dtr.Transferring:
				expected = append(expected, g.DTR.Size)
				r.Bytes = 500
				if len(expected) == 1 {
					// As a deliverer before this change answered.
					r.Size = 500
					r.Failure = &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "short body", Location: dtr.LocationSource}
				} else {
					r.Size, r.Checksum = 500, "adler32:00000001"
				}
			}
			delete(h.running, g.ID)
			if err := h.c.Result(h.now, r); err != nil {
				t.Fatal(err)
			}
			h.collect()
		}
	}
	if len(expected) != 2 || expected[0] != 1000 || expected[1] != 0 {
		t.Fatalf("transfers expected sizes %v, want [1000 0]", expected)
	}
	if got := h.final[d.ID]; got.State != dtr.Done || got.Size != 500 {
		t.Fatalf("final DTR %s with size %d, want DONE with the 500 bytes delivered", got.State, got.Size)
	}
}
