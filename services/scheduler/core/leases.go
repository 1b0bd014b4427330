package core

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// The lease clock. A lease runs out when the scheduler has not heard from
// the grant's worker for Config.Lease; but a scheduler that could not
// hear (its connection to NATS down, the process frozen, or results
// waiting in the stream that it has not read yet) has not learnt that a
// worker is gone. Its edge stops the clock for as long as that lasts, and
// every lease held then gets the time back.

// PauseLeases stops the lease clock at since, the last time the caller
// surely heard everything workers said: no lease runs out until
// ResumeLeases. Pausing a paused clock keeps the earlier time.
func (c *Core) PauseLeases(since time.Time) {
	if c.leasesPaused.IsZero() {
		c.leasesPaused = since
	}
}

// LeasesPaused reports whether the lease clock is stopped.
func (c *Core) LeasesPaused() bool { return !c.leasesPaused.IsZero() }

// ResumeLeases starts the lease clock again at now, extending the lease of
// every grant held by the time it was stopped.
func (c *Core) ResumeLeases(now time.Time) {
	if c.leasesPaused.IsZero() {
		return
	}
	if d := now.Sub(c.leasesPaused); d > 0 {
		for _, e := range c.active {
			e.lease += int64(d)
		}
		if c.leasesFrom <= math.MaxInt64-int64(d) { // none active: it stays the most
			c.leasesFrom += int64(d)
		}
	}
	c.leasesPaused = time.Time{}
}

func (c *Core) expireLeases(now time.Time) {
	at := c.nanos(now)
	if at <= c.leasesFrom {
		return // no lease has run out
	}
	var expired []*entry
	c.leasesFrom = math.MaxInt64
	for _, e := range c.active {
		if at > e.lease {
			expired = append(expired, e)
		} else {
			c.leasesFrom = min(c.leasesFrom, e.lease)
		}
	}
	sort.Slice(expired, func(i, j int) bool { return expired[i].seq < expired[j].seq })
	for _, e := range expired {
		d := e.d
		c.count.LeaseExpiries++
		c.chargePolicy(now, e, 0) // a lost worker's bytes are not known
		c.release(e)
		what := "grant " + d.Grant
		if d.Chained {
			what = fmt.Sprintf("chained QUERY_REPLICA and PRE_CLEAN grant %s", d.Grant)
		}
		c.unreserve(now, e)
		// A lost cleanup keeps the error that called for it (none for a
		// cancelled DTR): that error decides what follows, and the
		// cleanup is done again first.
		if d.Cleanup && d.State == dtr.RegisteringReplica {
			e.setPost(postCleanupLost)
		} else if !(d.Cleanup && d.Error != nil) {
			d.Error = &dtr.Failure{Kind: dtr.ErrInternalProcess, State: d.State,
				Text: fmt.Sprintf("lease of %s expired: no sign of life from its worker for %s", what, c.cfg.Lease)}
		}
		d.Cleanup = false
		c.must(d.Transition(classOf(e.queued).HungTo, now))
		c.route(now, e)
	}
}

// setLease gives e's grant a lease running out at lease (nanos).
func (c *Core) setLease(e *entry, lease int64) {
	e.lease = lease
	c.leasesFrom = min(c.leasesFrom, lease)
}

// LeaseEnds returns when the lease of the grant a DTR holds runs out if
// nothing more is heard of it, as it stands at now; false when the DTR
// holds no grant. While the lease clock is stopped the end moves on with
// it: it is given as if the clock started again at now.
func (c *Core) LeaseEnds(now time.Time, id uuid.UUID) (time.Time, bool) {
	e, ok := c.active[id]
	if !ok {
		return time.Time{}, false
	}
	end := c.when(e.lease)
	if !c.leasesPaused.IsZero() {
		if d := now.Sub(c.leasesPaused); d > 0 {
			end = end.Add(d)
		}
	}
	return end, true
}
