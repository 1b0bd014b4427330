package core

// Loading in parts: a scheduler restarted over millions of stored DTRs
// decides before it has read them all.
//
// At each checkpoint the scheduler stores an Index of its core: the DTRs
// that hold something (a slot, a staged copy, a download into the cache)
// and, for each share's queue in each state, the DTRs at its head in
// queue order and how many wait behind them. A restart restores those
// first, calls BeginLoad with the queues, and then Loads the rest as it
// reads them, deciding meanwhile; EndLoad says all are read.
//
// While it loads, a share's queue with DTRs not yet read is fenced at the
// last of its heads: every DTR not read ranks after that one (it was not
// among the first), so the share is granted only DTRs that rank before the
// fence, in exact queue order, and waits at it until the load ends. Every
// slot held is known (its DTR was in the index, or changed since, and so
// is in the journal), so no limit is exceeded. The DTRs not read count in
// their shares' demand and in what waits (a chained grant does not
// overtake them), priorities do not age until the load ends, and a DTR
// the core held and let go since the load began (finished, or forgotten
// by a standby) is not loaded again from an older record.
//
// Under a policy that draws lots a queue has no order to keep: its loaded
// DTRs are granted as they are drawn, and those not yet read join the
// draw when they are.

import (
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// Index is what a restart restores first: Keep and every queue's Heads.
type Index struct {
	// Keep holds the DTRs that hold a slot (or a chained reservation), a
	// staged copy or a download into the cache.
	Keep []uuid.UUID
	// KeepAt are their stored records' stream sequences (Recorded; 0:
	// not known), in Keep's order.
	KeepAt []uint64
	Queues []QueueIndex
}

// QueueIndex is one share's queue in one state.
type QueueIndex struct {
	State dtr.State
	Share string
	// Heads are its first DTRs, in queue order.
	Heads []uuid.UUID
	// HeadsAt are their stored records' stream sequences (Recorded; 0:
	// not known), in Heads' order.
	HeadsAt []uint64
	// Prio, Stamp and Tie are the place of the last head (or, with no
	// heads, of the fence the core loads under): every DTR queued behind
	// the heads ranks after it.
	Prio  int32
	Stamp int64
	Tie   uint64
	// Behind counts the DTRs queued behind the heads.
	Behind int
}

// fence is where a share's queue stops granting while the core loads: at
// the priority and place of its last head (its seq this core's, or 0 until
// the core holds it queued there).
type fence struct {
	prio    int32
	arrival arrival
	// last is the last head's id (uuid.Nil: none): restored again (its
	// record replayed from the journal), it takes a new seq, and the
	// fence takes it too (enqueueAt).
	last uuid.UUID
}

// passes reports whether e ranks no later than the fence.
func (f *fence) passes(e *entry) bool {
	if e.prio != f.prio {
		return e.prio > f.prio
	}
	return !f.arrival.before(e.arrival())
}

// grantable reports whether the head of the share's queue may be granted
// as far as its order goes: it has one, and it ranks before the fence if
// the core is loading the share's DTRs.
func (ss *shareState) grantable() bool {
	if ss.q.Len() == 0 {
		return false
	}
	return ss.fence == nil || ss.q.draw != nil || ss.fence.passes(ss.q.head())
}

// noFence is the fence of a queue indexed with no heads: nothing passes.
const noFence = 101

// Index returns what a restart restores first, with up to k heads for each
// share's queue in each state. While the core loads, a fenced queue's
// heads are the DTRs that pass its fence (every one of them is loaded)
// and the DTRs not yet read count behind them.
//
// Kept are the DTRs that hold something and those that wait for a retry
// or for a download into the cache (their time may come before the rest
// is read, and then they take their place in a queue).
func (c *Core) Index(k int) Index {
	var ix Index
	keep := map[*entry]struct{}{}
	for _, e := range c.active {
		keep[e] = struct{}{}
	}
	for _, e := range c.delayed {
		keep[e] = struct{}{}
	}
	for e := range c.pins.entries {
		keep[e] = struct{}{}
	}
	for e := range c.cacheKeys {
		keep[e] = struct{}{}
	}
	ix.Keep = make([]uuid.UUID, 0, len(keep))
	ix.KeepAt = make([]uint64, 0, len(keep))
	for e := range keep {
		ix.Keep = append(ix.Keep, c.peekEntry(e).ID)
		ix.KeepAt = append(ix.KeepAt, e.record)
	}
	for _, s := range dtr.QueueStates {
		for _, ss := range c.states[s].order {
			n := ss.q.Len() + ss.parkedN + ss.unloaded
			if n == 0 {
				continue
			}
			heads := ss.heads(k)
			qi := QueueIndex{State: s, Share: ss.name, Behind: n - len(heads), Prio: noFence}
			if ss.fence != nil {
				qi.Prio, qi.Stamp, qi.Tie = ss.fence.prio, ss.fence.arrival.stamp, ss.fence.arrival.tie
			}
			if len(heads) > 0 {
				last := heads[len(heads)-1]
				qi.Prio, qi.Stamp, qi.Tie = last.prio, last.stamp, last.tie
			}
			qi.Heads, qi.HeadsAt = make([]uuid.UUID, len(heads)), make([]uint64, len(heads))
			for i, e := range heads {
				qi.Heads[i], qi.HeadsAt[i] = c.peekEntry(e).ID, e.record
			}
			ix.Queues = append(ix.Queues, qi)
		}
	}
	return ix
}

// heads returns up to k of the share's queued DTRs (parked ones included)
// in queue order, stopping at its fence.
func (ss *shareState) heads(k int) []*entry {
	draws := ss.q.draw != nil
	var out []*entry
	for _, q := range ss.queues() {
		out = append(out, firstOf(q, k)...)
	}
	slices.SortFunc(out, func(a, b *entry) int {
		switch {
		case queueBefore(draws, a, b):
			return -1
		case queueBefore(draws, b, a):
			return 1
		}
		return 0
	})
	out = out[:min(k, len(out))]
	if ss.fence != nil && !draws {
		for i, e := range out {
			if !ss.fence.passes(e) {
				return out[:i]
			}
		}
	}
	return out
}

// queues returns the share's queue and its parked ones.
func (ss *shareState) queues() []*queue {
	qs := []*queue{&ss.q}
	for _, p := range ss.parked {
		qs = append(qs, &p.queue)
	}
	return qs
}

// firstOf returns up to k of a queue's items in order, without changing
// it: a walk of its heap from the root, the next always the least of the
// children met so far.
func firstOf(q *queue, k int) []*entry {
	if k <= 0 || q.Len() == 0 {
		return nil
	}
	draws := q.draw != nil
	out := make([]*entry, 0, min(k, q.Len()))
	frontier := []int32{0}
	for len(out) < k && len(frontier) > 0 {
		best := 0
		for i, at := range frontier {
			if queueBefore(draws, q.items[at], q.items[frontier[best]]) {
				best = i
			}
		}
		at := frontier[best]
		frontier = slices.Delete(frontier, best, best+1)
		out = append(out, q.items[at])
		for _, child := range [2]int32{2*at + 1, 2*at + 2} {
			if int(child) < q.Len() {
				frontier = append(frontier, child)
			}
		}
	}
	return out
}

// BeginLoad fences the queues of an index whose heads (and kept DTRs) the
// core holds now: the rest of their DTRs are loaded by Load until EndLoad.
// Call it once, after restoring what the index names and before anything
// else. A DTR at the very place of a fence (the same priority, stamp and
// tie) that is not its last head does not pass it.
func (c *Core) BeginLoad(qs []QueueIndex) {
	c.loading = true
	c.gone = map[uuid.UUID]struct{}{}
	for _, qi := range qs {
		if qi.Behind <= 0 {
			continue
		}
		st, ok := c.states[qi.State]
		if !ok {
			continue
		}
		ss := c.shareIn(st, c.intern(qi.Share))
		f := &fence{prio: qi.Prio, arrival: arrival{stamp: qi.Stamp, tie: qi.Tie}}
		if n := len(qi.Heads); n > 0 {
			f.last = qi.Heads[n-1]
			if e := c.dtrs[f.last]; e != nil && e.share == ss && e.index >= 0 && e.queued == qi.State {
				f.arrival.seq = e.seq // the last head itself passes
			}
		}
		ss.fence = f
		ss.unloaded = qi.Behind
	}
}

// Loading reports whether the core is between BeginLoad and EndLoad.
func (c *Core) Loading() bool { return c.loading }

// Load restores a DTR read while loading, unless the core holds it or held
// it since the load began (the record read is then older than what the
// core knows); it reports whether it restored it.
func (c *Core) Load(now time.Time, d *dtr.DTR) (bool, error) {
	if _, ok := c.dtrs[d.ID]; ok {
		return false, nil
	}
	if _, ok := c.gone[d.ID]; ok || d.State.Final() {
		return false, nil
	}
	if err := c.Restore(now, d); err != nil {
		return false, err
	}
	if e := c.dtrs[d.ID]; e != nil && e.share != nil && e.index >= 0 && e.share.unloaded > 0 && d.State.IsQueue() {
		e.share.unloaded--
	}
	return true, nil
}

// Recorded tells the core that the stored record of the DTR id is at
// stream sequence seq of the checkpoint bucket; a later sequence than
// the one it knows replaces it, an earlier one (an older record's) does
// not, and a DTR the core does not hold is ignored.
func (c *Core) Recorded(id uuid.UUID, seq uint64) {
	c.recordedUpTo = max(c.recordedUpTo, seq)
	if e := c.dtrs[id]; e != nil && seq > e.record {
		e.record = seq
	}
}

// RecordedUpTo is the latest stream sequence the core was told a record
// is stored at (Recorded): about where the checkpoint bucket ends.
func (c *Core) RecordedUpTo() uint64 { return c.recordedUpTo }

// EndLoad says every stored DTR is loaded: the fences go, and priorities
// age again.
func (c *Core) EndLoad() {
	if !c.loading {
		return
	}
	c.loading, c.gone = false, nil
	for _, s := range dtr.QueueStates {
		st := c.states[s]
		for _, ss := range slices.Clone(st.order) {
			ss.fence, ss.unloaded = nil, 0
			st.drop(ss)
		}
	}
}

// let records, while loading, that the core let a DTR go.
func (c *Core) let(id uuid.UUID) {
	if c.loading {
		c.gone[id] = struct{}{}
	}
}
