package core

import (
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
