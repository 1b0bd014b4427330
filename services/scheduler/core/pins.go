package core

// Pins: the staged copies each share holds, held to MaxPrepared.

import "github.com/sluice-dtr/sluice/pkg/dtr"

// pinLedger counts the staged copies each share holds. Its invariant: a
// share is in byShare exactly while it holds at least one copy, and each
// entry with pinned set is counted once, at its pinPrio.
type pinLedger struct {
	byShare map[string]*sharePins
	// entries are the DTRs counted (for the restart's Index).
	entries map[*entry]struct{}
	// max is MaxPrepared: how many staged copies a share may hold before
	// only a DTR that outranks all of them may stage.
	max int
}

// sharePins counts one share's staged copies by the priority they were
// pinned at.
type sharePins struct {
	n      int
	byPrio [101]int32
}

// highest returns the highest priority among the pins.
func (p *sharePins) highest() int {
	for prio := 100; prio > 0; prio-- {
		if p.byPrio[prio] > 0 {
			return prio
		}
	}
	return 0
}

// of returns a share's pins, nil if it holds none.
func (l *pinLedger) of(share string) *sharePins { return l.byShare[share] }

// add counts e's staged copy for share at priority prio, once.
func (l *pinLedger) add(e *entry, share string, prio int) {
	if e.pinned {
		return
	}
	p := l.byShare[share]
	if p == nil {
		p = &sharePins{}
		l.byShare[share] = p
	}
	e.pinned, e.pinPrio = true, int8(min(max(prio, 1), 100))
	l.entries[e] = struct{}{}
	p.n++
	p.byPrio[e.pinPrio]++
}

// remove stops counting e's staged copy, if it was counted.
func (l *pinLedger) remove(e *entry, share string) {
	if !e.pinned {
		return
	}
	p := l.byShare[share]
	p.n--
	p.byPrio[e.pinPrio]--
	if p.n == 0 {
		delete(l.byShare, share)
	}
	e.pinned = false
	delete(l.entries, e)
}

// full reports whether a DTR of priority prio must wait before it stages
// in share: the share holds max copies or more and prio does not outrank
// every one of them (the highest-priority bypass).
func (l *pinLedger) full(share string, prio int) bool {
	p := l.byShare[share]
	return p != nil && p.n >= l.max && prio <= p.highest()
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
	if !e.pinned {
		d := c.peekEntry(e)
		c.pins.add(e, d.Share, d.Priority)
	}
}

// unpin records that a DTR's staged copy is released.
func (c *Core) unpin(e *entry) {
	if e.pinned {
		c.pins.remove(e, c.peekEntry(e).Share)
	}
}

// admit reports whether the head of a share's queue may be granted as far
// as the state's own limits go: in a state whose grants pin a staged copy
// (STAGE_PREPARE), the share must hold fewer than MaxPrepared staged
// copies, or the DTR must outrank all of them.
func (c *Core) admit(s dtr.State, ss *shareState) bool {
	if !classOf(s).Pins || ss.q.Len() == 0 {
		return true
	}
	return !c.pins.full(ss.name, int(ss.q.head().prio))
}
