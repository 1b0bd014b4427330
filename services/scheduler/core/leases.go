package core

import "time"

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
	}
	c.leasesPaused = time.Time{}
}
