package core

import (
	"fmt"
	"math"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// sim runs the core on a virtual clock with workers that take a set time
// per grant, and measures the slot-time each share uses in TRANSFER.
type sim struct {
	t   *testing.T
	c   *Core
	now time.Time
	// running grants and when each ends.
	ends map[string]time.Time
	held map[string]Grant
	// transferTime gives the duration of the i-th transfer of a share.
	transferTime func(share string, i int) time.Duration
	// bytes, if set, gives the bytes a transfer of a share moved.
	bytes       func(share string) int64
	moved       map[string]int64 // bytes moved per share
	nth         map[string]int
	slotTime    map[string]time.Duration // TRANSFER slot-time per share
	busyTime    time.Duration            // time all TRANSFER slots were busy
	queuedTime  time.Duration            // time some DTR waited in TRANSFER
	final       map[uuid.UUID]dtr.DTR
	firstGrant  map[string]time.Time // first TRANSFER grant per share
	grantsOrder []uuid.UUID          // TRANSFER grants in order
}

func newSim(t *testing.T, cfg Config) *sim {
	return &sim{t: t, c: New(cfg), now: t0, ends: map[string]time.Time{}, held: map[string]Grant{},
		nth: map[string]int{}, slotTime: map[string]time.Duration{}, final: map[uuid.UUID]dtr.DTR{},
		firstGrant: map[string]time.Time{}, moved: map[string]int64{},
		transferTime: func(string, int) time.Duration { return 10 * time.Second }}
}

func (s *sim) submit(share string, n int, userPrio int) []uuid.UUID {
	var ids []uuid.UUID
	for i := 0; i < n; i++ {
		d := newDTR(s.nth[share+"/submitted"], share, "")
		s.nth[share+"/submitted"]++
		d.UserPriority = userPrio
		if err := s.c.Submit(s.now, d); err != nil {
			s.t.Fatal(err)
		}
		ids = append(ids, d.ID)
	}
	return ids
}

// run advances the virtual clock by d in steps of tick.
func (s *sim) run(d, tick time.Duration) {
	end := s.now.Add(d)
	for s.now.Before(end) {
		s.c.Tick(s.now)
		out := s.c.Take()
		for _, f := range out.Final {
			s.final[f.ID] = *f
		}
		for _, g := range out.Grants {
			s.held[g.ID] = g
			if g.State == dtr.Transferring {
				share := g.DTR.Share
				if _, ok := s.firstGrant[share]; !ok {
					s.firstGrant[share] = s.now
				}
				s.grantsOrder = append(s.grantsOrder, g.DTR.ID)
				s.ends[g.ID] = s.now.Add(s.transferTime(share, s.nth[share]))
				s.nth[share]++
			} else {
				s.ends[g.ID] = s.now // processing is instant here
			}
		}
		// Account the step, then let time pass and finish what is due.
		busy := 0
		for _, g := range s.held {
			if g.State == dtr.Transferring {
				s.slotTime[g.DTR.Share] += tick
				busy++
			}
		}
		if busy >= s.c.Limit(dtr.Transfer) {
			s.busyTime += tick
		}
		if s.c.states[dtr.Transfer].waiting() > 0 {
			s.queuedTime += tick
		}
		s.now = s.now.Add(tick)
		var due []string
		for id, at := range s.ends {
			if !at.After(s.now) {
				due = append(due, id)
			}
		}
		sort.Strings(due)
		for _, id := range due {
			g := s.held[id]
			delete(s.held, id)
			delete(s.ends, id)
			r := Result{DTR: g.DTR.ID, Grant: g.ID}
			if s.bytes != nil && g.State == dtr.Transferring {
				r.Bytes = s.bytes(g.DTR.Share)
				s.moved[g.DTR.Share] += r.Bytes
			}
			if err := s.c.Result(s.now, r); err != nil {
				s.t.Fatal(err)
			}
		}
	}
}

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
			cfg := DefaultConfig()
			cfg.SharePolicy = PolicyDN
			cfg.SharePriority = tt.prios
			cfg.MaxDelivery = tt.slots
			cfg.MaxProcessor = 100
			cfg.Lease = 24 * time.Hour
			s := newSim(t, cfg)
			// Transfers of 5–15 s, varying per share and per transfer.
			s.transferTime = func(share string, i int) time.Duration {
				return time.Duration(5000+(i*7919+int(share[0])*104729)%10000) * time.Millisecond
			}
			total := 0
			for share := range tt.prios {
				s.submit(share, 8000, 50) // more than any share can finish: saturated throughout
				total += tt.prios[share]
			}
			s.run(2*time.Hour, 250*time.Millisecond)
			var all time.Duration
			for _, d := range s.slotTime {
				all += d
			}
			var report []string
			for share, p := range tt.prios {
				want := 100 * float64(p) / float64(total)
				got := 100 * float64(s.slotTime[share]) / float64(all)
				report = append(report, fmt.Sprintf("%s %.2f%% (configured %.2f%%)", share, got, want))
				if math.Abs(got-want) > 1 {
					defer t.Errorf("share %s used %.2f%% of the slot-time, configured %.2f%% (±1 point)", share, got, want)
				}
			}
			sort.Strings(report)
			t.Log(report)
			if util := float64(s.busyTime) / float64(s.queuedTime); util < 0.99 {
				t.Errorf("all slots were busy %.1f%% of the time work was queued, want 100%%", 100*util)
			}
		})
	}
}

func TestANewlyActiveShareStartsAtTheNextCompletionOrOnAnEmergencySlot(t *testing.T) {
	for _, emergency := range []int{0, 1} {
		t.Run(fmt.Sprintf("maxemergency=%d", emergency), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.SharePolicy = PolicyDN
			cfg.MaxDelivery = 4
			cfg.MaxEmergency = emergency
			cfg.Lease = 24 * time.Hour
			s := newSim(t, cfg)
			s.transferTime = func(string, int) time.Duration { return time.Minute }
			s.submit("busy", 100, 50)
			s.run(30*time.Second, 100*time.Millisecond) // busy holds all 4 slots
			arrived := s.now
			s.submit("new", 5, 50)
			s.run(2*time.Minute, 100*time.Millisecond)
			waited := s.firstGrant["new"].Sub(arrived)
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
	cfg := DefaultConfig()
	cfg.MaxDelivery = 2
	cfg.Lease = 24 * time.Hour
	cfg.AgeAfter = 10 * time.Minute
	cfg.AgeEvery = time.Minute
	s := newSim(t, cfg)
	s.transferTime = func(string, int) time.Duration { return 30 * time.Second }
	low := s.submit("x", 1, 1)[0]
	// A steady stream of high-priority work that alone would fill the slots
	// for ever.
	for i := 0; i < 120; i++ {
		s.submit("x", 4, 100)
		s.run(time.Minute, time.Second)
		if _, ok := s.final[low]; ok {
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
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.MaxDelivery, cfg.MaxProcessor, cfg.MaxEmergency = 4, 50, 1
	s := newSim(t, cfg)
	for u := 1; u <= 6; u++ {
		s.submit(fmt.Sprintf("u%d", u), 500, 50)
	}
	s.run(30*time.Minute, time.Second)
	for u := 1; u <= 6; u++ {
		t.Logf("u%d: %s of transfer slot-time", u, s.slotTime[fmt.Sprintf("u%d", u)])
	}
	for u := 1; u <= 6; u++ {
		// 5 slots (4 and the emergency one) for 30 minutes among 6
		// equal shares: 25 minutes each.
		if got := s.slotTime[fmt.Sprintf("u%d", u)]; got < 20*time.Minute || got > 30*time.Minute {
			t.Errorf("share u%d (equal priority, work queued for 30 min) had %s of slot-time, want about 25m", u, got)
		}
	}
}

func TestSlotsAreSharedBetweenActiveShares(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.SharePriority = map[string]int{"a": 60, "b": 40}
	cfg.MaxDelivery = 5
	cfg.MaxEmergency = 1
	h := newHarness(t, cfg)
	for i := 0; i < 20; i++ {
		h.submit(newDTR(i, "a", ""), newDTR(i, "b", ""))
	}
	// Let everything reach the TRANSFER queue.
	for i := 0; i < 10; i++ {
		for _, g := range h.tick(time.Second) {
			if g.State != dtr.Transferring {
				h.answer(g, nil)
			}
		}
	}
	perShare := map[string]int{}
	for _, g := range h.running {
		if g.State == dtr.Transferring {
			perShare[g.DTR.Share]++
		}
	}
	if perShare["a"] != 3 || perShare["b"] != 2 {
		t.Fatalf("transferring per share = %v, want a:3 b:2", perShare)
	}
}

func TestEmergencySlotLetsAnIdleShareStart(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.MaxDelivery = 4
	cfg.MaxEmergency = 1
	h := newHarness(t, cfg)
	for i := 0; i < 10; i++ {
		h.submit(newDTR(i, "a", dtr.Download))
	}
	transfers := func() map[string]int {
		m := map[string]int{}
		for _, g := range h.running {
			if g.State == dtr.Transferring {
				m[g.DTR.Share]++
			}
		}
		return m
	}
	for i := 0; i < 10; i++ {
		for _, g := range h.tick(time.Second) {
			if g.State != dtr.Transferring {
				h.answer(g, nil)
			}
		}
	}
	if got := transfers(); got["a-download"] != 4 {
		t.Fatalf("a alone should fill all 4 slots, got %v", got)
	}
	// Uploads arrive while downloads hold every slot.
	h.submit(newDTR(1, "a", dtr.Upload), newDTR(2, "a", dtr.Upload))
	for i := 0; i < 5; i++ {
		for _, g := range h.tick(time.Second) {
			if g.State != dtr.Transferring {
				h.answer(g, nil)
			}
		}
	}
	got := transfers()
	if got["a-upload"] != 1 || got["a-download"] != 4 {
		t.Fatalf("after uploads arrive: %v, want 4 downloads and 1 upload on the emergency slot", got)
	}
	var emergency int
	for _, g := range h.running {
		if g.Emergency {
			emergency++
		}
	}
	if emergency != 1 {
		t.Fatalf("%d emergency grants, want 1", emergency)
	}
}

func TestGrantIDsAreTheDTRIDAndACounter(t *testing.T) {
	id := uuid.MustParse("6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42")
	if got := grantID(id, 12); got != id.String()+".12" {
		t.Fatalf("grantID = %q", got)
	}
}
