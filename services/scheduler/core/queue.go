package core

import "container/heap"

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
	a, b := q.items[i], q.items[j]
	if q.draw != nil {
		if a.key != b.key {
			return a.key < b.key
		}
		return a.seq < b.seq
	}
	if a.prio != b.prio {
		return a.prio > b.prio
	}
	return a.seq < b.seq
}
func (q *queue) Swap(i, j int) {
	q.items[i], q.items[j] = q.items[j], q.items[i]
	q.items[i].index, q.items[j].index = i, j
}
func (q *queue) Push(x any) {
	e := x.(*entry)
	e.index = len(q.items)
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
	heap.Remove(q, e.index)
}

// fix puts an item whose DTR's priority changed back in order.
func (q *queue) fix(e *entry) {
	q.hist[e.prio]--
	e.prio = clampPrio(e.d.Priority)
	q.hist[e.prio]++
	if q.draw != nil {
		e.key = q.clock + q.draw(e.prio)
	}
	heap.Fix(q, e.index)
}

// readd puts back an item taken with pop, in its old place.
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

func (q *queue) pop() *entry {
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
	q[i].index, q[j].index = i, j
}
func (q *delayQueue) Push(x any) {
	e := x.(*entry)
	e.index = len(*q)
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
