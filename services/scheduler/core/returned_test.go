package core

import (
	"errors"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

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
			out := h.take()
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
