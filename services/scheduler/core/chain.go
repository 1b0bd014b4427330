package core

// Chained grants: a QUERY_REPLICA grant that also holds the DTR's
// PRE_CLEAN slot, so that one worker does both cheap steps of
// pre-processing under one grant message and sends one result, while each
// step's slot is still charged from the grant on.
//
// A chained grant's DTR is marked Chained (in its record, so a restarted
// scheduler or a standby holds the slot again: Restore). The mark and the
// PRE_CLEAN slot go together: reserve sets both, and the slot is given up
// exactly once, by unreserve (a result without the PRE_CLEAN outcome, a
// grant given back or whose lease ran out, a cancel, Forget), or becomes
// the DTR's PRE_CLEAN grant when its result carries that step's outcome
// (takeReserved). A result of a grant that is no longer the DTR's is
// refused before any of this, so a redelivered or late result frees and
// applies nothing.

import (
	"cmp"
	"slices"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// mayChain reports whether the QUERY_REPLICA grant about to be given to d
// may hold a PRE_CLEAN slot too: chaining is on, the DTR goes to PRE_CLEAN
// after a successful query (no failure, not cancelled: route), and
// PRE_CLEAN can take it now without overtaking anyone: a free slot under
// its limit (never an emergency slot) and no DTR of any share waiting
// there. With nothing waiting and a free slot, every share's demand in
// PRE_CLEAN fits in its limit, so the split gives each share its demand:
// the DTR's share is allowed the slot it would be granted if it queued
// (admit is asked too, for a state whose grants pin).
func (c *Core) mayChain(d *dtr.DTR) bool {
	if !c.cfg.ChainPreClean || d.Error != nil || d.Cancel {
		return false
	}
	st := c.states[dtr.PreClean]
	if st.total >= c.Limit(dtr.PreClean) || st.waiting() > 0 {
		return false
	}
	if ss, ok := st.shares[d.Share]; ok && !c.admit(dtr.PreClean, ss) {
		return false
	}
	return true
}

// reserve holds a PRE_CLEAN slot for e, which is being granted
// QUERY_REPLICA: it counts in PRE_CLEAN's total and in its share's running
// there from now, as a grant would.
func (c *Core) reserve(now time.Time, e *entry) {
	st := c.states[dtr.PreClean]
	ss := c.shareIn(st, e.d.Share)
	ss.accrue(now) // the share's slot-time up to now, before it holds one more
	ss.running++
	ss.reserved++
	st.total++
	e.d.Chained = true
}

// unreserve gives up the PRE_CLEAN slot e's chained grant holds, if it
// holds one; at a zero now (Forget) the share's slot-time is not brought
// up to date, as Forget charges nothing.
func (c *Core) unreserve(now time.Time, e *entry) {
	d := e.d
	if d == nil || !d.Chained {
		return
	}
	d.Chained = false
	st := c.states[dtr.PreClean]
	ss, ok := st.shares[d.Share]
	if !ok {
		panic("core: a chained grant's PRE_CLEAN share is gone") // reserve keeps it
	}
	if !now.IsZero() {
		ss.accrue(now)
	}
	ss.running--
	ss.reserved--
	st.total--
	st.drop(ss)
	c.markDirty(e)
}

// takeReserved makes the PRE_CLEAN slot e's chained grant held its
// PRE_CLEAN grant: e, which its query's result has just brought to
// PRE_CLEAN, moves to PRE_CLEANING under the grant id its worker did the
// step under (the next after the query's), without queueing. The slot
// counts as held since granted, the chained grant's time: so it was.
func (c *Core) takeReserved(now time.Time, e *entry, granted int64) {
	d := e.d
	d.Chained = false
	st := c.states[dtr.PreClean]
	e.share = c.shareIn(st, d.Share) // held by the reservation
	e.share.reserved--               // a grant of its own now
	e.queued = dtr.PreClean
	c.must(d.Transition(dtr.PreCleaning, now))
	d.Grant = nextGrant(d)
	d.Cleanup = false
	c.setLease(e, c.nanos(now.Add(c.cfg.Lease)))
	e.granted = granted
	c.count.Grants++
	c.active[d.ID] = e
	c.out.Chained = append(c.out.Chained, c.grantOf(e))
	c.markDirty(e)
}

// chainedResult applies the PRE_CLEAN outcome a chained grant's result
// carries, if the DTR can take it: e holds the PRE_CLEAN slot, its query
// has just brought it to REPLICA_QUERIED with no failure and no cancel,
// and the outcome is under the grant id the chained grant named. It
// reports whether it did; if not, the caller gives the slot up and routes
// the DTR as after any query.
func (c *Core) chainedResult(now time.Time, e *entry, r Result, granted int64) (bool, error) {
	d := e.d
	then := r.Then
	if then == nil || !d.Chained || d.State != dtr.ReplicaQueried || d.Error != nil || d.Cancel ||
		then.Grant != nextGrant(d) || then.Then != nil {
		return false, nil
	}
	c.must(d.Transition(dtr.PreClean, now))
	c.takeReserved(now, e, granted)
	next := *then
	next.DTR, next.Stage = d.ID, r.Stage
	return true, c.result(now, next, true)
}

// reclaimReservations gives the PRE_CLEAN slots that chained grants hold
// back to DTRs waiting in PRE_CLEAN when no slot is free for them: a
// reservation is taken when nothing waits, and a DTR whose query ended
// meanwhile must not wait behind a chained query still running. The
// latest reservations are taken back first; their grants' PRE_CLEAN
// outcomes are then ignored (chainedResult) and their DTRs queue for
// PRE_CLEAN as after any query. Runs before PRE_CLEAN's slots are granted.
func (c *Core) reclaimReservations(now time.Time) {
	st := c.states[dtr.PreClean]
	need := st.waiting() - st.unread() - max(c.Limit(dtr.PreClean)-st.total, 0) // the unread cannot be granted yet
	if need <= 0 {
		return
	}
	reserved := 0
	for _, ss := range st.order {
		reserved += ss.reserved
	}
	if reserved == 0 {
		return
	}
	var held []*entry
	for _, e := range c.active {
		if e.d.Chained {
			held = append(held, e)
		}
	}
	// The latest first; of equal times, by id, so that the core decides
	// the same way each run.
	slices.SortFunc(held, func(a, b *entry) int {
		if n := cmp.Compare(b.granted, a.granted); n != 0 {
			return n
		}
		return slices.Compare(a.d.ID[:], b.d.ID[:])
	})
	for _, e := range held[:min(need, len(held))] {
		c.unreserve(now, e)
	}
}
