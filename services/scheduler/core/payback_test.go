package core

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestPaybackMovesWholeSlotsFromAnOverServedShareToAnOwedOne(t *testing.T) {
	twoShares := func(a, b ShareDemand) []ShareDemand {
		a.Name, a.Weight, b.Name, b.Weight = "a", 20, "b", 80
		return []ShareDemand{a, b}
	}
	tests := []struct {
		name    string
		shares  []ShareDemand
		deficit []float64
		hold    float64
		want    []int
	}{
		{"the first wave: the one that took every slot keeps one until it is paid back",
			twoShares(ShareDemand{Demand: 100, Running: 10}, ShareDemand{Demand: 100}), []float64{-4, 4}, 1, []int{1, 9}},
		{"owed less than half a grant: nothing moves",
			twoShares(ShareDemand{Demand: 100, Running: 2}, ShareDemand{Demand: 100, Running: 8}), []float64{-0.4, 0.4}, 1, []int{2, 8}},
		{"owed by a share that has had no more than its quota: nothing moves",
			twoShares(ShareDemand{Demand: 100, Running: 2}, ShareDemand{Demand: 100, Running: 8}), []float64{0, 3}, 1, []int{2, 8}},
		{"no hold known yet (no grant has ended): nothing moves",
			twoShares(ShareDemand{Demand: 100, Running: 10}, ShareDemand{Demand: 100}), []float64{-4, 4}, 0, []int{2, 8}},
		{"a grant already above its quota counts as paid for half of it",
			twoShares(ShareDemand{Demand: 100, Running: 1}, ShareDemand{Demand: 100, Running: 9}), []float64{-0.9, 0.9}, 1, []int{2, 8}},
		{"the one owed gets no more than its demand",
			twoShares(ShareDemand{Demand: 100, Running: 2}, ShareDemand{Demand: 8, Running: 8}), []float64{-4, 4}, 1, []int{2, 8}},
		{"the one that owes keeps the slots it owns",
			twoShares(ShareDemand{Demand: 100, Running: 2, Min: 2}, ShareDemand{Demand: 100, Running: 8}), []float64{-4, 4}, 1, []int{2, 8}},
		{"slots move only inside a tier",
			twoShares(ShareDemand{Demand: 2, Running: 2, Tier: 1}, ShareDemand{Demand: 100, Running: 8}), []float64{-4, 4}, 1, []int{2, 8}},
		{"the one owed gets at most its part twice over and one slot more",
			twoShares(ShareDemand{Demand: 100}, ShareDemand{Demand: 100, Running: 10}), []float64{10, -10}, 1, []int{5, 5}},
		{"one grant's worth per slot: a long grant pays more",
			twoShares(ShareDemand{Demand: 100, Running: 10}, ShareDemand{Demand: 100}), []float64{-40, 40}, 20, []int{1, 9}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			alloc, exact := apportion(10, tt.shares, tt.deficit)
			payback(alloc, tt.shares, tt.deficit, exact, func(int) float64 { return tt.hold })
			if fmt.Sprint(alloc) != fmt.Sprint(tt.want) {
				t.Fatalf("slots %v, want %v", alloc, tt.want)
			}
		})
	}
}

func TestPaybackSpreadsOverTheOwedSharesAndEndsWithHalfAGrantLeft(t *testing.T) {
	shares := []ShareDemand{
		{Name: "a", Weight: 50, Demand: 100, Running: 10},
		{Name: "b", Weight: 25, Demand: 100},
		{Name: "c", Weight: 25, Demand: 100},
	}
	deficit := []float64{-3, 2.2, 0.8}
	alloc, exact := apportion(10, shares, deficit)
	payback(alloc, shares, deficit, exact, func(int) float64 { return 1 })
	// a is projected to owe 3 + (10-5)/2 = 5.5 slot-seconds: b takes two
	// slots (2.2 → 0.2), c one (0.8 → -0.2).
	if fmt.Sprint(alloc) != "[2 5 3]" {
		t.Fatalf("slots %v, want [2 5 3] (exact %v)", alloc, exact)
	}
}

func TestDeficitsAreCappedAtTwoTurnoversOfTheSlots(t *testing.T) {
	st := &stateQueues{order: []*shareState{{name: "a", deficit: -500}, {name: "b", deficit: 500}, {name: "c", deficit: 3}}}
	st.capDeficits(10)
	if st.order[1].deficit != 500 {
		t.Fatalf("a deficit was capped before any grant had ended: %v", st.order[1].deficit)
	}
	st.observe(1500 * time.Millisecond)
	st.capDeficits(10)
	got := []float64{st.order[0].deficit, st.order[1].deficit, st.order[2].deficit}
	if fmt.Sprint(got) != "[-30 30 3]" {
		t.Fatalf("deficits %v, want [-30 30 3] (2 × 10 slots × 1.5 s)", got)
	}
}

func TestOnlyCompletedGrantsTeachHowLongAGrantHoldsItsSlot(t *testing.T) {
	tests := []struct {
		name     string
		end      func(h *harness, g Grant)
		wantHold float64 // seconds
	}{
		{"a result after 30 s", func(h *harness, g Grant) {
			h.tick(30 * time.Second)
			if err := h.c.Result(h.now, Result{DTR: g.DTR.ID, Grant: g.ID, Bytes: 1, Checksum: "adler32:00000001"}); err != nil {
				h.t.Fatal(err)
			}
		}, 30},
		{"a lease that ran out", func(h *harness, g Grant) {
			for range 5 {
				h.tick(30 * time.Second)
			}
		}, 0},
		{"a grant given back after 30 s", func(h *harness, g Grant) {
			h.tick(30 * time.Second)
			if err := h.c.Result(h.now, Result{DTR: g.DTR.ID, Grant: g.ID, Returned: true}); err != nil {
				h.t.Fatal(err)
			}
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Lease = 2 * time.Minute
			h := newHarness(t, cfg)
			g := h.transferGrant(newDTR(1, "x", ""))
			before := h.c.states[dtr.Transfer].hold
			tt.end(h, g)
			if got := h.c.states[dtr.Transfer].hold - before; got != tt.wantHold {
				t.Fatalf("the mean hold of TRANSFER grew by %v s, want %v s", got, tt.wantHold)
			}
		})
	}
}

func TestAccrueSkipsAPauseAndATimeAlreadyCounted(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name  string
		at    []time.Duration // the times accrue is called, after t0
		want  float64
		since time.Duration
	}{
		{"two seconds below its quota", []time.Duration{2 * time.Second}, 2, 2 * time.Second},
		{"a pause of two minutes", []time.Duration{2 * time.Minute}, 0, 2 * time.Minute},
		{"counted on after a pause", []time.Duration{2 * time.Minute, 2*time.Minute + time.Second}, 1, 2*time.Minute + time.Second},
		{"a time before the last counted", []time.Duration{2 * time.Second, time.Second, 3 * time.Second}, 3, 3 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ss := &shareState{quota: 2, running: 1, since: t0}
			for _, d := range tt.at {
				ss.accrue(t0.Add(d))
			}
			if ss.deficit != tt.want || !ss.since.Equal(t0.Add(tt.since)) {
				t.Fatalf("deficit %v counted to %v, want %v to %v", ss.deficit, ss.since.Sub(t0), tt.want, tt.since)
			}
		})
	}
}

func TestAHeldShareIsOwedNoMoreThanItRunsAndTheOthersOweNothingForItsSlots(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	held := &shareState{quota: 2, running: 1, since: t0, heldBack: heldBack{held: true}}
	taker := &shareState{quota: 8, running: 9, since: t0, heldBack: heldBack{passedOn: 1}}
	for _, ss := range []*shareState{held, taker} {
		ss.accrue(t0.Add(10 * time.Second))
	}
	if held.deficit != 0 || taker.deficit != 0 {
		t.Fatalf("deficits %v and %v after 10 s of a held share's slot used by another, want 0 and 0", held.deficit, taker.deficit)
	}
}

func TestPaybackSaysWhichSharesItTookSlotsFrom(t *testing.T) {
	tests := []struct {
		name     string
		slots    int
		shares   []ShareDemand
		deficit  []float64
		wantGave string
		note     []bool // whether sluice why notes payback for each share
	}{
		{"the first wave", 10,
			[]ShareDemand{{Name: "a", Weight: 20, Demand: 100, Running: 10}, {Name: "b", Weight: 80, Demand: 100}},
			[]float64{-4, 4}, "[1 0]", []bool{true, false}},
		{"below its part because every share has a slot, owing a little: none taken", 3,
			[]ShareDemand{{Name: "a", Weight: 10, Demand: 10, Running: 1}, {Name: "b", Weight: 1, Demand: 10, Running: 1}, {Name: "c", Weight: 1, Demand: 10, Running: 1}},
			[]float64{-0.2, 0.1, 0.1}, "[]", []bool{false, false, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			alloc, exact := apportion(tt.slots, tt.shares, tt.deficit)
			gave := payback(alloc, tt.shares, tt.deficit, exact, func(int) float64 { return 1 })
			if fmt.Sprint(gave) != tt.wantGave {
				t.Fatalf("gave %v, want %v (slots %v)", gave, tt.wantGave, alloc)
			}
			for i := range tt.shares {
				g := 0
				if gave != nil {
					g = gave[i]
				}
				if note := paybackNote(g, exact[i], tt.deficit[i]) != ""; note != tt.note[i] {
					t.Errorf("share %s (slots %d, part %.2f, deficit %v): note %v, want %v", tt.shares[i].Name, alloc[i], exact[i], tt.deficit[i], note, tt.note[i])
				}
			}
		})
	}
}

func TestAShareWhoseEndpointIsFullBanksNoSlotTimeForIt(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.SharePriority = map[string]int{"a": 20, "b": 80}
	cfg.MaxDelivery, cfg.MaxProcessor, cfg.MaxEmergency, cfg.Lease = 10, 100, 0, time.Hour
	cfg.MaxPerHost = 1
	h := newHarness(t, cfg)
	for i := range 20 {
		d := newDTR(i, "a", "")
		d.Source = fmt.Sprintf("http://slow.example/a/%d", i) // one endpoint
		h.submit(d)
		d = newDTR(i, "b", "")
		d.Source = fmt.Sprintf("http://b%d.example/b/%d", i, i)
		h.submit(d)
	}
	// Processing answers at once; transfers keep their slots.
	for range 20 {
		for _, g := range h.tick(time.Second) {
			if g.State != dtr.Transferring {
				h.answer(g, nil)
			}
		}
	}
	st := h.c.states[dtr.Transfer]
	a, b := st.shares["a"], st.shares["b"]
	if a == nil || b == nil {
		t.Fatal("a or b has no work in TRANSFER")
	}
	if a.running != 1 || b.running != 9 {
		t.Fatalf("a runs %d and b %d, want 1 (its endpoint's limit) and 9 (a's unused slot too)", a.running, b.running)
	}
	// a's held DTRs are parked: they claim no part of the split, so a's
	// quota is what it runs, and neither share is owed anything for the
	// slot b uses in its place. (Without parking, markHeld gives a's
	// unused quota to b, with the same deficits.)
	if a.held && b.held {
		t.Fatalf("held: a %v, b %v; b is not held", a.held, b.held)
	}
	// At most the first tick's slot-time, before a's DTRs were parked, and
	// nothing more however long a stays held.
	da, db := a.deficit, b.deficit
	if math.Abs(da) > 1+1e-9 || math.Abs(db) > 1+1e-9 {
		t.Fatalf("deficits a %v, b %v after %s with a held: want at most one tick's slot-time", da, db, 20*time.Second)
	}
	for range 20 {
		for _, g := range h.tick(time.Second) {
			if g.State != dtr.Transferring {
				h.answer(g, nil)
			}
		}
	}
	if math.Abs(a.deficit-da) > 1e-9 || math.Abs(b.deficit-db) > 1e-9 {
		t.Fatalf("deficits went from a %v, b %v to a %v, b %v while a stayed held: a banks slot-time for the slot it cannot use", da, db, a.deficit, b.deficit)
	}
}
