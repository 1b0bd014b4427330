package core

// Parking: a queued TRANSFER DTR that a full endpoint (MaxPerHost), a
// full link (the optimizer's limit) or a full activity limit holds is
// taken out of its share's queue and parked under that hold, so that a
// grant never looks past held DTRs to find one that may start: however
// many are held, the DTRs behind them start as soon as there are slots.
// When a grant under a hold ends (or a link's limit rises), the first
// parked DTR of each share under it goes back into its share's queue, in
// its old place (its priority and arrival order are kept); if the hold
// is full again by the time it is taken, it parks again.
//
// A parked DTR is still its share's and its state's: it is counted as
// queued (sluice shares, why), cancelled, forgotten, re-prioritised and
// aged like any other, but it is no demand in the split while it cannot
// start, so that a share whose DTRs are all held claims no slot (as one
// held by maxprepared does not). Parking is not recorded: a restored core
// queues every DTR, and the first grants park the held ones again.

import (
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

// parked holds a share's parked DTRs under one hold, in queue order.
type parked = queue

// home returns the queue an entry waits in: its share's, or the one it is
// parked in.
func (e *entry) home() *queue {
	if e.park != nil {
		return e.park
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
		p = &parked{draw: ss.q.draw, due: math.MaxInt64}
		ss.parked[k] = p
		if c.holds == nil {
			c.holds = map[holdKey]map[*shareState]struct{}{}
		}
		if c.holds[k] == nil {
			c.holds[k] = map[*shareState]struct{}{}
		}
		c.holds[k][ss] = struct{}{}
	}
	p.readd(e)
	p.due = min(p.due, e.deadline)
	e.park, e.hold = p, k
	ss.parkedN++
}

// unparkedFrom notes that e left its park (taken back, cancelled or
// forgotten), forgetting the park when it is empty.
func (c *Core) unparkedFrom(e *entry) {
	ss, k := e.share, e.hold
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

// roomAt puts the first parked DTR of each share under hold k back in its
// share's queue: a grant under k ended.
func (c *Core) roomAt(k holdKey) {
	for ss := range c.holds[k] {
		p := ss.parked[k]
		e := p.popHead()
		c.unparkedFrom(e)
		ss.q.readd(e)
		ss.q.due = min(ss.q.due, e.deadline)
	}
}

// unparkAll puts every DTR parked under k back: k's limit rose.
func (c *Core) unparkAll(k holdKey) {
	for ss := range c.holds[k] {
		p := ss.parked[k]
		for p.Len() > 0 {
			e := p.popHead()
			c.unparkedFrom(e)
			ss.q.readd(e)
			ss.q.due = min(ss.q.due, e.deadline)
		}
	}
}

// released gives room to the holds a TRANSFER grant of e counted under.
func (c *Core) released(e *entry) {
	if len(c.holds) == 0 {
		return
	}
	for _, h := range e.hosts {
		if h != 0 {
			c.roomAt(holdKey{kind: holdHost, a: h})
		}
	}
	if e.hosts != ([2]uint32{}) {
		c.roomAt(holdKey{kind: holdLink, a: e.hosts[0], b: e.hosts[1]})
	}
	for i := range c.activityLoad.limits {
		if k, ok := c.activityLoad.covers(i, e); ok {
			c.roomAt(holdKey{kind: holdActivity, a: k.endpoint, limit: k.limit})
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
			c.unparkAll(k)
		}
	}
}

// holdReason says what holds a parked DTR.
func (c *Core) holdReason(e *entry) string {
	k := e.hold
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
