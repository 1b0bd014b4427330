package core

import (
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// passCore is a core with queued DTRs in two shares, some running and
// one waiting to retry.
func passCore(t *testing.T, n int) *harness {
	cfg := DefaultConfig()
	cfg.MaxProcessor, cfg.MaxDelivery, cfg.MaxEmergency = 3, 2, 0
	cfg.RetryBase = time.Hour
	h := newHarness(t, cfg)
	for i := range n {
		h.submit(newDTR(i, []string{"/CN=a", "/CN=b"}[i%2], dtr.Download))
		if i%50 == 0 {
			h.tick(time.Millisecond)
		}
	}
	failed := false
	for range 5 {
		for _, g := range h.tick(time.Second) {
			var f *dtr.Failure
			if g.State == dtr.Transferring && !failed {
				f, failed = &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "GET got 503"}, true
			}
			if g.State != dtr.Transferring || f != nil {
				h.answer(g, f)
			}
		}
	}
	return h
}

func TestAPassInSlicesSeesWhatOneWalkSees(t *testing.T) {
	for _, slice := range []int{1, 7, 1000} {
		h := passCore(t, 300)
		want := h.standings()
		got := map[uuid.UUID]Standing{}
		p := h.c.BeginPass(10)
		for !p.Step(slice, func(s Standing) {
			if _, twice := got[s.DTR]; twice {
				t.Fatalf("slices of %d: %s seen twice", slice, s.DTR)
			}
			got[s.DTR] = s
		}) {
		}
		if len(got) != len(want) || p.Seen() != len(want) {
			t.Fatalf("slices of %d: %d seen (Seen says %d), want %d", slice, len(got), p.Seen(), len(want))
		}
		for id, s := range want {
			if got[id] != s {
				t.Fatalf("slices of %d: %s stands %+v in the pass, %+v in one walk", slice, id, got[id], s)
			}
		}
		if l, w := p.Longest(10), h.c.Longest(10); !slices.Equal(l, w) {
			t.Fatalf("slices of %d: the pass's longest-waiting are %v, Longest's %v", slice, l, w)
		}
		if !p.Step(1, func(Standing) { t.Fatal("a pass over goes on") }) {
			t.Fatal("a pass over says it is not")
		}
	}
}

func TestAPassGoesOnWhileTheCoreChanges(t *testing.T) {
	h := passCore(t, 200)
	before := h.standings()
	seen := map[uuid.UUID]int{}
	seenIn := map[uuid.UUID]dtr.State{}
	p := h.c.BeginPass(10)
	defer p.Stop()
	count := func(s Standing) { seen[s.DTR]++; seenIn[s.DTR] = s.State }
	p.Step(50, count)
	// Between slices: DTRs are cancelled, new ones come, slots are granted.
	var cancelled []uuid.UUID
	for id, s := range before {
		if s.Hold != HoldRunning && len(cancelled) < 40 {
			if err := h.c.Cancel(h.now, id); err != nil {
				t.Fatal(err)
			}
			cancelled = append(cancelled, id)
		}
	}
	for i := range 30 {
		h.submit(newDTR(1000+i, "/CN=c", dtr.Download))
	}
	for _, g := range h.tick(time.Second) {
		if g.State != dtr.Transferring {
			h.answer(g, nil)
		}
	}
	for !p.Step(13, count) {
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("%s seen %d times", id, n)
		}
	}
	after := h.standings()
	for id := range before {
		if _, stayed := after[id]; stayed && seen[id] == 0 {
			t.Fatalf("%s, there from the pass's start to its end, was not seen", id)
		}
	}
	longest := p.Longest(10)
	if len(longest) == 0 {
		t.Fatal("no longest-waiting DTR found")
	}
	for _, id := range longest {
		s, ok := after[id]
		if !ok || s.Hold == HoldRunning {
			t.Fatalf("%s is named as waiting, but stands %+v (held: %v)", id, s, ok)
		}
		if slices.Contains(cancelled, id) {
			t.Fatalf("%s is named as waiting, but was cancelled", id)
		}
		if s.State != seenIn[id] {
			t.Fatalf("%s is named as waiting since the pass met it in %s, but it has moved on to %s", id, seenIn[id], s.State)
		}
	}
}

func TestAPassDoesNotNameADTRThatWasGrantedAndQueuedAgainAsLongestWaiting(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxProcessor, cfg.MaxEmergency = 1, 0
	h := newHarness(t, cfg)
	var ids []uuid.UUID
	for i := range 3 {
		d := newDTR(i, "/CN=a", dtr.Download)
		h.submit(d)
		h.tick(time.Millisecond)
		ids = append(ids, d.ID)
	}
	seenIn := map[uuid.UUID]dtr.State{}
	p := h.c.BeginPass(3)
	defer p.Stop()
	for !p.Step(10, func(s Standing) { seenIn[s.DTR] = s.State }) {
	}
	// The first is answered and holds PRE_CLEAN's one slot; the second
	// is granted its query, answered, and waits again, for PRE_CLEAN.
	for _, want := range []dtr.State{dtr.QueryingReplica, dtr.QueryingReplica} {
		for _, g := range h.running {
			if g.State == want {
				h.answer(g, nil)
			}
		}
		h.tick(time.Second)
	}
	now := h.standings()
	for _, id := range p.Longest(3) {
		if s := now[id]; s.State != seenIn[id] || s.Hold == HoldRunning {
			t.Fatalf("%s is named as waiting where the pass met it (%s), but stands %+v", id, seenIn[id], s)
		}
	}
}
