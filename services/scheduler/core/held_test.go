package core

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// standings collects where every DTR stands.
func (h *harness) standings() map[uuid.UUID]Standing {
	out := map[uuid.UUID]Standing{}
	h.c.Standings(func(s Standing) { out[s.DTR] = s })
	return out
}

func TestStandingsAgreeWithExplain(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery = 2
	cfg.MaxEmergency = 0
	cfg.Lease = time.Hour
	h := newHarness(t, cfg)
	for i := 0; i < 6; i++ {
		h.submit(newDTR(i, "a", ""))
	}
	toTransfer(h)
	// One transfer fails: its DTR waits for a retry after post-processing.
	for _, g := range h.running {
		if g.State == dtr.Transferring {
			h.answer(g, &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "connection reset"})
			break
		}
	}
	for i := 0; i < 10; i++ {
		for _, g := range h.tick(100 * time.Millisecond) {
			if g.State != dtr.Transferring {
				h.answer(g, nil)
			}
		}
	}
	// What Explain says, in a word.
	reasons := map[Hold]string{
		HoldRunning:   "running in ",
		HoldRetry:     "waiting to retry",
		HoldShareFull: "share _default uses all its 2 of 2 slots",
	}
	got := h.standings()
	if len(got) != h.c.Len() {
		t.Fatalf("%d standings for %d DTRs", len(got), h.c.Len())
	}
	seen := map[Hold]int{}
	for id, s := range got {
		seen[s.Hold]++
		w, err := h.c.Explain(h.now, id)
		if err != nil {
			t.Fatal(err)
		}
		if want, ok := reasons[s.Hold]; !ok || !strings.HasPrefix(w.Reason, want) {
			t.Errorf("DTR %s stands %s in %s; Explain says %q", id, s.Hold, s.State, w.Reason)
		}
		if s.State != w.State {
			t.Errorf("DTR %s: state %s, Explain %s", id, s.State, w.State)
		}
		if s.Hold == HoldRetry && (s.Until.IsZero() || s.Since.IsZero()) {
			t.Errorf("a retry with no end or no since: %+v", s)
		}
		if !s.Hold.Waits() && s.Since.IsZero() {
			t.Errorf("DTR %s held %s has no since", id, s.Hold)
		}
	}
	if seen[HoldRunning] != 2 || seen[HoldRetry] != 1 || seen[HoldShareFull] != 3 {
		t.Fatalf("holds %v, want 2 running, 1 retry_backoff, 3 share_full", seen)
	}
}

func TestHoldWaitsOnlyForWhatWillCome(t *testing.T) {
	for _, tt := range []struct {
		hold  Hold
		waits bool
	}{
		{HoldRunning, false}, {HoldRouting, false}, {HoldFreeSlot, false},
		{HoldRetry, true}, {HoldCache, true}, {HoldEndpoint, true}, {HoldMaxPrepared, true},
		{HoldNoSlot, true}, {HoldStateFull, true}, {HoldShareFull, true},
	} {
		if got := tt.hold.Waits(); got != tt.waits {
			t.Errorf("%s.Waits() = %v, want %v", tt.hold, got, tt.waits)
		}
	}
}

// BenchmarkStandings measures a sweep of where every DTR stands (the
// scheduler's history and stuck-DTR detector) with 100,000 DTRs queued in
// 100 shares, 1,000 of them running.
func BenchmarkStandings(b *testing.B) {
	c := benchCore(100_000, 100, 1000)
	c.Tick(t0.Add(time.Second))
	c.Take()
	b.ResetTimer()
	for range b.N {
		n := 0
		c.Standings(func(Standing) { n++ })
		if n != 100_000 {
			b.Fatalf("%d standings", n)
		}
	}
}

func TestAStandingsSinceIsWhenTheDTREnteredItsStateNotItsLastUpdate(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery = 1
	cfg.MaxEmergency = 0
	cfg.Lease = 100 * time.Hour
	h := newHarness(t, cfg)
	h.submit(newDTR(0, "a", ""))
	toTransfer(h)
	var id uuid.UUID
	for _, g := range h.running {
		if g.State == dtr.Transferring {
			id = g.DTR.ID
		}
	}
	if id == uuid.Nil {
		t.Fatal("no transfer running")
	}
	entered := h.standings()[id].Since
	if entered.IsZero() {
		t.Fatal("a running DTR with no since")
	}
	// A change of priority every 90 minutes moves the record's Updated,
	// not when it entered TRANSFERRING.
	for i := range 6 {
		h.tick(90 * time.Minute)
		if err := h.c.SetPriority(h.now, id, 10+i); err != nil {
			t.Fatal(err)
		}
		if got := h.standings()[id]; got.State != dtr.Transferring || !got.Since.Equal(entered) {
			t.Fatalf("after %d priority changes: %s since %s, want %s since %s", i+1, got.State, got.Since, dtr.Transferring, entered)
		}
	}
}

// TestAParkedDTRStandsHeldByItsHold: a DTR parked under a full endpoint,
// link or activity limit is reported held by that, not as having a slot.
func TestAParkedDTRStandsHeldByItsHold(t *testing.T) {
	cfgs := heldConfigs()
	byLink := DefaultConfig()
	byLink.MaxDelivery, byLink.MaxEmergency = 10, 0
	byLink.Optimizer = DefaultOptimizerConfig()
	byLink.Optimizer.Start, byLink.Optimizer.Min = 1, 1
	cfgs["link"] = byLink
	want := map[string]Hold{"activity limit": HoldActivity, "max per host": HoldEndpoint, "link": HoldLink}
	for name, cfg := range cfgs {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, cfg)
			held := h.submitHeldThenRunnable()
			h.runToTransfer()
			standings := h.standings()
			parked := 0
			for _, d := range held {
				if e := h.c.dtrs[d.ID]; e.park == nil {
					continue
				}
				parked++
				if got := standings[d.ID].Hold; got != want[name] {
					t.Fatalf("a parked DTR stands %q, want %q", got, want[name])
				}
				if !want[name].Waits() {
					t.Fatalf("%q does not wait", want[name])
				}
			}
			if parked < 50 {
				t.Fatalf("%d of 100 DTRs for a full endpoint parked", parked)
			}
		})
	}
}
