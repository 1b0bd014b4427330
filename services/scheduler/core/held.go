package core

// What holds each unfinished DTR where it is, in a word: the same reasons
// Explain gives in a sentence, cheap enough to ask of every DTR at once
// (for the scheduler's history of each DTR and its stuck-DTR detector).

import (
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// Hold is what keeps a DTR where it is, in the order Explain looks.
type Hold string

const (
	// HoldRunning: a worker holds its grant.
	HoldRunning Hold = "running"
	// HoldRetry: it waits for the delay after a failed attempt.
	HoldRetry Hold = "retry_backoff"
	// HoldCache: it waits in CACHE_WAIT for another DTR's download of the
	// same file into the cache.
	HoldCache Hold = "cache_wait"
	// HoldRouting: it is in a completed state, to be routed on by the
	// scheduler's next step.
	HoldRouting Hold = "routing"
	// HoldEndpoint: a storage endpoint of it has MaxPerHost transfers
	// running.
	HoldEndpoint Hold = "endpoint_full"
	// HoldLink: its link (source to destination endpoint) has as many
	// transfers running as the optimizer's limit for it.
	HoldLink Hold = "link_full"
	// HoldActivity: an activity limit that covers it is full.
	HoldActivity Hold = "activity_full"
	// HoldMaxPrepared: its share holds MaxPrepared staged copies.
	HoldMaxPrepared Hold = "maxprepared"
	// HoldNoSlot: its share has no slot in the state under the split.
	HoldNoSlot Hold = "share_no_slot"
	// HoldStateFull: its share is due a slot but every one of the state's
	// is busy.
	HoldStateFull Hold = "state_full"
	// HoldShareFull: its share uses all its slots.
	HoldShareFull Hold = "share_full"
	// HoldFreeSlot: its share has a free slot; it starts at the next tick.
	HoldFreeSlot Hold = "free_slot"
)

// Waits says whether a DTR held so is legitimately waiting for something
// that will come (a slot, an endpoint, a staged copy, a delay, a
// download): such a DTR is not stuck however long it waits. A running
// DTR, one being routed and one with a free slot are expected to move on
// soon.
func (h Hold) Waits() bool {
	switch h {
	case HoldRetry, HoldCache, HoldEndpoint, HoldLink, HoldActivity, HoldMaxPrepared, HoldNoSlot, HoldStateFull, HoldShareFull:
		return true
	}
	return false
}

// Standing is where an unfinished DTR stands: its state, what holds it
// there, until when (a retry's or cache wait's end), and since when it is
// in its state (DTR.EnteredState: a change of priority, a reconfiguration
// or a cancel asked does not move it), given only when Hold does not wait
// or waits until a time (Until)
// (finding it may unpack a queued DTR's record).
type Standing struct {
	DTR   uuid.UUID
	State dtr.State
	Hold  Hold
	Until time.Time
	Since time.Time
	// Cacheable says the DTR goes through the cache (a NEW one may wait
	// long for a download by another).
	Cacheable bool
	// Grant is the grant it runs under, in an active state.
	Grant string
}

// Standings calls f with where every unfinished DTR stands, in no
// particular order. It changes nothing; the slot split of each state is
// worked out once.
func (c *Core) Standings(f func(Standing)) {
	sf := newStandingFinder(c)
	for id, e := range c.dtrs {
		f(sf.of(id, e))
	}
}

// StandingsOf calls f with where each of the DTRs ids stands, in their
// order, leaving out those it does not hold.
func (c *Core) StandingsOf(ids []uuid.UUID, f func(Standing)) {
	sf := newStandingFinder(c)
	for _, id := range ids {
		if e, ok := c.dtrs[id]; ok {
			f(sf.of(id, e))
		}
	}
}

// standingFinder finds where DTRs stand, with the slots of each share in
// each state worked out once.
type standingFinder struct {
	c      *Core
	splits map[dtr.State]map[*shareState]int
}

func newStandingFinder(c *Core) standingFinder {
	return standingFinder{c: c, splits: map[dtr.State]map[*shareState]int{}}
}

// slotsOf returns the slots of a share in a queue state under the split.
func (sf *standingFinder) slotsOf(st *stateQueues, ss *shareState) int {
	slots, ok := sf.splits[st.state]
	if !ok {
		alloc, _ := sf.c.shareSlots(st)
		slots = make(map[*shareState]int, len(alloc))
		for i, o := range st.order {
			slots[o] = alloc[i]
		}
		sf.splits[st.state] = slots
	}
	return slots[ss]
}

// of is where entry e of DTR id stands.
func (sf *standingFinder) of(id uuid.UUID, e *entry) Standing {
	c := sf.c
	s := Standing{DTR: id}
	queuedPacked := e.d == nil
	if queuedPacked {
		s.State = e.queued
	} else {
		s.State = e.d.State
	}
	switch {
	case !queuedPacked && s.State.IsActive():
		s.Hold, s.Grant = HoldRunning, e.d.Grant
	case !queuedPacked && !e.d.NextProcess.IsZero():
		s.Hold, s.Until = HoldRetry, e.d.NextProcess
		if s.State == dtr.CacheWait {
			s.Hold = HoldCache
		}
	case !s.State.IsQueue() || e.share == nil || e.index < 0 || e.queued != s.State || c.states[s.State] == nil:
		s.Hold = HoldRouting
	default:
		s.Hold = c.queuedHold(e, sf.slotsOf(c.states[s.State], e.share))
	}
	if !s.Hold.Waits() || !s.Until.IsZero() {
		d := c.peekEntry(e)
		s.Since, s.Cacheable = d.EnteredState(), c.cacheable(d)
	}
	return s
}

// parkedHolds says what holds a parked DTR, by the kind of its hold.
var parkedHolds = map[holdKind]Hold{holdHost: HoldEndpoint, holdLink: HoldLink, holdActivity: HoldActivity}

// queuedHold is what holds a DTR waiting in a queue whose share has slots
// of the state under the split: Explain's reasons, in its order.
func (c *Core) queuedHold(e *entry, slots int) Hold {
	st := c.states[e.queued]
	if e.park != nil { // parked: the hold it waits under
		return parkedHolds[e.park.hold.kind]
	}
	if classOf(e.queued).PerHost && c.hosts.limited() && c.hosts.full(e) != 0 {
		return HoldEndpoint
	}
	if classOf(e.queued).Pins && c.pins.full(c.shareOf(e), int(e.prio)) {
		return HoldMaxPrepared
	}
	switch free := slots - e.share.running; {
	case slots == 0:
		return HoldNoSlot
	case free > 0 && st.total >= c.Limit(e.queued):
		return HoldStateFull
	case free <= 0:
		return HoldShareFull
	}
	return HoldFreeSlot
}
