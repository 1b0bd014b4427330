package core

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// transferGrant runs d's grants until its transfer is granted, and holds
// that grant unanswered (its worker gone quiet).
func (h *harness) transferGrant(d *dtr.DTR) Grant {
	h.t.Helper()
	h.submit(d)
	for range 100 {
		for _, g := range h.tick(time.Second) {
			if g.State == dtr.Transferring {
				delete(h.running, g.ID)
				return g
			}
			h.answer(g, nil)
		}
	}
	h.t.Fatal("no transfer granted")
	return Grant{}
}

func TestWhileTheLeaseClockIsStoppedNoLeaseRunsOutAndEachGetsTheTimeBack(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Lease = time.Minute
	cases := []struct {
		name   string
		paused time.Duration // how long the clock stands still
		after  time.Duration // how long after it starts again the result comes
		taken  bool          // whether the worker's result is still current
	}{
		{"a result read at once after an outage of three leases", 3 * time.Minute, time.Second, true},
		{"a result read just before the time given back is used up", 3 * time.Minute, 50 * time.Second, true},
		{"no result for a lease after the clock starts again", 3 * time.Minute, 62 * time.Second, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, cfg)
			d := newDTR(1, "x", "")
			g := h.transferGrant(d)
			h.tick(5 * time.Second)
			h.c.PauseLeases(h.now)
			for range int(tc.paused / (10 * time.Second)) {
				h.tick(10 * time.Second)
				if got, _ := h.c.Get(d.ID); got.State != dtr.Transferring {
					t.Fatalf("the lease ran out while the clock stood still: %s", got.State)
				}
			}
			h.c.ResumeLeases(h.now)
			h.tick(tc.after)
			err := h.c.Result(h.now, Result{DTR: d.ID, Grant: g.ID, Bytes: 1, Checksum: "adler32:00000001"})
			if taken := err == nil; taken != tc.taken {
				t.Fatalf("result taken: %v (%v), want %v", taken, err, tc.taken)
			}
		})
	}
}

func TestPausingAPausedLeaseClockKeepsTheEarlierTime(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Lease = time.Minute
	h := newHarness(t, cfg)
	d := newDTR(1, "x", "")
	g := h.transferGrant(d)
	h.c.PauseLeases(h.now)
	h.tick(2 * time.Minute)
	h.c.PauseLeases(h.now) // later: ignored
	h.tick(2 * time.Minute)
	h.c.ResumeLeases(h.now)
	if !h.c.leasesPaused.IsZero() || h.c.LeasesPaused() {
		t.Fatal("the clock did not start again")
	}
	// Four minutes given back: the lease has nearly all of its minute.
	h.tick(55 * time.Second)
	if err := h.c.Result(h.now, Result{DTR: d.ID, Grant: g.ID, Bytes: 1, Checksum: "adler32:00000001"}); err != nil {
		t.Fatalf("result refused: %v", err)
	}
}

// toCleanup runs a DTR until its first transfer fails with f (or, with a
// nil f, is cancelled and stopped) and returns the cleanup grant that
// follows, unanswered.
func (h *harness) toCleanup(d *dtr.DTR, f *dtr.Failure) Grant {
	h.t.Helper()
	for i := 0; i < 20; i++ {
		for _, g := range h.tick(time.Second) {
			switch {
			case g.State == dtr.Transferring && f == nil:
				if err := h.c.Cancel(h.now, d.ID); err != nil {
					h.t.Fatal(err)
				}
				h.collect()
				h.answer(g, &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "stopped"})
			case g.State == dtr.Transferring:
				h.answer(g, f)
			case g.Cleanup:
				if g.State != dtr.RegisteringReplica || g.DTR.TransferGrant == "" {
					h.t.Fatalf("cleanup grant %s in %s for transfer %q", g.ID, g.State, g.DTR.TransferGrant)
				}
				return g
			default:
				h.answer(g, nil)
			}
		}
	}
	h.t.Fatal("no cleanup grant")
	return Grant{}
}

// firstGrant answers every grant successfully until one in state s comes,
// which it returns unanswered.
func (h *harness) firstGrant(s dtr.State) Grant {
	h.t.Helper()
	for i := 0; i < 20; i++ {
		for _, g := range h.tick(time.Second) {
			if g.State == s {
				return g
			}
			h.answer(g, nil)
		}
	}
	h.t.Fatalf("no grant in %s", s)
	return Grant{}
}

// lose lets a grant's lease run out and returns the grants that follow
// within the next few seconds.
func (h *harness) lose(g Grant, lease time.Duration) []Grant {
	delete(h.running, g.ID)
	out := h.tick(lease + time.Second)
	for i := 0; i < 5 && len(out) == 0; i++ {
		out = h.tick(time.Second)
	}
	return out
}

// A grant whose lease runs out in post-processing, or in a transfer,
// is done again, or cleaned up, before the DTR is retried or ends.
func TestALostGrantIsDoneAgainOrCleanedUp(t *testing.T) {
	t.Run("a cleanup is done again before the DTR is retried", func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.Lease, cfg.RetryBase = time.Minute, time.Second
		h := newHarness(t, cfg)
		d := newDTR(1, "x", "")
		h.submit(d)
		first := h.toCleanup(d, &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "503"})
		// Its processor dies twice with it; each time the cleanup comes again,
		// for the same transfer, before anything else.
		g := first
		for range 2 {
			next := h.lose(g, cfg.Lease)
			if len(next) != 1 || !next[0].Cleanup || next[0].State != dtr.RegisteringReplica || next[0].DTR.TransferGrant != first.DTR.TransferGrant {
				t.Fatalf("after a lost cleanup: %+v, want the cleanup of transfer %s again", next, first.DTR.TransferGrant)
			}
			g = next[0]
		}
		h.answer(g, nil)
		h.drain()
		got := h.final[d.ID]
		if got.State != dtr.Done || got.Attempts != 2 {
			t.Fatalf("ended %s after %d attempts, want DONE after 2 (the lost cleanups spend no attempt)", got.State, got.Attempts)
		}
	})

	t.Run("a cleanup of a failed DTR is done again and keeps its error", func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.Lease, cfg.RetryBase = time.Minute, time.Second
		h := newHarness(t, cfg)
		d := newDTR(1, "x", "")
		h.submit(d)
		g := h.toCleanup(d, &dtr.Failure{Kind: dtr.ErrPermanentRemote, Text: "403"})
		next := h.lose(g, cfg.Lease)
		if len(next) != 1 || !next[0].Cleanup {
			t.Fatalf("after a lost cleanup: %+v, want the cleanup again", next)
		}
		h.answer(next[0], nil)
		got := h.final[d.ID]
		if got.State != dtr.Error || got.Error == nil || got.Error.Kind != dtr.ErrPermanentRemote {
			t.Fatalf("ended %s with %+v, want ERROR with the transfer's PERMANENT_REMOTE", got.State, got.Error)
		}
	})

	t.Run("a cleanup of a cancelled DTR is done again", func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.Lease, cfg.RetryBase = time.Minute, time.Second
		h := newHarness(t, cfg)
		d := newDTR(1, "x", "")
		h.submit(d)
		g := h.toCleanup(d, nil)
		next := h.lose(g, cfg.Lease)
		if len(next) != 1 || !next[0].Cleanup {
			t.Fatalf("after a lost cleanup: %+v, want the cleanup again", next)
		}
		h.answer(next[0], nil)
		if got := h.final[d.ID]; got.State != dtr.Cancelled {
			t.Fatalf("ended %s, want CANCELLED", got.State)
		}
	})

	t.Run("a restarted scheduler does a lost cleanup again", func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.Lease, cfg.RetryBase = time.Minute, time.Minute
		h := newHarness(t, cfg)
		d := newDTR(1, "x", "")
		h.submit(d)
		g := h.toCleanup(d, &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "503"})
		delete(h.running, g.ID)
		if gs := h.tick(cfg.Lease + time.Second); len(gs) != 0 {
			t.Fatalf("grants before the cleanup's delay: %+v", gs)
		}
		// The scheduler dies while the DTR waits to be cleaned up again; the
		// new one has only the stored DTR.
		saved, _ := h.c.Get(d.ID)
		if saved.State != dtr.CacheProcessed || saved.NextProcess.IsZero() {
			t.Fatalf("waiting DTR saved as %s (next %v), want CACHE_PROCESSED with a time", saved.State, saved.NextProcess)
		}
		h2 := newHarness(t, cfg)
		h2.now = h.now
		if err := h2.c.Restore(h2.now, &saved); err != nil {
			t.Fatal(err)
		}
		next := h2.tick(cfg.RetryBase + time.Second)
		if len(next) != 1 || !next[0].Cleanup || next[0].DTR.TransferGrant != g.DTR.TransferGrant {
			t.Fatalf("after a restart: %+v, want the cleanup of transfer %s", next, g.DTR.TransferGrant)
		}
		h2.answer(next[0], nil)
		h2.drain()
		if got := h2.final[d.ID]; got.State != dtr.Done {
			t.Fatalf("ended %s, want DONE", got.State)
		}
	})

	t.Run("a finalise is still tried again as a finalise", func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.Lease, cfg.RetryBase = time.Minute, time.Second
		h := newHarness(t, cfg)
		d := newDTR(1, "x", "")
		h.submit(d)
		fin := h.firstGrant(dtr.RegisteringReplica)
		next := h.lose(fin, cfg.Lease)
		if len(next) != 1 || next[0].State != dtr.RegisteringReplica || next[0].Cleanup || next[0].DTR.TransferGrant != fin.DTR.TransferGrant {
			t.Fatalf("after a lost finalise: %+v, want the finalise of transfer %s again", next, fin.DTR.TransferGrant)
		}
	})

	// A deliverer
	// killed mid-transfer leaves a temporary file; the lease expiry says
	// nothing of which end failed, so the DTR does not move on to another
	// replica before its cleanup, which removes that file.
	t.Run("a transfer is cleaned up with or without another replica", func(t *testing.T) {
		for _, replicas := range []bool{false, true} {
			t.Run(fmt.Sprintf("replicas=%v", replicas), func(t *testing.T) {
				cfg := DefaultConfig()
				h := newHarness(t, cfg)
				d := newDTR(1, "alice", dtr.Download)
				if replicas {
					d.Replicas = []string{d.Source, "https://other.example/f"}
				}
				h.submit(d)
				lost := h.firstGrant(dtr.Transferring)
				next := h.lose(lost, cfg.Lease) // its deliverer is SIGKILLed
				for i := 0; i < 20 && len(h.final) == 0; i++ {
					for _, g := range next {
						if g.Cleanup && g.DTR.TransferGrant == lost.ID {
							return
						}
						h.answer(g, nil)
					}
					next = h.tick(time.Second)
				}
				t.Fatalf("the DTR ended %s without a cleanup of the lost transfer %s", h.final[d.ID].State, lost.ID)
			})
		}
	})
}

func TestExpiredLeaseFreesTheSlotAndTheDTRRunsAgain(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery = 1
	cfg.Lease = time.Minute
	cfg.RetryBase = time.Second
	h := newHarness(t, cfg)
	d := newDTR(1, "x", "")
	h.submit(d)
	var lost Grant
	for lost.ID == "" {
		for _, g := range h.tick(time.Second) {
			if g.State == dtr.Transferring {
				lost = g // the worker dies with it
				continue
			}
			h.answer(g, nil)
		}
	}
	delete(h.running, lost.ID)
	// Progress keeps the lease alive.
	for i := 0; i < 3; i++ {
		h.tick(30 * time.Second)
		if err := h.c.Progress(h.now, d.ID, lost.ID, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := h.c.Get(d.ID); got.State != dtr.Transferring {
		t.Fatalf("with progress the DTR should still be transferring, is %s", got.State)
	}
	h.tick(61 * time.Second)
	h.drain()
	got := h.final[d.ID]
	if got.State != dtr.Done || got.Attempts != 2 {
		t.Fatalf("after lease expiry: %s after %d attempts, want DONE after 2", got.State, got.Attempts)
	}
	if err := h.c.Result(h.now, Result{DTR: d.ID, Grant: lost.ID}); !errors.Is(err, ErrUnknownDTR) && !errors.Is(err, ErrStaleResult) {
		t.Fatalf("late result of the lost grant: %v, want it refused", err)
	}
}

func TestLostPostProcessingIsTriedAgainNotTransferredAgain(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Lease = time.Minute
	cfg.RetryBase = time.Second
	h := newHarness(t, cfg)
	d := newDTR(1, "x", "")
	h.submit(d)
	var states []string
	lost := false
	for i := 0; len(h.final) == 0 && i < 1000; i++ {
		for _, g := range h.tick(time.Second) {
			states = append(states, g.State.String())
			if g.State == dtr.RegisteringReplica && !lost {
				lost = true // the worker's result never arrives
				delete(h.running, g.ID)
				if g.Cleanup {
					t.Fatal("a successful transfer's post-processing must not be a cleanup")
				}
				continue
			}
			if g.State == dtr.RegisteringReplica && g.Cleanup {
				t.Fatal("the second try of post-processing must finalise, not clean up")
			}
			h.answer(g, nil)
		}
	}
	want := "[QUERYING_REPLICA PRE_CLEANING TRANSFERRING REGISTERING_REPLICA REGISTERING_REPLICA]"
	if fmt.Sprint(states) != want {
		t.Fatalf("grants = %v, want %s", states, want)
	}
	if got := h.final[d.ID]; got.State != dtr.Done || got.Attempts != 2 || got.TransferGrant == "" {
		t.Fatalf("ended %s after %d attempts (transfer grant %q), want DONE after 2", got.State, got.Attempts, got.TransferGrant)
	}
}

func TestLeaseEndsSaysWhenAGrantIsGivenUpUnlessItsWorkerIsHeard(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Lease = time.Minute
	h := newHarness(t, cfg)
	d := newDTR(1, "x", "")
	g := h.transferGrant(d)
	granted := h.now
	if end, ok := h.c.LeaseEnds(h.now, d.ID); !ok || !end.Equal(granted.Add(time.Minute)) {
		t.Fatalf("lease ends %s (%v), want a minute after the grant, %s", end, ok, granted.Add(time.Minute))
	}
	h.tick(10 * time.Second)
	if err := h.c.Progress(h.now, d.ID, g.ID, 1); err != nil {
		t.Fatal(err)
	}
	if end, _ := h.c.LeaseEnds(h.now, d.ID); !end.Equal(h.now.Add(time.Minute)) {
		t.Fatalf("after a renewal the lease ends %s, want %s", end, h.now.Add(time.Minute))
	}
	renewed := h.now
	h.c.PauseLeases(h.now)
	h.tick(20 * time.Second)
	if end, _ := h.c.LeaseEnds(h.now, d.ID); !end.Equal(renewed.Add(80 * time.Second)) {
		t.Fatalf("with the clock stopped for 20 s the lease ends %s, want %s", end, renewed.Add(80*time.Second))
	}
	if _, ok := h.c.LeaseEnds(h.now, newDTR(2, "x", "").ID); ok {
		t.Fatal("a DTR the core does not hold has a lease")
	}
}

func TestEachLeaseRunsOutAtItsOwnTimeWhateverTheOthersHeld(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Lease = time.Minute
	cases := []struct {
		name string
		// renewed: the first grant's worker is heard this long after its
		// grant (0: never).
		renewed time.Duration
	}{
		{"three grants given 20 s apart, none heard again", 0},
		{"the first grant's worker heard after 50 s, so it outlasts the others", 50 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, cfg)
			var ds []*dtr.DTR
			var gs []Grant
			due := map[string]time.Time{} // each grant's lease end
			var first time.Time
			for i := range 3 {
				if i > 0 {
					h.tick(20 * time.Second)
				}
				d := newDTR(i, "x", "")
				g := h.transferGrant(d)
				ds, gs = append(ds, d), append(gs, g)
				due[g.ID] = h.now.Add(cfg.Lease)
				if i == 0 {
					first = h.now
				}
			}
			ended := map[string]time.Time{}
			renewed := false
			for range 200 {
				h.tick(time.Second)
				if tc.renewed > 0 && !renewed && !h.now.Before(first.Add(tc.renewed)) {
					if err := h.c.Progress(h.now, ds[0].ID, gs[0].ID, 1); err != nil {
						t.Fatal(err)
					}
					renewed, due[gs[0].ID] = true, h.now.Add(cfg.Lease)
				}
				for i, d := range ds {
					if got, _ := h.c.Get(d.ID); ended[gs[i].ID].IsZero() && got.Grant != gs[i].ID {
						ended[gs[i].ID] = h.now
					}
				}
			}
			for i, g := range gs {
				at := ended[g.ID]
				if at.IsZero() || at.Before(due[g.ID]) || at.After(due[g.ID].Add(time.Second)) {
					t.Errorf("grant %d's lease ran out at %s, want within a second after %s", i, at.Format(time.TimeOnly), due[g.ID].Format(time.TimeOnly))
				}
			}
		})
	}
}
