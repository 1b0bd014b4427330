package core

// Paying back the first wave. The split says how many slots each share may
// hold, but a slot is only handed on when its grant ends: a share that had
// the state to itself holds every slot when another share arrives, and
// gives them up one by one as its transfers end. The slot-time it took
// above its quota in that time is what the deficit records (negative for
// it, positive for the newcomer). Leftover slots alone cannot pay that
// back (20/80 on 10 slots has none), so whole slots move too: while a
// share is owed at least half of one of its grants in slot-time, it may
// hold one slot more for each grant's worth it is owed (up to its part
// twice over and one slot more), taken from a share that has had as much
// too much, until the slot-time each share had since both had work is its
// quota's.
//
// Nothing running is stopped: a moved slot changes hands when the
// over-served share's next grant ends. Every active share keeps at least
// one slot (and its owned minimum), and slots move only inside a tier.
//
// A share below its part because its DTRs wait for a full endpoint is not
// owed for that (markHeld): the others take its slots, and its unused
// quota with them, so nobody banks or owes slot-time a limit withheld.

import (
	"fmt"
	"slices"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// holdWeight is the weight of a new sample in the running mean of how long
// a state's grants hold their slot.
const holdWeight = 1.0 / 8

// minHold bounds the mean hold from below, so that instant grants (a
// processing step that takes no measurable time) do not make one grant's
// worth of slot-time zero.
const minHold = 0.001

// deficitCapHolds is how many turnovers of all a state's slots a share may
// be owed, or owe, at most: a share whose DTRs could not run (a full
// endpoint, maxprepared) banks no more than that, so paying it back never
// holds the others down to one slot for long. The first wave costs at most
// one turnover.
const deficitCapHolds = 2

// slotHold is the running mean of how long a state's grants held their
// slot, in seconds: 0 until one has ended.
type slotHold struct{ hold float64 }

// observe adds a grant that held its slot for held.
func (h *slotHold) observe(held time.Duration) {
	s := max(held.Seconds(), minHold)
	if h.hold == 0 {
		h.hold = s
		return
	}
	h.hold += (s - h.hold) * holdWeight
}

// maxAccrueGap is the longest time accrue counts at once: a longer one is a
// pause (a scheduler stopped, a clock that jumped), in which nothing was
// learned, as account skips a pause between ticks.
const maxAccrueGap = 60 * time.Second

// heldBack is what a share's deficit accrues against besides its quota
// while some share of its state cannot use its part.
type heldBack struct {
	// held: at the last tick the share was below its part of the split
	// and none of the DTRs it has queued could start for a full endpoint
	// (MaxPerHost, an activity limit). Its unused part is not owed to it.
	held bool
	// passedOn is the part of the held shares' quotas that this share may
	// use without owing it (it takes their unused slots).
	passedOn float64
}

// accrue adds to a share's deficit what its exact quota entitled it to
// since its deficit was last brought up to date, less the slots it held:
// at every tick, and also when one of its grants ends, so that the slots
// are counted for the time they were held, not as they stand at the next
// tick. A held share is entitled to no more than it runs (a full endpoint,
// not the other shares, kept it below its part); the others are entitled
// to what it passed on. A gap of more than maxAccrueGap is not counted; a
// time before the last one counted changes nothing.
//
// Forget (a standby copy following the journal) frees a slot without a
// clock: the slot counts as freed when the deficit was last brought up to
// date, the last tick or grant end, which is what accrue at Forget would
// give as well.
func (ss *shareState) accrue(now time.Time) {
	gap := now.Sub(ss.since)
	if ss.since.IsZero() || gap > maxAccrueGap {
		ss.since = now
		return
	}
	if gap <= 0 {
		return
	}
	due := ss.quota + ss.passedOn
	if ss.held {
		due = min(ss.quota, float64(ss.running))
	}
	ss.deficit += (due - float64(ss.running)) * gap.Seconds()
	ss.since = now
}

// markHeld notes, at a tick of state s once its grants are made, the shares below
// their part of the split (slots) none of whose first DTRs could start for
// a full endpoint, and passes the part of their quotas they cannot use on
// to the other shares with work, in proportion to their quotas and up to
// their demand. Without that, a share whose endpoint is full would bank
// slot-time while another took its slots, and be paid it back when the
// endpoint frees.
func (c *Core) markHeld(s dtr.State, st *stateQueues, slots []int) {
	limited := classOf(s).PerHost && (c.hosts.limited() || c.activityLoad.limited())
	spare, rest := 0.0, 0.0
	for i, ss := range st.order {
		ss.held, ss.passedOn = false, 0
		if limited && ss.running < slots[i] && ss.q.Len()+ss.parkedN > 0 && !c.canStart(s, ss) {
			ss.held = true
			spare += ss.quota - min(ss.quota, float64(ss.running))
		} else if i < len(st.demand) && st.demand[i].Demand > 0 {
			rest += ss.quota
		}
	}
	if spare == 0 || rest == 0 {
		return
	}
	for i, ss := range st.order {
		if !ss.held && i < len(st.demand) && st.demand[i].Demand > 0 {
			ss.passedOn = min(spare*ss.quota/rest, max(float64(st.demand[i].Demand)-ss.quota, 0))
		}
	}
}

// canStart tells whether one of the first DTRs a share has queued in s
// may start now (dequeue would return one), leaving the queue as it was.
func (c *Core) canStart(s dtr.State, ss *shareState) bool {
	clock := ss.q.clock
	defer func() { ss.q.clock = clock }()
	e := c.dequeue(s, ss)
	if e == nil {
		return false
	}
	ss.q.readd(e)
	return true
}

// capDeficits bounds every share's deficit to deficitCapHolds turnovers of
// the state's n slots, once the mean hold is known (before any grant has
// ended, the time since the first grants is the bound).
func (st *stateQueues) capDeficits(n int) {
	if st.hold == 0 {
		return
	}
	limit := deficitCapHolds * float64(max(n, 1)) * st.hold
	for _, ss := range st.order {
		ss.deficit = max(-limit, min(limit, ss.deficit))
	}
}

// holdOf returns how long a grant of the i-th share of the state (in
// st.order) holds its slot, in seconds: the share's own mean once one of
// its grants has ended, else the state's, 0 if no grant has ended yet.
func (st *stateQueues) holdOf(i int) float64 {
	if h := st.order[i].hold; h > 0 {
		return h
	}
	return st.hold
}

// payback moves whole slots of alloc (a split of the state, indexed like
// shares, deficit and exact) from the shares that have had more than their
// exact quota to the ones owed slot-time, one grant's worth per slot (hold
// gives the seconds a grant of each share holds its slot; 0: not known).
// A share is projected to be owed its deficit less what its grants above
// its quota will still take (half a grant each, on average); a slot moves
// while one share is projected to be owed at least half of one of its
// grants and another to owe as much. Inside each tier; a donor keeps its
// minimum (one slot, or its owned slots) and a recipient gets at most its
// part of the split twice over and one slot more, and never more than its
// demand.
// It returns how many slots each share gave up (nil if none moved).
func payback(alloc []int, shares []ShareDemand, deficit, exact []float64, hold func(int) float64) (gave []int) {
	if deficit == nil {
		return nil
	}
	var projected []float64
	for i, s := range shares {
		if s.Demand > 0 && deficit[i] != 0 && hold(i) > 0 {
			projected = make([]float64, len(shares))
			break
		}
	}
	if projected == nil {
		return nil
	}
	for i, s := range shares {
		projected[i] = deficit[i] - max(float64(s.Running)-exact[i], 0)*hold(i)/2
	}
	lo := func(i int) int { return max(1, min(shares[i].Min, shares[i].Demand)) }
	// A recipient holds at most its part twice over and one slot more: a
	// bound on what a share owed much gets at once. One slot more than its
	// part pays back too slowly where many shares churn the leftovers:
	// twelve shares on 200 slots (sluice simulate --scale-example) left the
	// smallest 0.65 point short of its part with that bound (also with the
	// shares owed most served first), 0.02 point with this one.
	most := make([]int, len(shares))
	for i := range shares {
		most[i] = 2*alloc[i] + 1
	}
	// A share that received a slot gives none and the other way round, so
	// that slots never go back and forth (each share's hold differs).
	const gaveOne, gotOne = 1, 2
	role := make([]int8, len(shares))
	var done []int // the tiers done: few
	for _, s := range shares {
		tier := s.Tier
		if s.Demand == 0 || slices.Contains(done, tier) {
			continue
		}
		done = append(done, tier)
		for {
			owed := -1
			for i, s := range shares {
				if s.Demand == 0 || s.Tier != tier || hold(i) <= 0 || role[i] == gaveOne {
					continue
				}
				if alloc[i] < min(s.Demand, most[i]) && projected[i] >= hold(i)/2 && (owed < 0 || projected[i] > projected[owed]) {
					owed = i
				}
			}
			if owed < 0 {
				break
			}
			// The slot moves for one of the recipient's grants: that much
			// slot-time goes from the donor to it.
			h, owes := hold(owed), -1
			for i, s := range shares {
				if s.Demand == 0 || s.Tier != tier || role[i] == gotOne {
					continue
				}
				if alloc[i] > lo(i) && projected[i] <= -h/2 && (owes < 0 || projected[i] < projected[owes]) {
					owes = i
				}
			}
			if owes < 0 {
				break
			}
			if gave == nil {
				gave = make([]int, len(shares))
			}
			alloc[owed]++
			alloc[owes]--
			gave[owes]++
			role[owed], role[owes] = gotOne, gaveOne
			projected[owed] -= h
			projected[owes] += h
		}
	}
	return gave
}

// paybackNote explains, for sluice why, a share's slots below its part of
// the split (part, exact) when payback took gave of them to pay back the
// slot-time it had above its part (deficit, negative): "" if it took none.
func paybackNote(gave int, part, deficit float64) string {
	if gave <= 0 || deficit >= 0 {
		return ""
	}
	return fmt.Sprintf(" (its part is %.1f: it holds %d fewer while it pays back the %.0f s of slot-time it had above its part)", part, gave, -deficit)
}

// observeHold adds how long an active DTR's grant held its slot to the
// means of its state and share: only for a grant that completed (a
// worker's result), not one whose lease expired or that was given back,
// whose time says nothing of how long a transfer takes.
func (c *Core) observeHold(now time.Time, e *entry) {
	held := now.Sub(c.when(e.granted))
	c.states[e.queued].observe(held)
	e.share.observe(held)
}
