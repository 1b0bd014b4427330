package core

// Pins: the staged copies each share holds (MaxPrepared).

import "github.com/sluice-dtr/sluice/pkg/dtr"

// pins counts a share's staged copies by the priority they were pinned at.
type pins struct {
	n      int
	byPrio [101]int32
}

// highest returns the highest priority among the pins.
func (p *pins) highest() int {
	for prio := 100; prio > 0; prio-- {
		if p.byPrio[prio] > 0 {
			return prio
		}
	}
	return 0
}

// pinnedStates are the states of a staged DTR that holds its staged copy,
// for rebuilding the pins after a restart.
var pinnedStates = map[dtr.State]bool{
	dtr.StagingPreparing: true, dtr.StagingPreparingWait: true, dtr.StagedPrepared: true,
	dtr.Transfer: true, dtr.Transferring: true, dtr.TransferringCancel: true, dtr.Transferred: true,
	dtr.ReleaseRequest: true, dtr.ReleasingRequest: true,
}

// pin records that a DTR holds a staged copy.
func (c *Core) pin(e *entry) {
	if e.pinned {
		return
	}
	d := c.peekEntry(e)
	p := c.pins[d.Share]
	if p == nil {
		p = &pins{}
		c.pins[d.Share] = p
	}
	e.pinned, e.pinPrio = true, int8(min(max(d.Priority, 1), 100))
	p.n++
	p.byPrio[e.pinPrio]++
}

// unpin records that a DTR's staged copy is released.
func (c *Core) unpin(e *entry) {
	if !e.pinned {
		return
	}
	share := c.peekEntry(e).Share
	p := c.pins[share]
	p.n--
	p.byPrio[e.pinPrio]--
	if p.n == 0 {
		delete(c.pins, share)
	}
	e.pinned = false
}

// admit reports whether the head of a share's queue may be granted as far
// as the state's own limits go: in STAGE_PREPARE, the share must hold fewer
// than MaxPrepared staged copies, or the DTR must outrank all of them.
func (c *Core) admit(s dtr.State, ss *shareState) bool {
	if !classOf(s).pins || ss.q.Len() == 0 {
		return true
	}
	p := c.pins[ss.name]
	return p == nil || p.n < c.cfg.MaxPrepared || int(ss.q.head().prio) > p.highest()
}
