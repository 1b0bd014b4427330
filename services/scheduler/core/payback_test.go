package core

import (
	"fmt"
	"testing"
	"time"
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
		{"the one owed gets at most one slot more than its part",
			twoShares(ShareDemand{Demand: 100}, ShareDemand{Demand: 100, Running: 10}), []float64{10, -10}, 1, []int{3, 7}},
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
	// a is projected to owe 3 + (10-5)/2 = 5.5 slot-seconds: b and c are
	// owed half a grant and more, and each takes one slot more than its
	// part (3/2 by the deficits), no more.
	if fmt.Sprint(alloc) != "[3 4 3]" {
		t.Fatalf("slots %v, want [3 4 3] (exact %v)", alloc, exact)
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
