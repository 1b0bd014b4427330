package core

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// stagedDTR is a DTR whose source is staged before its transfer.
func stagedDTR(i int, dn string, prio int) *dtr.DTR {
	d := newDTR(i, dn, dtr.Download)
	d.Options.Stage = true
	d.UserPriority = prio
	return d
}

// runPre answers every running pre-processing grant (the staging ones with
// a TURL) and leaves delivery and post-processing grants running; it
// returns how many staging grants it answered.
func (h *harness) runPre() int {
	staged := 0
	for i := 0; i < 20; i++ {
		h.tick(time.Second)
		answered := 0
		for _, g := range h.running {
			if g.Stage != dtr.StagePre {
				continue
			}
			r := Result{DTR: g.DTR.ID, Grant: g.ID}
			if g.State == dtr.StagingPreparing {
				r.TURL = "file:///stage/" + g.DTR.ID.String()
				staged++
			}
			delete(h.running, g.ID)
			if err := h.c.Result(h.now, r); err != nil {
				h.t.Fatal(err)
			}
			answered++
		}
		h.collect()
		if answered == 0 {
			break
		}
	}
	return staged
}

func (h *harness) pinned(share string) int {
	if p := h.c.pins.of(share); p != nil {
		return p.n
	}
	return 0
}

func TestStagedDTRsGoThroughStagingAndRelease(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	h.submit(stagedDTR(1, "alice", 50))
	var states []dtr.State
	for len(h.final) == 0 {
		for _, g := range h.tick(time.Second) {
			states = append(states, g.State)
			r := Result{DTR: g.DTR.ID, Grant: g.ID}
			switch g.State {
			case dtr.StagingPreparing:
				r.TURL = "file:///stage/x"
			case dtr.Transferring:
				if g.DTR.TURL != "file:///stage/x" {
					t.Errorf("transfer grant has TURL %q, want the staged copy", g.DTR.TURL)
				}
			}
			delete(h.running, g.ID)
			if err := h.c.Result(h.now, r); err != nil {
				t.Fatal(err)
			}
			h.collect()
		}
	}
	want := []dtr.State{dtr.QueryingReplica, dtr.PreCleaning, dtr.StagingPreparing, dtr.Transferring,
		dtr.ReleasingRequest, dtr.RegisteringReplica}
	if len(states) != len(want) {
		t.Fatalf("grants in %v, want %v", states, want)
	}
	for i := range want {
		if states[i] != want[i] {
			t.Fatalf("grants in %v, want %v", states, want)
		}
	}
	if h.pinned("alice-download") != 0 {
		t.Error("the staged copy is still counted after its release")
	}
}

func TestMaxPreparedLimitsStagedCopiesPerShare(t *testing.T) {
	tests := []struct {
		name string
		// later is submitted once the share holds maxprepared staged copies.
		later      *dtr.DTR
		wantStaged int
	}{
		{"a DTR of equal priority waits for a release", stagedDTR(10, "alice", 50), 0},
		{"a DTR of lower priority waits for a release", stagedDTR(10, "alice", 20), 0},
		{"a DTR that outranks every staged one bypasses the limit", stagedDTR(10, "alice", 90), 1},
		{"another share has its own limit", stagedDTR(10, "bob", 50), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxPrepared = 3
			cfg.MaxDelivery = 1
			cfg.SharePolicy = PolicyDN
			h := newHarness(t, cfg)
			for i := 0; i < 6; i++ {
				h.submit(stagedDTR(i, "alice", 50))
			}
			if got := h.runPre(); got != 3 {
				t.Fatalf("%d DTRs staged, want maxprepared = 3", got)
			}
			if n := h.pinned("alice-download"); n != 3 {
				t.Fatalf("%d staged copies held, want 3", n)
			}
			h.submit(tt.later)
			if got := h.runPre(); got != tt.wantStaged {
				t.Fatalf("%d more staged, want %d", got, tt.wantStaged)
			}
			if tt.wantStaged == 0 {
				w, err := h.c.Explain(h.now, tt.later.ID)
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(w.Reason, "staged copies (maxprepared 3)") {
					t.Errorf("why: %q, want it to name the staged copies and maxprepared", w.Reason)
				}
			}
		})
	}
}

func TestReleasedStagedCopyLetsTheNextDTRStage(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxPrepared = 2
	h := newHarness(t, cfg)
	for i := 0; i < 4; i++ {
		h.submit(stagedDTR(i, "alice", 50))
	}
	if got := h.runPre(); got != 2 {
		t.Fatalf("%d staged, want 2", got)
	}
	// Finish one transfer and its release: one staged copy is freed.
	for _, g := range h.running {
		if g.State == dtr.Transferring {
			h.answer(g, nil)
			break
		}
	}
	for _, g := range h.tick(time.Second) {
		if g.State == dtr.ReleasingRequest {
			h.answer(g, nil)
		}
	}
	if n := h.pinned("_default-download"); n != 1 {
		t.Fatalf("%d staged copies held after a release, want 1", n)
	}
	if got := h.runPre(); got != 1 {
		t.Fatalf("%d staged after the release, want 1", got)
	}
}

func TestCancelledAndFailedStagedDTRsReleaseTheirCopy(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxPrepared = 5
	cfg.MaxDelivery = 1
	h := newHarness(t, cfg)
	a, b := stagedDTR(1, "alice", 50), stagedDTR(2, "alice", 50)
	h.submit(a, b)
	h.runPre()
	if n := h.pinned("_default-download"); n != 2 {
		t.Fatalf("%d staged copies, want 2", n)
	}
	// One is transferring, the other waits for delivery with its copy.
	var waiting, transferring Grant
	for _, g := range h.running {
		if g.State == dtr.Transferring {
			transferring = g
		}
	}
	waiting.DTR = a
	if transferring.DTR.ID == a.ID {
		waiting.DTR = b
	}
	if err := h.c.Cancel(h.now, waiting.DTR.ID); err != nil {
		t.Fatal(err)
	}
	h.answer(transferring, &dtr.Failure{Kind: dtr.ErrPermanentRemote, Text: "gone"})
	released := 0
	for i := 0; i < 10 && len(h.final) < 2; i++ {
		for _, g := range h.tick(time.Second) {
			if g.State == dtr.ReleasingRequest {
				released++
			}
			h.answer(g, nil)
		}
	}
	if released != 2 {
		t.Errorf("%d releases, want one for the cancelled and one for the failed DTR", released)
	}
	if n := h.pinned("_default-download"); n != 0 {
		t.Errorf("%d staged copies still counted", n)
	}
	if h.final[a.ID].State == dtr.Done || h.final[b.ID].State == dtr.Done {
		t.Errorf("final states %s and %s, want CANCELLED and ERROR", h.final[a.ID].State, h.final[b.ID].State)
	}
}

func TestRestoredCoreCountsStagedCopies(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxPrepared = 2
	cfg.MaxDelivery = 1
	h := newHarness(t, cfg)
	for i := 0; i < 3; i++ {
		h.submit(stagedDTR(i, "alice", 50))
	}
	h.runPre()
	h2 := newHarness(t, cfg)
	for _, e := range h.c.dtrs {
		cp := *h.c.peekEntry(e)
		if err := h2.c.Restore(h.now, &cp); err != nil {
			t.Fatal(err)
		}
	}
	if n := h2.pinned("_default-download"); n != 2 {
		t.Fatalf("restored core counts %d staged copies, want 2", n)
	}
	if got := h2.runPre(); got != 0 {
		t.Fatalf("restored core staged %d more, want 0", got)
	}
}
