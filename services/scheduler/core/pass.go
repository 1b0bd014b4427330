package core

import (
	"iter"
	"maps"

	"github.com/google/uuid"
)

// A Pass walks every unfinished DTR a slice at a time, so that a caller
// holding ten million need not stop for seconds to look at each: between
// slices the core goes on deciding. What changes meanwhile follows Go's
// rules for a map changed while ranged over: a DTR that ends before the
// pass reaches it is not seen, one that arrives meanwhile may or may not
// be. On the way it keeps the DTRs that have waited longest (Longest).
type Pass struct {
	c      *Core
	next   func() (uuid.UUID, *entry, bool)
	stop   func()
	oldest oldest
	seen   int
}

// BeginPass starts a pass that keeps up to longest of the longest-waiting
// DTRs it meets.
func (c *Core) BeginPass(longest int) *Pass {
	next, stop := iter.Pull2(maps.All(c.dtrs))
	return &Pass{c: c, next: next, stop: stop, oldest: oldest{keep: max(longest, 0)}}
}

// Step looks at up to n more DTRs, calling f with where each stands, and
// reports whether the pass is over (it then holds nothing more).
func (p *Pass) Step(n int, f func(Standing)) (over bool) {
	if p.next == nil {
		return true
	}
	// The split of slots is worked out again at each slice: it changes as
	// the core decides.
	sf := newStandingFinder(p.c)
	for range n {
		id, e, ok := p.next()
		if !ok {
			p.Stop()
			return true
		}
		p.seen++
		if e.index >= 0 { // in a queue, parked or waiting for a retry
			p.oldest.offer(e)
		}
		f(sf.of(id, e))
	}
	return false
}

// Seen is how many DTRs the pass has looked at.
func (p *Pass) Seen() int { return p.seen }

// Longest returns up to n of the longest-waiting DTRs the pass met that
// still wait where they waited when it met them, those that came to their
// queue first first. (The oldest are the next to be granted: a pass that
// took minutes should have been begun keeping several times n.)
func (p *Pass) Longest(n int) []uuid.UUID {
	ids := make([]uuid.UUID, 0, min(n, len(p.oldest.waiters)))
	for _, w := range p.oldest.waiters {
		if len(ids) == n {
			break
		}
		if w.e.index < 0 || w.e.seq != w.arrival.seq {
			continue // granted, ended or moved on since
		}
		d := p.c.peekEntry(w.e)
		if p.c.dtrs[d.ID] == w.e {
			ids = append(ids, d.ID)
		}
	}
	return ids
}

// Stop ends the pass early; it is safe to call more than once.
func (p *Pass) Stop() {
	if p.stop != nil {
		p.stop()
		p.next, p.stop = nil, nil
	}
}
