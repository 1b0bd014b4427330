package core

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// heldConfig makes every transfer from full.example wait behind one
// running: by an activity limit, or by MaxPerHost.
func heldConfigs() map[string]Config {
	byActivity := activitySplitConfig("", nil)
	byActivity.SharePolicy = PolicyNone
	byActivity.MaxDelivery = 10
	byActivity.ActivityLimits = []ActivityLimit{{Activity: "Held", Source: "full.example", Max: 1}}
	byHost := byActivity
	byHost.ActivityLimits = nil
	byHost.MaxPerHost = 1
	return map[string]Config{"activity limit": byActivity, "max per host": byHost}
}

// submitHeldThenRunnable queues 100 transfers from full.example, then 20
// from elsewhere, all in one share; it returns the first 100.
func (h *harness) submitHeldThenRunnable() []*dtr.DTR {
	var held []*dtr.DTR
	for i := range 100 {
		d := limitDTR(i, "Held", "full.example", "")
		held = append(held, d)
		h.submit(d)
	}
	for i := range 20 {
		h.submit(limitDTR(1000+i, "Held", "other"+string(rune('a'+i))+".example", ""))
	}
	return held
}

func (h *harness) waitingIn(s dtr.State) (ids []uuid.UUID) {
	for _, d := range h.c.DTRs() {
		if d.State == s {
			ids = append(ids, d.ID)
		}
	}
	return ids
}

func TestHeldDTRsDoNotKeepTheOnesBehindThemFromStarting(t *testing.T) {
	for name, cfg := range heldConfigs() {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, cfg)
			held := h.submitHeldThenRunnable()
			h.runToTransfer()
			if busy := len(h.transfersByShareList()); busy != 10 {
				t.Fatalf("%d of 10 slots busy, want all: 1 from full.example and 9 from elsewhere", busy)
			}
			if n := h.transfersBy("full.example"); n != 1 {
				t.Fatalf("%d transfers from full.example, want 1", n)
			}
			w, err := h.c.Explain(h.now, held[99].ID)
			if err != nil || !strings.Contains(w.Reason, "full.example") || w.Queued < 99 {
				t.Fatalf("why of a held DTR: %+v, %v; want the hold at full.example and 99+ queued", w, err)
			}
			// The one from full.example ends: the next held one starts, the
			// first in queue order.
			for _, g := range h.transfersByShareList() {
				if strings.Contains(g.DTR.Source, "full.example") {
					h.answer(g, nil)
				}
			}
			h.tick(time.Second)
			var started *Grant
			for _, g := range h.transfersByShareList() {
				if strings.Contains(g.DTR.Source, "full.example") {
					started = &g
				}
			}
			if started == nil || started.DTR.ID != held[1].ID {
				t.Fatalf("after the first ended, started %+v; want the second held DTR", started)
			}
		})
	}
}

func TestAParkedDTRCanBeCancelledReprioritisedAndRestored(t *testing.T) {
	for name, cfg := range heldConfigs() {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, cfg)
			held := h.submitHeldThenRunnable()
			h.runToTransfer()
			before := len(h.waitingIn(dtr.Transfer))
			// Cancel one parked.
			if err := h.c.Cancel(h.now, held[50].ID); err != nil {
				t.Fatal(err)
			}
			h.tick(time.Second)
			if n := len(h.waitingIn(dtr.Transfer)); n != before-1 {
				t.Fatalf("%d waiting after cancelling a parked DTR, want %d", n, before-1)
			}
			for _, id := range h.waitingIn(dtr.Transfer) {
				if id == held[50].ID {
					t.Fatal("the cancelled DTR still waits in TRANSFER")
				}
			}
			// Raise the last one's priority: it goes next at full.example.
			if err := h.c.SetPriority(h.now, held[99].ID, 100); err != nil {
				t.Fatal(err)
			}
			// Forget another.
			if !h.c.Forget(held[60].ID) {
				t.Fatal("Forget of a parked DTR")
			}
			// Restart: a restored core parks the held DTRs again.
			h2 := newHarness(t, cfg)
			h2.now = h.now
			for _, e := range h.c.dtrs {
				cp := *h.c.peekEntry(e)
				if err := h2.c.Restore(h.now, &cp); err != nil {
					t.Fatal(err)
				}
			}
			for id, g := range h.running {
				h2.running[id] = g
			}
			for _, hh := range []*harness{h, h2} {
				for _, g := range hh.transfersByShareList() {
					if strings.Contains(g.DTR.Source, "full.example") {
						hh.answer(g, nil)
					}
				}
				hh.tick(time.Second)
				var next uuid.UUID
				for _, g := range hh.collectRunning() {
					if strings.Contains(g.DTR.Source, "full.example") {
						next = g.DTR.ID
					}
				}
				if next != held[99].ID {
					t.Fatalf("next from full.example %v, want the reprioritised %v", next, held[99].ID)
				}
			}
		})
	}
}

// collectRunning lists the running TRANSFER grants.
func (h *harness) collectRunning() []Grant { return h.transfersByShareList() }

func TestParkedDTRsAge(t *testing.T) {
	cfg := heldConfigs()["max per host"]
	cfg.AgeAfter, cfg.AgeEvery, cfg.AgeAfterState = time.Minute, time.Second, nil
	h := newHarness(t, cfg)
	hi := limitDTR(0, "Held", "full.example", "")
	hi.Priority = 90
	lo := limitDTR(1, "Held", "full.example", "")
	lo.Priority = 10
	blocker := limitDTR(2, "Held", "full.example", "")
	blocker.Priority = 100
	h.submit(blocker, hi, lo)
	h.runToTransfer()
	for range 200 {
		h.tick(time.Second)
	}
	for _, d := range h.c.DTRs() {
		if d.ID == lo.ID && d.Priority <= 10 {
			t.Fatalf("a parked DTR's priority stayed %d after minutes of waiting", d.Priority)
		}
	}
}

// sampleRecorder keeps every sample a link's controller is given, and
// keeps the limit where it is.
type sampleRecorder struct{ samples *[]LinkSample }

func (r sampleRecorder) Decide(s LinkSample) LinkDecision {
	*r.samples = append(*r.samples, s)
	return LinkDecision{Limit: s.Limit, Reason: "recorded"}
}

func TestALinkWithParkedDTRsStaysWanted(t *testing.T) {
	var samples []LinkSample
	cfg := DefaultConfig()
	cfg.MaxDelivery, cfg.MaxEmergency = 10, 0
	cfg.Optimizer = DefaultOptimizerConfig()
	cfg.Optimizer.Start = 2
	cfg.Optimizer.Controller = func(OptimizerConfig) LinkController { return sampleRecorder{&samples} }
	h := newHarness(t, cfg)
	for i := range 10 {
		h.submit(hostDTR(i, "alice", "one.example"))
	}
	h.runToTransfer()
	if n := h.transfersBy("one.example"); n != 2 {
		t.Fatalf("%d transfers on a link at 2, want 2", n)
	}
	// Nothing ends for a minute: the parked DTRs are not looked at again,
	// yet every interval's sample says DTRs waited for the link.
	for range 60 {
		h.tick(time.Second)
	}
	if len(samples) < 3 {
		t.Fatalf("%d samples in a minute of 10 s intervals", len(samples))
	}
	for i, s := range samples {
		if !s.Waiting {
			t.Fatalf("sample %d of %d: the link with 8 parked DTRs was not wanted", i+1, len(samples))
		}
	}
}

// TestNoTransferSlotIdlesWhileADTRCouldStart runs random work through
// per-host and activity limits, ending, cancelling and reprioritising
// transfers, and checks after every tick that a TRANSFER slot is free only
// when every DTR waiting for one is held, and that the parked DTRs are
// all counted.
func TestNoTransferSlotIdlesWhileADTRCouldStart(t *testing.T) {
	for _, optimizer := range []bool{false, true} {
		for _, seed := range []uint64{1, 2, 3, 12345} {
			t.Run(fmt.Sprint("optimizer ", optimizer, " seed ", seed), func(t *testing.T) { checkNoSlotIdles(t, seed, optimizer) })
		}
	}
}

func checkNoSlotIdles(t *testing.T, seed uint64, optimizer bool) {
	cfg := activitySplitConfig("", nil)
	cfg.SharePolicy = PolicyDN
	cfg.MaxDelivery, cfg.MaxPerHost = 6, 3
	cfg.ActivityLimits = []ActivityLimit{{Activity: "Held", Destination: AnyEndpoint, Max: 1}}
	if optimizer {
		cfg.Optimizer = DefaultOptimizerConfig()
		cfg.Optimizer.Start, cfg.Optimizer.Min = 1, 1
	}
	h := newHarness(t, cfg)
	rng := seed
	next := func(n int) int { rng = rng*6364136223846793005 + 1442695040888963407; return int(rng>>33) % n }
	hosts := []string{"a.example", "b.example", "c.example", "d.example"}
	acts := []string{"Held", "Held", "Held", "Other"}
	id, checked := 0, 0
	for round := range 300 {
		for range next(5) {
			id++
			d := limitDTR(id, acts[next(4)], hosts[next(4)], hosts[next(4)])
			d.Owner.DN = []string{"alice", "bob", "carol"}[next(3)]
			h.submit(d)
		}
		h.tick(time.Second)
		for _, g := range h.running {
			if g.State != dtr.Transferring {
				h.answer(g, nil)
			}
		}
		for _, g := range h.transfersByShareList() {
			switch next(8) {
			case 0, 1:
				h.answer(g, nil)
			case 2: // tried again later
				h.answer(g, &dtr.Failure{Kind: dtr.ErrTemporaryRemote, State: dtr.Transferring, Text: "503"})
			}
		}
		if back := h.queuedNotParked(); len(back) > 1 && next(6) == 0 {
			// Several DTRs put back for places leave at once.
			for _, id := range back {
				_ = h.c.Cancel(h.now, id)
			}
		}
		if queued := h.waitingIn(dtr.Transfer); len(queued) > 0 && next(5) == 0 {
			// Forgotten and restored, as a record moved between cores.
			id := queued[next(len(queued))]
			for _, d := range h.c.DTRs() {
				if d.ID == id {
					if !h.c.Forget(id) {
						t.Fatalf("round %d: %s not forgotten", round, id)
					}
					if err := h.c.Restore(h.now, &d); err != nil {
						t.Fatalf("round %d: restore %s: %v", round, id, err)
					}
				}
			}
		}
		if queued := h.waitingIn(dtr.Transfer); len(queued) > 0 && next(5) == 0 {
			pick := queued[next(len(queued))]
			if next(2) == 0 {
				_ = h.c.Cancel(h.now, pick)
			} else {
				_ = h.c.SetPriority(h.now, pick, 1+next(100))
			}
		}
		h.tick(time.Second)
		st := h.c.states[dtr.Transfer]
		parked := 0
		for _, ss := range st.order {
			n := 0
			for _, p := range ss.parked {
				n += p.Len()
				for _, e := range p.items {
					if e.park != p {
						t.Fatalf("round %d: an entry in a park does not point at it", round)
					}
				}
			}
			if n != ss.parkedN {
				t.Fatalf("round %d: share %s counts %d parked, holds %d", round, ss.name, ss.parkedN, n)
			}
			parked += n
		}
		if st.total >= h.c.Limit(dtr.Transfer) {
			continue
		}
		if parked > 0 {
			checked++
		}
		for k := range h.c.holds {
			if !h.c.full(k) {
				t.Fatalf("round %d: %d of %d slots busy, yet hold %+v has room and DTRs parked under it",
					round, st.total, h.c.Limit(dtr.Transfer), k)
			}
		}
		for _, ss := range st.order {
			for _, e := range append(slices.Clone(ss.q.items), parkedItems(ss)...) {
				_, heldByActivity := h.c.activityLoad.full(e)
				if h.c.hosts.blocked(e) == 0 && !heldByActivity {
					t.Fatalf("round %d: %d of %d slots busy, yet %s waits with nothing holding it (parked %v)",
						round, st.total, h.c.Limit(dtr.Transfer), h.c.peekEntry(e).ID, e.park != nil)
				}
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d rounds had free slots and parked DTRs: the test checks too little", checked)
	}
}

func parkedItems(ss *shareState) []*entry {
	var es []*entry
	for _, p := range ss.parked {
		es = append(es, p.items...)
	}
	return es
}

// serveTransfers ticks the core n times; each tick it answers every
// pre- and post-processing grant and every transfer from an endpoint
// ends says ends, and counts the transfers granted from host by owner.
func (h *harness) serveTransfers(n int, host string, ends func(Grant) bool) map[string]int {
	got := map[string]int{}
	for range n {
		for _, g := range h.tick(time.Second) {
			if g.State == dtr.Transferring && strings.Contains(g.DTR.Source, "//"+host+"/") {
				got[g.DTR.Owner.DN]++
			}
		}
		for _, g := range h.running {
			if g.State != dtr.Transferring || ends(g) {
				h.answer(g, nil)
			}
		}
	}
	return got
}

// TestEveryShareAtAContestedEndpointGetsItsTurn: two shares of equal
// weight wait for the one place at a slow endpoint, a third runs
// elsewhere; each place freed goes to them in turn, not always to the
// first by name.
func TestEveryShareAtAContestedEndpointGetsItsTurn(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.MaxDelivery, cfg.MaxEmergency, cfg.MaxPerHost, cfg.MaxProcessor = 10, 0, 1, 1000
	h := newHarness(t, cfg)
	for i := range 300 {
		h.submit(hostDTR(i, "a", "slow.example"), hostDTR(i, "b", "fast.example"), hostDTR(i, "c", "slow.example"))
	}
	got := h.serveTransfers(200, "slow.example", func(Grant) bool { return true })
	total := got["a"] + got["c"]
	t.Logf("places at slow.example in 200 ticks: a %d, c %d", got["a"], got["c"])
	if total < 150 {
		t.Fatalf("%d transfers from slow.example in 200 ticks, want about one a tick", total)
	}
	for _, share := range []string{"a", "c"} {
		if got[share] < total*2/5 {
			t.Errorf("share %s got %d of the %d places at slow.example (a %d, c %d), want about half",
				share, got[share], total, got["a"], got["c"])
		}
	}
}

// TestPlacesAtAnEndpointGoRoundManyShares: many more shares than places
// at one endpoint; the places go round all of them, none gets a second
// before every other has had a first.
func TestPlacesAtAnEndpointGoRoundManyShares(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.MaxDelivery, cfg.MaxEmergency, cfg.MaxPerHost, cfg.MaxProcessor = 10, 0, 5, 10000
	h := newHarness(t, cfg)
	const shares = 200
	for i := range 3 {
		for u := range shares {
			h.submit(hostDTR(i, fmt.Sprintf("u%04d", u), "one.example"))
		}
	}
	// 30 ticks of 5 places: 150 grants, fewer than the shares.
	got := h.serveTransfers(30, "one.example", func(Grant) bool { return true })
	total := 0
	for share, n := range got {
		total += n
		if n > 1 {
			t.Errorf("share %s got %d places while others had none", share, n)
		}
	}
	if total < 100 {
		t.Fatalf("%d transfers in 30 ticks at 5 places", total)
	}
}

// queuedNotParked counts the DTRs waiting in TRANSFER share queues, not
// parked.
func (h *harness) queuedNotParked() []uuid.UUID {
	var ids []uuid.UUID
	for _, ss := range h.c.states[dtr.Transfer].order {
		for _, e := range ss.q.items {
			ids = append(ids, h.c.peekEntry(e).ID)
		}
	}
	return ids
}

// TestPlacesLeftByCancelledDTRsAreFilledAtTheNextTick: five transfers at
// a full endpoint end, and the five DTRs put back for their places are
// cancelled before they are granted; at the next tick all five places go
// to the DTRs parked behind them, not one a tick.
func TestPlacesLeftByCancelledDTRsAreFilledAtTheNextTick(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.MaxDelivery, cfg.MaxEmergency, cfg.MaxPerHost = 10, 0, 5
	h := newHarness(t, cfg)
	for i := range 30 {
		h.submit(hostDTR(i, "alice", "one.example"))
	}
	h.runToTransfer()
	if n := h.transfersBy("one.example"); n != 5 {
		t.Fatalf("%d transfers at one.example, want MaxPerHost 5", n)
	}
	for _, g := range h.transfersByShareList() {
		h.answer(g, nil)
	}
	back := h.queuedNotParked()
	if len(back) != 5 {
		t.Fatalf("%d DTRs put back for the 5 places freed, want 5", len(back))
	}
	for _, id := range back {
		if err := h.c.Cancel(h.now, id); err != nil {
			t.Fatal(err)
		}
	}
	h.tick(time.Second)
	if n := h.transfersBy("one.example"); n != 5 {
		t.Fatalf("%d transfers at one.example after the tick, want the 5 places filled", n)
	}
}

// raisableLimit is a link controller whose limit the test sets.
type raisableLimit struct{ limit *int }

func (r raisableLimit) Decide(LinkSample) LinkDecision {
	return LinkDecision{Limit: *r.limit, Reason: "set by the test"}
}

// TestARaisedLinkLimitPutsBackOnlyWhatFits: when the optimizer raises a
// link's limit from 2 to 5, the three new places are filled, and no more
// DTRs leave the link's park than it has room for (with every slot of the
// state busy, the rest stay parked rather than queued for a place).
func TestARaisedLinkLimitPutsBackOnlyWhatFits(t *testing.T) {
	limit := 2
	cfg := DefaultConfig()
	cfg.MaxDelivery, cfg.MaxEmergency = 5, 0
	cfg.Optimizer = DefaultOptimizerConfig()
	cfg.Optimizer.Start, cfg.Optimizer.Min = 2, 1
	cfg.Optimizer.Controller = func(OptimizerConfig) LinkController { return raisableLimit{&limit} }
	h := newHarness(t, cfg)
	for i := range 20 {
		h.submit(hostDTR(i, "alice", "one.example"))
	}
	h.runToTransfer()
	if n := h.transfersBy("one.example"); n != 2 {
		t.Fatalf("%d transfers on a link at 2, want 2", n)
	}
	limit = 5
	for range 11 {
		h.tick(time.Second)
	}
	if n := h.transfersBy("one.example"); n != 5 {
		t.Fatalf("%d transfers on the link raised to 5, want 5", n)
	}
	if q := h.queuedNotParked(); len(q) != 0 {
		t.Fatalf("%d DTRs taken out of the park with no place for them", len(q))
	}
}

// TestAShareWhoseDTRsAllParkBanksNothing: DTRs of a share arrive in
// TRANSFER while their endpoint is full and are all parked at the tick
// that sees them; the share, left with only parked DTRs, is held (it
// cannot use its part of the split), so it banks no slot-time to be paid
// back later.
func TestAShareWhoseDTRsAllParkBanksNothing(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.MaxDelivery, cfg.MaxEmergency, cfg.MaxPerHost = 10, 0, 1
	h := newHarness(t, cfg)
	h.submit(hostDTR(0, "a", "slow.example"))
	for i := range 40 {
		h.submit(hostDTR(i, "b", "fast.example"))
	}
	h.runToTransfer()
	var a *shareState
	for _, ss := range h.c.states[dtr.Transfer].order {
		if strings.HasPrefix(ss.name, "a") {
			a = ss
		}
	}
	if a == nil || a.running != 1 {
		t.Fatalf("share a: want its one transfer running, got %+v", a)
	}
	for i := 1; i < 6; i++ {
		h.submit(hostDTR(i, "a", "slow.example"))
	}
	sawParked := false
	for range 20 {
		before := a.deficit
		for _, g := range h.tick(time.Second) {
			if g.Stage == dtr.StagePre {
				h.answer(g, nil)
			}
		}
		if a.deficit > before+1e-9 {
			t.Fatalf("share a banked slot-time while all its waiting DTRs were parked: deficit %g → %g", before, a.deficit)
		}
		sawParked = sawParked || a.parkedN == 5
	}
	if !sawParked {
		t.Fatal("share a's five new DTRs never all parked")
	}
}

// lotteryARC is ARC's policy picking inside a share at random, each DTR
// with a chance in proportion to its priority.
type lotteryARC struct{ ARC }

func (lotteryARC) PickWeight(prio int) float64 { return float64(prio) }

// TestAReprioritisedParkedDTRKeepsItsPlaceInTheLottery: under a policy
// that draws lots, a parked DTR given a new priority is keyed from its
// share queue's clock, as a queued one is, so it does not jump ahead of
// the DTRs that waited in the queue while it was parked.
func TestAReprioritisedParkedDTRKeepsItsPlaceInTheLottery(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery, cfg.MaxEmergency, cfg.MaxPerHost, cfg.MaxProcessor = 10, 0, 5, 1000
	cfg.Policy = func(env PolicyEnv) Policy { return lotteryARC{ARC{env}} }
	h := newHarness(t, cfg)
	var slow []*dtr.DTR
	for i := range 20 {
		d := hostDTR(i, "a", "slow.example")
		slow = append(slow, d)
		h.submit(d)
	}
	for i := range 300 {
		h.submit(hostDTR(i, "a", "fast.example"))
	}
	h.serveTransfers(70, "fast.example", func(g Grant) bool { return strings.Contains(g.DTR.Source, "fast.example") })
	changed := 0
	for _, d := range slow {
		e := h.c.dtrs[d.ID]
		if e.park == nil {
			continue
		}
		if err := h.c.SetPriority(h.now, d.ID, 50); err != nil {
			t.Fatal(err)
		}
		changed++
		if e.key < e.share.q.clock {
			t.Fatalf("a parked DTR re-keyed at %g, before its share queue's clock %g", e.key, e.share.q.clock)
		}
	}
	if changed < 10 {
		t.Fatalf("only %d parked DTRs to reprioritise", changed)
	}
}
