package core

// Granting: the free slots of a state split between its shares, DTRs taken
// from each share's queue in order, and slots released.

import (
	"encoding/hex"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// schedule grants the free slots of one state: each share up to its part of
// the split, then one emergency slot for each share with work queued and
// nothing running, up to MaxEmergency above the limit.
func (c *Core) schedule(now time.Time, s dtr.State) {
	if s == dtr.PreClean {
		c.reclaimReservations(now) // chain.go
	}
	st := c.states[s]
	n := c.Limit(s)
	c.account(now, st)
	if len(st.order) == 0 {
		return
	}
	if classOf(s).PerHost {
		c.settleAll()
	}
	slots, exact := c.shareSlots(st)
	for i, ss := range st.order {
		ss.quota = exact[i]
	}
	defer c.markHeld(s, st, slots) // once its grants are made
	if st.total >= n+c.cfg.MaxEmergency {
		return
	}
	limited := classOf(s).PerHost && (c.hosts.limited() || c.activityLoad.limited())
	for _, i := range owedFirst(st, slots, limited) {
		ss := st.order[i]
		for ss.grantable() && st.total < n && ss.running < slots[i] && c.admit(s, ss) {
			e := c.dequeue(s, ss)
			if e == nil {
				break
			}
			c.issueGrant(now, s, e, false)
		}
	}
	if st.total < n && limited {
		// Slots left because some shares' DTRs wait for a full endpoint go
		// to any share that can use them: a slow storage holds no slot.
		// A DTR parked on the way can put back others (settle) into the
		// queue of a share already passed: go round again while that
		// happens.
		for again := true; again && st.total < n; {
			again = false
			for _, i := range owedFirst(st, slots, true) {
				ss := st.order[i]
				for ss.grantable() && st.total < n {
					e := c.dequeue(s, ss)
					if e == nil {
						break
					}
					c.issueGrant(now, s, e, false)
				}
			}
			for _, ss := range st.order {
				again = again || ss.grantable()
			}
		}
	}
	if st.total < n || c.cfg.MaxEmergency == 0 {
		return
	}
	// Emergency slots go to the shares of highest priority first (of
	// equal priority, the one owed the most slot-time), and only to shares
	// of the highest tier with work: a lower tier waits for what the
	// higher ones leave.
	top := math.MinInt
	for _, d := range st.demand {
		if d.Demand > 0 {
			top = max(top, d.Tier)
		}
	}
	var idle []*shareState
	for i, ss := range st.order {
		if ss.grantable() && ss.running == 0 && c.admit(s, ss) && st.demand[i].Tier == top {
			idle = append(idle, ss)
		}
	}
	sort.SliceStable(idle, func(i, j int) bool {
		if idle[i].prio != idle[j].prio {
			return idle[i].prio > idle[j].prio
		}
		return idle[i].deficit > idle[j].deficit
	})
	for _, ss := range idle {
		if st.total >= n+c.cfg.MaxEmergency {
			break
		}
		if e := c.dequeue(s, ss); e != nil {
			c.issueGrant(now, s, e, true)
		}
	}
}

// dequeue pops the first DTR of a share's queue that may start now: in
// TRANSFER, one whose endpoints are below MaxPerHost, whose link is below
// its limit and whose activity limits have room (ARC: a delivery DTR
// first chooses a host; if none is free it is skipped). The held DTRs
// it passes are parked under their hold (parking.go), each once, until a
// grant under that hold ends. It returns nil if none can start.
func (c *Core) dequeue(s dtr.State, ss *shareState) *entry {
	if !ss.grantable() {
		return nil
	}
	if !classOf(s).PerHost || !c.hosts.limited() && !c.activityLoad.limited() {
		return ss.q.popHead()
	}
	for ss.grantable() {
		e := ss.q.popHead()
		k, held := c.holdOf(e)
		if !held {
			return e
		}
		c.park(k, e)
	}
	return nil
}

// unqueue takes a queued entry out of its queue, parked or not.
func (c *Core) unqueue(e *entry) {
	c.unmarkBack(e)
	e.home().remove(e)
	if e.park != nil {
		c.unparkedFrom(e)
	}
}

// shareSlots divides the state's slots between its shares under the
// policy (Split's sums, with the shares' deficits); both results are
// indexed like st.order.
func (c *Core) shareSlots(st *stateQueues) (slots []int, exact []float64) {
	st.demand, st.deficit = st.demand[:0], st.deficit[:0]
	for _, ss := range st.order {
		demand := ss.running
		if c.admit(st.state, ss) {
			demand += ss.q.Len() + ss.unloaded
		}
		st.demand = append(st.demand, ShareDemand{Name: ss.name, Weight: int64(ss.prio), Demand: demand, Running: ss.running, Queued: &ss.q.hist})
		st.deficit = append(st.deficit, ss.deficit)
	}
	c.policy.Weigh(c.now, st.state, st.demand)
	if c.weighActivities(st.demand) {
		slots, exact = c.apportionActivities(c.Limit(st.state), st.demand, st.deficit)
	} else {
		slots, exact = apportion(c.Limit(st.state), st.demand, st.deficit)
	}
	st.gave = payback(slots, st.demand, st.deficit, exact, st.holdOf)
	return slots, exact
}

// account brings each share's deficit up to now: what its exact quota
// entitled it to, less the slots it used, summed over time (accrue); each
// deficit is then bounded (capDeficits).
func (c *Core) account(now time.Time, st *stateQueues) {
	dt := now.Sub(st.last).Seconds()
	st.last = now
	first := dt <= 0 || dt > 60 // the first tick, or a long pause: nothing to learn
	for _, ss := range st.order {
		if first || ss.quota == 0 {
			ss.since = now
			if ss.quota == 0 {
				ss.deficit = 0 // a share with no slot is owed nothing
			}
			continue
		}
		ss.accrue(now)
	}
	st.capDeficits(c.Limit(st.state))
}

// issueGrant gives e, taken from its queue in state s, a slot: it moves
// to the active state, under a new grant that the next Take hands out.
func (c *Core) issueGrant(now time.Time, s dtr.State, e *entry, emergency bool) {
	c.unmarkBack(e)
	d := c.unpackEntry(e)
	st := c.states[s]
	e.share.running++
	st.total++
	c.must(d.Transition(s.Active(), now))
	d.Grant = nextGrant(d)
	if s == dtr.QueryReplica && c.mayChain(d) {
		c.reserve(now, e) // chain.go
	}
	k := classOf(s)
	if k.IsTransfer {
		d.TransferGrant = d.Grant
	}
	if k.Pins {
		c.pin(e)
	}
	if k.PerHost {
		c.hosts.add(e, 1)
		c.activityLoad.add(e, 1)
	}
	d.Cleanup = k.CleansUp && e.post != postFinaliseAgain && (d.Error != nil || d.Cancel)
	e.endPost(postFinaliseAgain)
	c.setLease(e, c.nanos(now.Add(c.cfg.Lease)))
	e.granted = c.nanos(now)
	g := c.grantOf(e)
	g.Emergency = emergency
	c.count.Grants++
	if emergency {
		c.count.EmergencyGrants++
	}
	c.active[d.ID] = e
	c.out.Grants = append(c.out.Grants, g)
	c.markDirty(e)
}

// nextGrant is the id of the grant after d's last: "<dtr id>.<n+1>".
func nextGrant(d *dtr.DTR) string {
	n := 1
	if d.Grant != "" {
		if _, after, ok := cut(d.Grant); ok {
			n, _ = strconv.Atoi(after)
			n++
		}
	}
	return grantID(d.ID, n)
}

// grantID is "<dtr id>.<n>", built with one allocation: grants are the
// scheduler's hot path.
func grantID(id uuid.UUID, n int) string {
	var b [36 + 1 + 20]byte
	hex.Encode(b[0:8], id[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], id[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], id[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], id[8:10])
	b[23] = '-'
	hex.Encode(b[24:36], id[10:16])
	b[36] = '.'
	return string(strconv.AppendInt(b[:37], int64(n), 10))
}

func cut(grant string) (string, string, bool) {
	for i := len(grant) - 1; i >= 0; i-- {
		if grant[i] == '.' {
			return grant[:i], grant[i+1:], true
		}
	}
	return grant, "", false
}

// grantOf describes the grant an active DTR holds.
func (c *Core) grantOf(e *entry) Grant {
	d := e.d
	g := Grant{ID: d.Grant, Stage: e.queued.Stage(), State: d.State, DTR: d, LeaseSeconds: c.cfg.Lease.Seconds(), Cleanup: d.Cleanup}
	if d.Chained {
		g.Then = &api.GrantThen{State: dtr.PreCleaning, Grant: nextGrant(d)}
	}
	return g
}

// release frees the slot of an active DTR.
func (c *Core) release(e *entry) {
	st := c.states[e.queued]
	if classOf(e.queued).PerHost {
		c.hosts.add(e, -1)
		c.activityLoad.add(e, -1)
		c.settle(e)
	}
	e.share.running--
	st.total--
	st.drop(e.share)
	delete(c.active, e.d.ID)
}

// chargePolicy tells the policy what an active DTR's grant used.
func (c *Core) chargePolicy(now time.Time, e *entry, bytes int64) {
	if !classOf(e.queued).ChargesBytes {
		bytes = 0
	}
	held := now.Sub(c.when(e.granted))
	e.share.accrue(now) // up to the moment its slot is freed
	c.policy.Charge(now, e.queued, e.d, held, bytes)
}
