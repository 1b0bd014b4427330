package core

// Parking: a queued TRANSFER DTR that a full endpoint (MaxPerHost), a
// full link (the optimizer's limit) or a full activity limit holds is
// taken out of its share's queue and parked under that hold, so that a
// grant never looks past held DTRs to find one that may start: however
// many are held, the DTRs behind them start as soon as there are slots.
// When a grant under a hold ends (or a link's limit rises), as many
// parked DTRs as the hold has room for go back into their shares' queues,
// each in its old place (its priority and arrival order are kept): each
// place to the share under the hold running the fewest for its weight,
// then in turn (the share whose park waited longest since its last turn);
// if the hold is full again by the time one is taken, it parks again.
//
// A parked DTR is still its share's and its state's: it is counted as
// queued (sluice shares, why), cancelled, forgotten, re-prioritised and
// aged like any other, but it is no demand in the split while it cannot
// start, so that a share whose DTRs are all held claims no slot (as one
// held by maxprepared does not). Parking is not recorded: a restored core
// queues every DTR, and the first grants park the held ones again.

import (
	"cmp"
	"fmt"
	"math"
	"time"
)

// holdKind says what holds a parked DTR.
type holdKind uint8

const (
	holdHost     holdKind = iota + 1 // an endpoint at MaxPerHost: a
	holdLink                         // a link at its limit: a, b (source, destination endpoints)
	holdActivity                     // an activity limit (limit) full at endpoint a
)

// holdKey names one hold; endpoints are 1 + their number in the names
// table, as in entry.hosts. Another limit enforced in the TRANSFER
// dequeue needs only a kind of its own.
type holdKey struct {
	kind  holdKind
	a, b  uint32
	limit int32
}

// compareHolds orders holds, for a fixed order of iteration.
func compareHolds(x, y holdKey) int {
	return cmp.Or(cmp.Compare(x.kind, y.kind), cmp.Compare(x.a, y.a), cmp.Compare(x.b, y.b), cmp.Compare(x.limit, y.limit))
}

// parked holds a share's parked DTRs under one hold, in queue order (the
// hold is kept here rather than in every entry).
type parked struct {
	queue
	hold holdKey
	// since is the park clock when the park was made or last had a DTR
	// put back: the longest waiting gets the next place (roomAt).
	since uint64
}

// home returns the queue an entry waits in: its share's, or the one it is
// parked in. A park's clock keeps up with its share queue's, so that a
// parked DTR re-keyed (reprioritised, aged) under a policy that draws
// lots does not jump ahead of the share's DTRs when it is put back.
func (e *entry) home() *queue {
	if e.park != nil {
		e.park.clock = max(e.park.clock, e.share.q.clock)
		return &e.park.queue
	}
	return &e.share.q
}

// holdOf returns the hold that keeps e from starting now in TRANSFER, if
// any. A link at its limit is marked as wanted (the optimizer's signal).
func (c *Core) holdOf(e *entry) (holdKey, bool) {
	if c.hosts.limited() {
		switch h := c.hosts.full(e); h {
		case 0:
		case linkFull:
			return holdKey{kind: holdLink, a: e.hosts[0], b: e.hosts[1]}, true
		default:
			return holdKey{kind: holdHost, a: h}, true
		}
	}
	if c.activityLoad.limited() {
		if k, full := c.activityLoad.full(e); full {
			return holdKey{kind: holdActivity, a: k.endpoint, limit: k.limit}, true
		}
	}
	return holdKey{}, false
}

// park moves e, just taken from its share's queue, under hold k.
func (c *Core) park(k holdKey, e *entry) {
	ss := e.share
	if ss.parked == nil {
		ss.parked = map[holdKey]*parked{}
	}
	p := ss.parked[k]
	if p == nil {
		c.parkClock++
		p = &parked{queue: queue{draw: ss.q.draw, clock: ss.q.clock, due: math.MaxInt64}, hold: k, since: c.parkClock}
		ss.parked[k] = p
		if c.holds == nil {
			c.holds = map[holdKey]map[*shareState]struct{}{}
		}
		if c.holds[k] == nil {
			c.holds[k] = map[*shareState]struct{}{}
		}
		c.holds[k][ss] = struct{}{}
	}
	c.unmarkBack(e)
	p.readd(e)
	p.due = min(p.due, e.deadline)
	e.park = p
	ss.parkedN++
	c.settle(e)
}

// unparkedFrom notes that e left its park (taken back, cancelled or
// forgotten), forgetting the park when it is empty.
func (c *Core) unparkedFrom(e *entry) {
	ss, k := e.share, e.park.hold
	e.park = nil
	ss.parkedN--
	if p := ss.parked[k]; p != nil && p.Len() == 0 {
		delete(ss.parked, k)
		if len(ss.parked) == 0 {
			ss.parked = nil
		}
		delete(c.holds[k], ss)
		if len(c.holds[k]) == 0 {
			delete(c.holds, k)
		}
	}
}

// roomAt puts parked DTRs under hold k back in their shares' queues, as
// many as k has room for: a grant under k ended, a DTR put back earlier
// left without using the place, or k's limit rose. Each place goes to the
// share under k running the fewest for its weight, then to the one whose
// park has waited longest since it last had a DTR put back (a rotation,
// so that every share at a contested hold gets its turn, however many
// there are and whatever their names), then to the oldest head DTR.
func (c *Core) roomAt(k holdKey) {
	sharers := c.holds[k]
	// putBack counts the DTRs put back here as running, for the choice of
	// the next place, so that the places spread over the shares.
	var putBack map[*shareState]int
	for room := c.room(k) - c.backAt[k]; room > 0 && len(sharers) > 0; room-- {
		var best *shareState
		for ss := range sharers {
			if best == nil || putBackBefore(ss, best, putBack, k) {
				best = ss
			}
		}
		p := best.parked[k]
		e := p.popHead()
		c.parkClock++
		p.since = c.parkClock
		c.unparkedFrom(e)
		best.q.readd(e)
		best.q.due = min(best.q.due, e.deadline)
		c.markBack(k, e)
		if putBack == nil {
			putBack = map[*shareState]int{}
		}
		putBack[best]++
	}
}

// markBack notes that e was put back from hold k: until it is granted,
// parked again or leaves its queue, it holds one of k's places, so that
// k puts back no more DTRs than it has room for.
func (c *Core) markBack(k holdKey, e *entry) {
	if c.back == nil {
		c.back, c.backAt = map[*entry]holdKey{}, map[holdKey]int{}
	}
	c.back[e] = k
	c.backAt[k]++
}

// unmarkBack notes that e, if put back, is granted, parked again or gone.
func (c *Core) unmarkBack(e *entry) {
	if len(c.back) == 0 {
		return
	}
	k, ok := c.back[e]
	if !ok {
		return
	}
	delete(c.back, e)
	if c.backAt[k]--; c.backAt[k] <= 0 {
		delete(c.backAt, k)
	}
}

// putBackBefore tells whether a place at hold k goes to share x before
// share y (roomAt).
func putBackBefore(x, y *shareState, putBack map[*shareState]int, k holdKey) bool {
	rx, ry := (x.running+putBack[x])*max(y.prio, 1), (y.running+putBack[y])*max(x.prio, 1)
	if rx != ry {
		return rx < ry
	}
	px, py := x.parked[k], y.parked[k]
	if px.since != py.since {
		return px.since < py.since
	}
	if hx, hy := px.head(), py.head(); hx != hy {
		return hx.cameBefore(hy)
	}
	return x.name < y.name
}

// room returns how many more grants hold k takes.
func (c *Core) room(k holdKey) int {
	switch k.kind {
	case holdHost:
		if c.hosts.max <= 0 {
			return math.MaxInt
		}
		return c.hosts.max - c.hosts.running[k.a]
	case holdLink:
		l := c.links.links[linkKey{k.a, k.b}]
		if l == nil {
			return math.MaxInt
		}
		return l.limit - l.running
	case holdActivity:
		return c.activityLoad.limits[k.limit].Max - c.activityLoad.running[activityKey{limit: k.limit, endpoint: k.a}]
	}
	return math.MaxInt
}

// keysOf returns the holds a TRANSFER DTR counts under: its endpoints,
// its link, and each activity limit that covers it.
func (c *Core) keysOf(e *entry) []holdKey {
	var ks []holdKey
	for _, h := range e.hosts {
		if h != 0 {
			ks = append(ks, holdKey{kind: holdHost, a: h})
		}
	}
	if e.hosts != ([2]uint32{}) {
		ks = append(ks, holdKey{kind: holdLink, a: e.hosts[0], b: e.hosts[1]})
	}
	for i := range c.activityLoad.limits {
		if k, ok := c.activityLoad.covers(i, e); ok {
			ks = append(ks, holdKey{kind: holdActivity, a: k.endpoint, limit: k.limit})
		}
	}
	return ks
}

// full reports whether hold k is at its limit.
func (c *Core) full(k holdKey) bool { return c.room(k) <= 0 }

// settle gives room at e's holds that have it: for each hold of e that is
// not full and has DTRs parked under it, as many as it has room for go
// back. It runs when a grant under e's holds ends, and when e is parked
// under one of them: a DTR taken back from a hold with room that then
// parks under another must not leave the room unused while DTRs behind it
// are parked.
func (c *Core) settle(e *entry) {
	if len(c.holds) == 0 {
		return
	}
	for _, k := range c.keysOf(e) {
		if _, parked := c.holds[k]; parked && !c.full(k) {
			c.roomAt(k)
		}
	}
}

// settleAll gives room at every hold with parked DTRs that has it, once
// a tick before TRANSFER's grants: whatever took a DTR out of a hold's
// park without using the room (it was cancelled, forgotten, or went on
// to wait for another hold), the DTRs parked behind it get their turn.
// It costs one look per hold with parked DTRs, not per DTR.
func (c *Core) settleAll() {
	for k := range c.holds {
		if !c.full(k) {
			c.roomAt(k)
		}
	}
}

// tickLinks marks the links that DTRs are parked for as wanted, and
// unparks those whose limit rose, around the optimizer's tick.
func (c *Core) tickLinks(now time.Time) {
	if c.links == nil {
		return
	}
	before := map[holdKey]int{}
	for k := range c.holds {
		if k.kind != holdLink {
			continue
		}
		if l := c.links.links[linkKey{k.a, k.b}]; l != nil {
			l.waited = true
			before[k] = l.limit
		}
	}
	c.links.tick(now)
	for k, limit := range before {
		if l := c.links.links[linkKey{k.a, k.b}]; l == nil || l.limit > limit {
			c.roomAt(k)
		}
	}
}

// holdReason says what holds a parked DTR.
func (c *Core) holdReason(e *entry) string {
	k := e.park.hold
	switch k.kind {
	case holdLink:
		running := 0
		if l := c.links.links[linkKey{k.a, k.b}]; l != nil {
			running = l.running
		}
		return fmt.Sprintf("link %s already has %d transfers running, its limit set by the optimizer (sluice links): the DTR waits for one of them to end",
			c.linkName(e), running)
	case holdHost:
		return fmt.Sprintf("storage endpoint %s already has %d transfers running (max per host %d): the DTR waits for one of them to end",
			c.names[k.a-1], c.hosts.running[k.a], c.cfg.MaxPerHost)
	case holdActivity:
		lim := c.activityLoad.limits[k.limit]
		ak := activityKey{limit: k.limit, endpoint: k.a}
		return fmt.Sprintf("activity limit %d (%s) holds it: %d %q transfers run at %s %s; the DTR waits for one of them to end",
			k.limit+1, lim, c.activityLoad.running[ak], lim.Activity, lim.Side(), c.names[k.a-1])
	}
	return ""
}
