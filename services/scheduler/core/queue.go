package core

import (
	"container/heap"
	"encoding/binary"
	"maps"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// queue holds one share's waiting DTRs for one state: highest priority
// first, first come first served among equals; or, under a policy that
// draws lots, in the order of an exponential race.
type queue struct {
	items []*entry
	// draw, if set, gives a DTR of a priority its place in the race: the
	// queue goes by key, the time at which its exponential clock rings,
	// and clock is the key of the last DTR taken. Taking the smallest key
	// picks each waiting DTR with a chance in proportion to its weight,
	// exactly, arrivals included (the clocks are memoryless).
	draw  func(prio int32) float64
	clock float64
	// due is no later than the earliest ageing deadline of its items, so
	// ageing can pass the queue by until then.
	due int64
	// hist counts the items by priority, for policies that weigh a queue
	// by its DTRs' priorities.
	hist [101]int32
}

func (q *queue) Len() int { return len(q.items) }
func (q *queue) Less(i, j int) bool {
	return queueBefore(q.draw != nil, q.items[i], q.items[j])
}

// queueBefore reports whether a goes before b in a queue (that draws
// lots, or not).
func queueBefore(draws bool, a, b *entry) bool {
	if draws {
		if a.key != b.key {
			return a.key < b.key
		}
		return a.seq < b.seq
	}
	if a.prio != b.prio {
		return a.prio > b.prio
	}
	return a.cameBefore(b)
}

// cameBefore reports whether a came to its queue before b (arrival).
func (a *entry) cameBefore(b *entry) bool { return a.arrival().before(b.arrival()) }

// arrival is when an entry came to its queue: when its DTR entered the
// state, then, among those that came in one step, its id's tie-break
// (tie), which a restart keeps, and last its arrival order.
type arrival struct {
	stamp    int64
	tie, seq uint64
}

func (e *entry) arrival() arrival { return arrival{e.stamp, e.tie, e.seq} }

func (p arrival) before(o arrival) bool {
	if p.stamp != o.stamp {
		return p.stamp < o.stamp
	}
	if p.tie != o.tie {
		return p.tie < o.tie
	}
	return p.seq < o.seq
}

// tieOf is the tie-break of a DTR's place among those that came to a queue
// in the same step: the last eight bytes of its id (the random ones of a
// version 4 or 7 UUID).
func tieOf(id uuid.UUID) uint64 { return binary.BigEndian.Uint64(id[8:]) }
func (q *queue) Swap(i, j int) {
	q.items[i], q.items[j] = q.items[j], q.items[i]
	q.items[i].index, q.items[j].index = int32(i), int32(j)
}
func (q *queue) Push(x any) {
	e := x.(*entry)
	e.index = int32(len(q.items))
	q.items = append(q.items, e)
}
func (q *queue) Pop() any {
	n := len(q.items) - 1
	e := q.items[n]
	q.items[n] = nil
	q.items = q.items[:n]
	e.index = -1
	return e
}

func (q *queue) add(e *entry) {
	e.prio = clampPrio(e.d.Priority)
	q.hist[e.prio]++
	if q.draw != nil {
		e.key = q.clock + q.draw(e.prio)
	}
	heap.Push(q, e)
}

func (q *queue) remove(e *entry) {
	q.hist[e.prio]--
	heap.Remove(q, int(e.index))
}

// fix puts an item whose DTR's priority changed back in order.
func (q *queue) fix(e *entry) {
	q.hist[e.prio]--
	e.prio = clampPrio(e.d.Priority)
	q.hist[e.prio]++
	if q.draw != nil {
		e.key = q.clock + q.draw(e.prio)
	}
	heap.Fix(q, int(e.index))
}

// readd puts back an item taken with popHead, in its old place.
func (q *queue) readd(e *entry) {
	q.hist[e.prio]++
	heap.Push(q, e)
}

func (q *queue) head() *entry { return q.items[0] }

// top returns the highest priority waiting.
func (q *queue) top() int32 {
	for p := int32(100); p > 0; p-- {
		if q.hist[p] > 0 {
			return p
		}
	}
	return 0
}

// popHead removes and returns the first item (Pop is heap.Interface's).
func (q *queue) popHead() *entry {
	e := heap.Pop(q).(*entry)
	q.hist[e.prio]--
	if q.draw != nil {
		q.clock = max(q.clock, e.key)
	}
	return e
}

func clampPrio(p int) int32 { return int32(max(1, min(100, p))) }

// delayQueue orders DTRs waiting for a retry by the time they go on.
type delayQueue []*entry

func (q delayQueue) Len() int           { return len(q) }
func (q delayQueue) Less(i, j int) bool { return q[i].d.NextProcess.Before(q[j].d.NextProcess) }
func (q delayQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = int32(i), int32(j)
}
func (q *delayQueue) Push(x any) {
	e := x.(*entry)
	e.index = int32(len(*q))
	*q = append(*q, e)
}
func (q *delayQueue) Pop() any {
	old := *q
	n := len(old) - 1
	e := old[n]
	old[n] = nil
	*q = old[:n]
	e.index = -1
	return e
}

// stateQueues is the work of one queue state.
type stateQueues struct {
	state dtr.State
	// shares holds every share with work queued or running in the state,
	// order the same sorted by name. A share with neither is dropped, and
	// what it was owed with it.
	shares map[string]*shareState
	order  []*shareState
	total  int
	last   time.Time
	// Buffers for the split, indexed like order.
	demand  []ShareDemand
	deficit []float64
	gave    []int // the slots each share gave up to payback (nil: none)
	// How long its grants hold a slot, for paying back the first wave.
	slotHold
}

// shareState is one share's work in one queue state.
type shareState struct {
	name    string
	prio    int // the share's configured priority
	q       queue
	running int
	// reserved counts the slots among running that chained QUERY_REPLICA
	// grants hold for their DTRs' PRE_CLEAN (chain.go): their DTRs are
	// counted as running in QUERY_REPLICA already.
	reserved int
	// For the fair hand-out of leftover slots: the share's exact quota at
	// the last tick, and the slot-seconds it is owed (quota minus use,
	// summed over time).
	quota, deficit float64
	since          time.Time // when the deficit was last brought up to date
	// How long its grants hold a slot, for paying back the first wave.
	slotHold
	// parked holds the share's DTRs that a full endpoint, link or
	// activity limit keeps from starting, by hold, and parkedN counts
	// them (parking.go).
	parked  map[holdKey]*parked
	parkedN int
	// While the core loads (load.go), fence is where the queue stops
	// granting and unloaded about how many of its DTRs are not yet read.
	fence    *fence
	unloaded int
	// What its deficit accrues against besides its quota (accrue).
	heldBack
}

// shareIn returns the state of a share in st, adding it if it has none.
func (c *Core) shareIn(st *stateQueues, name string) *shareState {
	if ss, ok := st.shares[name]; ok {
		return ss
	}
	ss := &shareState{name: name, prio: c.SharePriority(name), q: queue{due: math.MaxInt64}}
	if l, ok := innermost(c.policy).(lottery); ok {
		ss.q.draw = func(prio int32) float64 { return c.rand.ExpFloat64() / l.PickWeight(int(prio)) }
	}
	st.shares[name] = ss
	i := sort.Search(len(st.order), func(i int) bool { return st.order[i].name >= name })
	st.order = slices.Insert(st.order, i, ss)
	return ss
}

// drop forgets a share that has nothing queued or running in the state.
func (st *stateQueues) drop(ss *shareState) {
	if ss.q.Len() > 0 || ss.parkedN > 0 || ss.running > 0 || ss.fence != nil || st.shares[ss.name] != ss {
		return
	}
	delete(st.shares, ss.name)
	i := sort.Search(len(st.order), func(i int) bool { return st.order[i].name >= ss.name })
	st.order = slices.Delete(st.order, i, i+1)
}

// unread returns about how many DTRs waiting in the state the core has
// not yet read while it loads (load.go).
func (st *stateQueues) unread() int {
	n := 0
	for _, ss := range st.order {
		n += ss.unloaded
	}
	return n
}

// waiting returns how many DTRs wait in the state.
func (st *stateQueues) waiting() int {
	n := 0
	for _, ss := range st.order {
		n += ss.q.Len() + ss.parkedN + ss.unloaded
	}
	return n
}

// age raises by one the priority of every queued DTR whose deadline has
// passed and whose priority is below its queue's head, and sets its next
// deadline AgeEvery later. A queue whose earliest deadline is still ahead is
// not scanned.
func (c *Core) age(now time.Time) {
	at := c.nanos(now)
	for _, s := range dtr.QueueStates {
		for _, ss := range c.states[s].order {
			// Parked DTRs age too, against the best of all the share's.
			top := ss.q.top()
			for _, p := range ss.parked {
				top = max(top, p.top())
			}
			c.ageQueue(&ss.q, top, at, now)
			if len(ss.parked) > 0 {
				// In a fixed order, so that the DTRs aged are reported
				// in one.
				keys := slices.SortedFunc(maps.Keys(ss.parked), compareHolds)
				for _, k := range keys {
					p := ss.parked[k]
					p.clock = max(p.clock, ss.q.clock) // as home does
					c.ageQueue(&p.queue, top, at, now)
				}
			}
		}
	}
}

// ageQueue ages the DTRs of one queue below top whose deadline has passed.
func (c *Core) ageQueue(q *queue, top int32, at int64, now time.Time) {
	if q.Len() == 0 || at < q.due {
		return
	}
	var aged []*entry
	due := int64(math.MaxInt64)
	for _, e := range q.items {
		if at >= e.deadline && e.prio < top && e.prio < 100 {
			aged = append(aged, e)
			continue
		}
		due = min(due, e.deadline)
	}
	for _, e := range aged {
		c.unpackEntry(e).Priority++
		e.deadline = c.nanos(now.Add(c.cfg.AgeEvery))
		due = min(due, e.deadline)
		q.fix(e)
		c.markDirty(e)
	}
	q.due = due
}
