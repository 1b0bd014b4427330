package core_test

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
	"github.com/sluice-dtr/sluice/services/scheduler/core/coretest"
)

// tick is the virtual clock's step in the first-wave runs.
const tick = 10 * time.Millisecond

// firstWave is what a run of shares arriving one after another shows over
// the time every share had DTRs waiting for a transfer slot.
type firstWave struct {
	window   time.Duration
	slotTime map[string]time.Duration // each share's transfer slot-time in the window
	busy     time.Duration            // all shares' slot-time in the window
	// starved counts the ticks of the window in which a share held no slot.
	starved map[string]int
}

// runFirstWave submits perShare DTRs of each share in turn, gap apart, on
// slots transfer slots, with transfers of 0.8–1.2 s (varying per share and
// per transfer), and measures each share's slot-time from the moment every
// share has a DTR waiting in TRANSFER to the moment one has none left.
func runFirstWave(t *testing.T, slots int, prios map[string]int, order []string, perShare int, gap time.Duration) firstWave {
	t.Helper()
	cfg := core.DefaultConfig()
	cfg.SharePolicy = core.PolicyDN
	cfg.SharePriority = prios
	cfg.MaxDelivery = slots
	cfg.MaxProcessor = 100
	cfg.Lease = 24 * time.Hour
	s := coretest.NewSim(t, cfg)
	s.TransferTime = func(share string, i int) time.Duration {
		return time.Duration(800+(i*7919+int(share[0])*104729)%401) * time.Millisecond
	}
	waiting := func() map[string]int {
		stats, _ := s.Core.Shares()
		w := map[string]int{}
		for _, st := range stats {
			if st.State == dtr.Transfer {
				w[st.Share] += st.Queued
			}
		}
		return w
	}
	fw := firstWave{slotTime: map[string]time.Duration{}, starved: map[string]int{}}
	next, at := 0, s.Now
	started, ended := false, false
	for !ended {
		if next < len(order) && !s.Now.Before(at) {
			s.Submit(order[next], perShare, 50)
			next++
			at = s.Now.Add(gap)
		}
		w := waiting()
		all := len(w) == len(prios)
		for _, n := range w {
			all = all && n > 0
		}
		if started && !all {
			ended = true
			break
		}
		started = started || all
		before := make(map[string]time.Duration, len(prios))
		for share := range prios {
			before[share] = s.SlotTime[share]
		}
		s.Run(tick, tick)
		if started {
			fw.window += tick
			for share := range prios {
				d := s.SlotTime[share] - before[share]
				fw.slotTime[share] += d
				fw.busy += d
				if d == 0 {
					fw.starved[share]++
				}
			}
		}
		if s.Now.Sub(coretest.T0) > time.Hour {
			t.Fatal("the shares never all had work waiting, or never stopped having it, in an hour")
		}
	}
	return fw
}

// TestASplitIsExactFromTheFirstSecond runs shares that arrive one after
// another, the first taking every slot before the others come, and checks
// that over the time all of them had work waiting each got its configured
// part of the slot-time within half a point, with every slot in use: the
// first share's overshoot is trimmed as its transfers end and paid back.
func TestASplitIsExactFromTheFirstSecond(t *testing.T) {
	tests := []struct {
		name  string
		slots int
		prios map[string]int
		order []string
		gap   time.Duration
		// perShare DTRs each share submits: fewer make a shorter window,
		// in which the first wave weighs more.
		perShare int
	}{
		{"a=20 b=80 on 10 slots, a first", 10, map[string]int{"a": 20, "b": 80}, []string{"a", "b"}, 500 * time.Millisecond, 400},
		{"a=20 b=80 on 10 slots, b first", 10, map[string]int{"a": 20, "b": 80}, []string{"b", "a"}, 500 * time.Millisecond, 400},
		{"a=60 b=40 on 7 slots, a first", 7, map[string]int{"a": 60, "b": 40}, []string{"a", "b"}, 300 * time.Millisecond, 400},
		{"a=20 b=30 c=50 on 10 slots, a second apart", 10, map[string]int{"a": 20, "b": 30, "c": 50}, []string{"a", "b", "c"}, time.Second, 400},
		// b comes just after a has started its second transfers on every
		// slot, and the window is short: without the payback a had
		// 23.28% (20.73% in the first case; the others hold without it).
		{"a=20 b=80 on 10 slots, b after a's second wave started, 150 each", 10, map[string]int{"a": 20, "b": 80}, []string{"a", "b"}, 1200 * time.Millisecond, 150},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fw := runFirstWave(t, tt.slots, tt.prios, tt.order, tt.perShare, tt.gap)
			total := 0
			for _, p := range tt.prios {
				total += p
			}
			var report []string
			for share, p := range tt.prios {
				want := 100 * float64(p) / float64(total)
				got := 100 * float64(fw.slotTime[share]) / float64(fw.busy)
				report = append(report, fmt.Sprintf("%s %.2f%% (configured %.2f%%)", share, got, want))
				if math.Abs(got-want) > 0.5 {
					defer t.Errorf("share %s had %.2f%% of the slot-time while every share had work waiting, configured %.2f%% (±0.5 point)", share, got, want)
				}
			}
			slices.Sort(report)
			use := float64(fw.busy) / (float64(fw.window) * float64(tt.slots))
			t.Logf("over %s with every share waiting: %s; slots in use %.2f%%", fw.window, strings.Join(report, ", "), 100*use)
			if use < 0.99 {
				t.Errorf("slots in use %.2f%% of the time every share had work waiting, want ≥ 99%%", 100*use)
			}
			// Paying back never takes a share's last slot.
			for share, n := range fw.starved {
				t.Errorf("share %s held no slot for %d ticks of %s while it had work waiting", share, n, tick)
			}
		})
	}
}

// TestSaturatedSharesGetTheirSlotTimeToATenthOfAPoint runs saturated shares
// whose exact quotas are fractions of a slot for two hours, transfers of
// 5–15 s on a clock of 250 ms, and checks each share's slot-time to a tenth
// of a point: the deficits count every slot for the time it was held (up
// to the moment its grant ended, not to the next tick). Counted only at
// ticks, 60/40 on 7 slots was 60.69/39.31. It does not depend on the
// payback: saturated from the start, no share has a first wave to pay.
func TestSaturatedSharesGetTheirSlotTimeToATenthOfAPoint(t *testing.T) {
	tests := []struct {
		name  string
		slots int
		prios map[string]int
	}{
		{"60/40 on 7 slots (4.2/2.8)", 7, map[string]int{"a": 60, "b": 40}},
		{"13/17/19/23/28 on 12 slots", 12, map[string]int{"a": 13, "b": 17, "c": 19, "d": 23, "e": 28}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := core.DefaultConfig()
			cfg.SharePolicy = core.PolicyDN
			cfg.SharePriority = tt.prios
			cfg.MaxDelivery, cfg.MaxProcessor, cfg.Lease = tt.slots, 100, 24*time.Hour
			s := coretest.NewSim(t, cfg)
			s.TransferTime = func(share string, i int) time.Duration {
				return time.Duration(5000+(i*7919+int(share[0])*104729)%10000) * time.Millisecond
			}
			total := 0
			for share, p := range tt.prios {
				s.Submit(share, 8000, 50)
				total += p
			}
			s.Run(2*time.Hour, 250*time.Millisecond)
			var all time.Duration
			for _, d := range s.SlotTime {
				all += d
			}
			for share, p := range tt.prios {
				want := 100 * float64(p) / float64(total)
				got := 100 * float64(s.SlotTime[share]) / float64(all)
				if math.Abs(got-want) > 0.1 {
					t.Errorf("share %s used %.2f%% of the slot-time, configured %.2f%% (±0.1 point)", share, got, want)
				}
			}
		})
	}
}

// TestWhySaysAShareHoldsFewerSlotsWhileItPaysBack checks the explanation a
// waiting DTR of a share that is paying back its first wave gets.
func TestWhySaysAShareHoldsFewerSlotsWhileItPaysBack(t *testing.T) {
	cfg := core.DefaultConfig()
	cfg.SharePolicy = core.PolicyDN
	cfg.SharePriority = map[string]int{"a": 20, "b": 80}
	cfg.MaxDelivery, cfg.MaxProcessor, cfg.MaxEmergency, cfg.Lease = 10, 100, 0, 24*time.Hour
	s := coretest.NewSim(t, cfg)
	s.TransferTime = func(string, int) time.Duration { return time.Second }
	ids := s.Submit("a", 100, 50)
	s.Run(500*time.Millisecond, tick)
	s.Submit("b", 100, 50)
	s.Run(1200*time.Millisecond, tick) // a's first wave has ended: it holds 1 slot of its 2
	if n := s.Running("a"); n != 1 {
		t.Fatalf("a runs %d transfers while it pays back, want 1", n)
	}
	w, err := s.Core.Explain(s.Now, ids[len(ids)-1])
	if err != nil {
		t.Fatal(err)
	}
	t.Log(w.Reason)
	if w.Slots != 1 || !strings.Contains(w.Reason, "its part is 2.0: it holds 1 fewer while it pays back") {
		t.Fatalf("slots %d, reason %q", w.Slots, w.Reason)
	}
}

// TestAShareHeldByAFullEndpointIsNotPaidBackWhenItFrees runs 20/80 on 10
// slots with one transfer at a time per endpoint, a's first 100 DTRs all
// on one endpoint: while they hold a below its part, b takes a's unused
// slot, and a banks nothing for it. When a's DTRs on other endpoints can
// start, a gets its part of the split, not the slots b used: no more than
// one slot more at any moment, and about its 20% of the slot-time.
func TestAShareHeldByAFullEndpointIsNotPaidBackWhenItFrees(t *testing.T) {
	cfg := core.DefaultConfig()
	cfg.SharePolicy = core.PolicyDN
	cfg.SharePriority = map[string]int{"a": 20, "b": 80}
	cfg.MaxDelivery, cfg.MaxProcessor, cfg.MaxEmergency, cfg.Lease = 10, 100, 0, 24*time.Hour
	cfg.MaxPerHost = 1
	s := coretest.NewSim(t, cfg)
	s.TransferTime = func(string, int) time.Duration { return time.Second }
	submit := func(share string, n int, host func(i int) string) {
		for i := range n {
			d := coretest.NewDTR(s.Nth[share+"/submitted"], share, "")
			d.Source = fmt.Sprintf("http://%s/%s/%d", host(i), share, i)
			s.Nth[share+"/submitted"]++
			if err := s.Core.Submit(s.Now, d); err != nil {
				t.Fatal(err)
			}
		}
	}
	submit("a", 100, func(int) string { return "slow.example" })
	submit("b", 2000, func(i int) string { return fmt.Sprintf("b%d.example", i) })
	// For 30 s a has only DTRs on the full endpoint: one transfer at a
	// time, below its part of 2; then its DTRs on other endpoints come.
	const held = 30 * time.Second
	for d := time.Duration(0); d < held; d += tick {
		s.Run(tick, tick)
		if n := s.Running("a"); n > 1 {
			t.Fatalf("a runs %d transfers on an endpoint limited to 1", n)
		}
	}
	submit("a", 400, func(i int) string { return fmt.Sprintf("a%d.example", i) })
	const window = 30 * time.Second
	before := map[string]time.Duration{"a": s.SlotTime["a"], "b": s.SlotTime["b"]}
	most := 0
	for d := time.Duration(0); d < window; d += tick {
		s.Run(tick, tick)
		most = max(most, s.Running("a"))
	}
	a, b := s.SlotTime["a"]-before["a"], s.SlotTime["b"]-before["b"]
	share := 100 * float64(a) / float64(a+b)
	t.Logf("a held below its part for %s; then over %s a ran at most %d transfers and had %.2f%% of the slot-time", held, window, most, share)
	if most > 3 {
		t.Errorf("a ran %d transfers after its endpoint freed, want at most its part and one more (3)", most)
	}
	if share > 23 {
		t.Errorf("a had %.2f%% of the slot-time after its endpoint freed, want about its 20%%: it was paid back for the time a full endpoint held it", share)
	}
}

// TestPaybackMovesASlotAndGivesItBack runs a first wave of a (20/80 on 10
// slots, b arriving after a started its second transfers on every slot)
// and follows a's transfers: a holds every slot, is trimmed below its part
// of 2 while it pays back (a slot moved to b), never to none, and holds its
// 2 again once it has paid.
func TestPaybackMovesASlotAndGivesItBack(t *testing.T) {
	cfg := core.DefaultConfig()
	cfg.SharePolicy = core.PolicyDN
	cfg.SharePriority = map[string]int{"a": 20, "b": 80}
	cfg.MaxDelivery, cfg.MaxProcessor, cfg.MaxEmergency, cfg.Lease = 10, 100, 0, 24*time.Hour
	s := coretest.NewSim(t, cfg)
	s.TransferTime = func(share string, i int) time.Duration {
		return time.Duration(800+(i*7919+int(share[0])*104729)%401) * time.Millisecond
	}
	s.Submit("a", 150, 50)
	s.Run(1200*time.Millisecond, tick)
	if n := s.Running("a"); n < 8 {
		t.Fatalf("a runs %d transfers before b comes, want (nearly) all 10", n)
	}
	s.Submit("b", 400, 50) // more than b can run in the 15 s followed
	var trace []int        // a's transfers, each time the number changes
	moved, back := false, false
	for range int(15 * time.Second / tick) {
		before := s.SlotTime["a"]
		s.Run(tick, tick)
		n := int((s.SlotTime["a"] - before) / tick) // a's transfers in the step
		if len(trace) == 0 || trace[len(trace)-1] != n {
			trace = append(trace, n)
		}
		if n == 0 {
			t.Fatalf("a ran nothing while it paid back: %v", trace)
		}
		moved = moved || n < 2
		back = back || moved && n == 2
	}
	t.Logf("a's transfers as they changed: %v", trace)
	if !moved || !back {
		t.Fatalf("a's transfers went %v: want a slot moved to b (below 2) and back (2 again)", trace)
	}
	if last := trace[len(trace)-1]; last != 2 {
		t.Fatalf("a runs %d transfers after paying back, want its part, 2 (%v)", last, trace)
	}
}
