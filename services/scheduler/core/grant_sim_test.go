package core_test

import (
	"fmt"
	"math"
	"sort"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/services/scheduler/core"
	"github.com/sluice-dtr/sluice/services/scheduler/core/coretest"
)

func TestSaturatedSharesGetTheirConfiguredSlotTime(t *testing.T) {
	tests := []struct {
		name  string
		slots int
		prios map[string]int
	}{
		{"2 shares 60/40 on 10 slots", 10, map[string]int{"a": 60, "b": 40}},
		{"2 shares 60/40 on 7 slots (4.2/2.8)", 7, map[string]int{"a": 60, "b": 40}},
		{"5 shares 10/15/20/25/30 on 10 slots", 10, map[string]int{"a": 10, "b": 15, "c": 20, "d": 25, "e": 30}},
		{"5 shares 13/17/19/23/28 on 12 slots", 12, map[string]int{"a": 13, "b": 17, "c": 19, "d": 23, "e": 28}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := core.DefaultConfig()
			cfg.SharePolicy = core.PolicyDN
			cfg.SharePriority = tt.prios
			cfg.MaxDelivery = tt.slots
			cfg.MaxProcessor = 100
			cfg.Lease = 24 * time.Hour
			s := coretest.NewSim(t, cfg)
			// Transfers of 5–15 s, varying per share and per transfer.
			s.TransferTime = func(share string, i int) time.Duration {
				return time.Duration(5000+(i*7919+int(share[0])*104729)%10000) * time.Millisecond
			}
			total := 0
			for share := range tt.prios {
				s.Submit(share, 8000, 50) // more than any share can finish: saturated throughout
				total += tt.prios[share]
			}
			s.Run(2*time.Hour, 250*time.Millisecond)
			var all time.Duration
			for _, d := range s.SlotTime {
				all += d
			}
			var report []string
			for share, p := range tt.prios {
				want := 100 * float64(p) / float64(total)
				got := 100 * float64(s.SlotTime[share]) / float64(all)
				report = append(report, fmt.Sprintf("%s %.2f%% (configured %.2f%%)", share, got, want))
				if math.Abs(got-want) > 1 {
					defer t.Errorf("share %s used %.2f%% of the slot-time, configured %.2f%% (±1 point)", share, got, want)
				}
			}
			sort.Strings(report)
			t.Log(report)
			if util := float64(s.BusyTime) / float64(s.QueuedTime); util < 0.99 {
				t.Errorf("all slots were busy %.1f%% of the time work was queued, want 100%%", 100*util)
			}
		})
	}
}

func TestANewlyActiveShareStartsAtTheNextCompletionOrOnAnEmergencySlot(t *testing.T) {
	for _, emergency := range []int{0, 1} {
		t.Run(fmt.Sprintf("maxemergency=%d", emergency), func(t *testing.T) {
			cfg := core.DefaultConfig()
			cfg.SharePolicy = core.PolicyDN
			cfg.MaxDelivery = 4
			cfg.MaxEmergency = emergency
			cfg.Lease = 24 * time.Hour
			s := coretest.NewSim(t, cfg)
			s.TransferTime = func(string, int) time.Duration { return time.Minute }
			s.Submit("busy", 100, 50)
			s.Run(30*time.Second, 100*time.Millisecond) // busy holds all 4 slots
			arrived := s.Now
			s.Submit("new", 5, 50)
			s.Run(2*time.Minute, 100*time.Millisecond)
			waited := s.FirstGrant["new"].Sub(arrived)
			if emergency == 1 && waited > time.Second {
				t.Fatalf("with an emergency slot the new share waited %s", waited)
			}
			// Without one it starts when the first running transfer ends,
			// 30 s after it arrived.
			if emergency == 0 && (waited < 29*time.Second || waited > 31*time.Second) {
				t.Fatalf("the new share waited %s, want the next completion (30 s)", waited)
			}
		})
	}
}

func TestTheLowestPriorityDTRInABusyShareDoesRun(t *testing.T) {
	cfg := core.DefaultConfig()
	cfg.MaxDelivery = 2
	cfg.Lease = 24 * time.Hour
	cfg.AgeAfter = 10 * time.Minute
	cfg.AgeAfterState = nil // TRANSFER too ages after AgeAfter
	cfg.AgeEvery = time.Minute
	s := coretest.NewSim(t, cfg)
	s.TransferTime = func(string, int) time.Duration { return 30 * time.Second }
	low := s.Submit("x", 1, 1)[0]
	// A steady stream of high-priority work that alone would fill the slots
	// for ever.
	for i := 0; i < 120; i++ {
		s.Submit("x", 4, 100)
		s.Run(time.Minute, time.Second)
		if _, ok := s.Final[low]; ok {
			t.Logf("the low-priority DTR ran after %d minutes", i+1)
			return
		}
	}
	t.Fatal("the lowest-priority DTR never ran in two hours of high-priority work")
}

// With more active shares than slots, each gets a slot in turn: the split
// had given the first n shares by priority then name one slot each and the
// others none on every tick, and the emergency slot always to the first
// idle one by priority: the last share never transferred.
func TestMoreSharesThanSlotsTakeTurns(t *testing.T) {
	cfg := core.DefaultConfig()
	cfg.SharePolicy = core.PolicyDN
	cfg.MaxDelivery, cfg.MaxProcessor, cfg.MaxEmergency = 4, 50, 1
	s := coretest.NewSim(t, cfg)
	for u := 1; u <= 6; u++ {
		s.Submit(fmt.Sprintf("u%d", u), 500, 50)
	}
	s.Run(30*time.Minute, time.Second)
	for u := 1; u <= 6; u++ {
		t.Logf("u%d: %s of transfer slot-time", u, s.SlotTime[fmt.Sprintf("u%d", u)])
	}
	for u := 1; u <= 6; u++ {
		// 5 slots (4 and the emergency one) for 30 minutes among 6
		// equal shares: 25 minutes each.
		if got := s.SlotTime[fmt.Sprintf("u%d", u)]; got < 20*time.Minute || got > 30*time.Minute {
			t.Errorf("share u%d (equal priority, work queued for 30 min) had %s of slot-time, want about 25m", u, got)
		}
	}
}
