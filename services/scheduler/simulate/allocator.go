package simulate

import (
	"math"
	"sort"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// Budget is the slots of each queue state a shard may hold until its next
// lease.
type Budget map[dtr.State]int

// ShardLoad is what a shard tells the allocator when it renews its lease:
// the load of each of its shares in each queue state (core.Core.Shares).
type ShardLoad struct {
	Shares []core.ShareStats
}

// Allocator is the global slot allocator of docs/scale.md: it leases each
// shard a budget of every queue state's slots, every period. A shard's
// budget follows the configured priorities of the shares it has work in:
// the state's slots are split between all the shares of all the shards in
// proportion to their priorities, none above its demand (water-filling,
// as the core splits a state's slots), and a shard's budget is the sum of
// its shares' parts, at least one slot for each of its shares with work
// while the slots go round. The fractions go by the slot-time each shard is
// owed (its exact part less what it held, summed over the periods), so over
// time each shard gets its exact part. Slots no share can use are leased
// too, round the shards, so that new work starts before the next lease.
// A budget never hands out a slot that another shard still holds above its
// own lowered budget: it waits until that grant ends.
//
// A shard that does not renew loses its budget: the allocator forgets its
// load and gives it no slots; it is expected to stop granting when its lease
// runs out. Allocator is plain deterministic code: no clock, no I/O.
type Allocator struct {
	// Total is each queue state's slots for the whole site.
	Total map[dtr.State]int
	// owed, exact and held are, per state, each shard's slot-time owed
	// (slot-seconds), and its exact part and the slots it could hold
	// (its budget, or more while grants above it run) at the last lease.
	owed, exact, held map[dtr.State][]float64
	last              time.Time
}

// NewAllocator returns an allocator of total slots per queue state between
// shards shards.
func NewAllocator(total map[dtr.State]int, shards int) *Allocator {
	a := &Allocator{Total: total, owed: map[dtr.State][]float64{}, exact: map[dtr.State][]float64{}, held: map[dtr.State][]float64{}}
	for s := range total {
		a.owed[s] = make([]float64, shards)
		a.exact[s] = make([]float64, shards)
		a.held[s] = make([]float64, shards)
	}
	return a
}

// Lease returns each shard's budget until the next lease, from the loads
// the shards renewed with (nil: the shard did not renew).
func (a *Allocator) Lease(now time.Time, loads []*ShardLoad) []Budget {
	dt := 0.0
	if !a.last.IsZero() {
		dt = now.Sub(a.last).Seconds()
	}
	a.last = now
	out := make([]Budget, len(loads))
	for k := range out {
		out[k] = Budget{}
	}
	states := make([]dtr.State, 0, len(a.Total))
	for s := range a.Total {
		states = append(states, s)
	}
	sort.Slice(states, func(i, j int) bool { return states[i] < states[j] })
	for _, s := range states {
		for k, b := range a.leaseState(s, dt, loads) {
			out[k][s] = b
		}
	}
	return out
}

// shardDemand is one shard's work in one state.
type shardDemand struct {
	renewed         bool
	demand, running int
	active          int // shares with work
	exact           float64
}

func (a *Allocator) leaseState(s dtr.State, dt float64, loads []*ShardLoad) []int {
	total := a.Total[s]
	n := len(loads)
	if n == 0 {
		return nil
	}
	shards := make([]shardDemand, n)
	var shares []core.ShareDemand
	var shardOf []int
	for k, l := range loads {
		if l == nil {
			continue
		}
		shards[k].renewed = true
		for _, st := range l.Shares {
			if st.State != s || st.Queued+st.Running == 0 {
				continue
			}
			shares = append(shares, core.ShareDemand{Name: st.Share, Weight: int64(max(st.Priority, 1)), Demand: st.Queued + st.Running})
			shardOf = append(shardOf, k)
			shards[k].demand += st.Queued + st.Running
			shards[k].running += st.Running
			shards[k].active++
		}
	}
	owed, lastExact, lastHeld := a.owed[s], a.exact[s], a.held[s]
	for k := range shards {
		if shards[k].demand == 0 || !shards[k].renewed {
			owed[k] = 0 // a shard with no work is owed nothing
			continue
		}
		owed[k] += (lastExact[k] - lastHeld[k]) * dt
	}
	for i, q := range waterFill(float64(total), shares) {
		shards[shardOf[i]].exact += q
	}
	budget := make([]int, n)
	minimum := 0
	for _, sd := range shards {
		minimum += sd.active
	}
	used := 0
	for k, sd := range shards {
		lastExact[k] = sd.exact
		b := int(math.Floor(sd.exact + 1e-9))
		if minimum <= total {
			b = max(b, sd.active)
		}
		budget[k] = min(b, sd.demand)
		used += budget[k]
	}
	// More than the slots (the minimum of one per share): take back from
	// the shards furthest above their exact part, none below its minimum.
	for used > total {
		k := argBest(n, func(k int) (bool, float64) {
			return budget[k] > shards[k].active, float64(budget[k]) - shards[k].exact
		})
		if k < 0 {
			k = argBest(n, func(k int) (bool, float64) { return budget[k] > 0, float64(budget[k]) - shards[k].exact })
		}
		budget[k]--
		used--
	}
	// The fractions: to the shards owed the most, then the largest
	// remainder, while they have demand.
	for used < total {
		k := argBest(n, func(k int) (bool, float64) {
			return budget[k] < shards[k].demand, owed[k] + (shards[k].exact-float64(budget[k]))*1e-6
		})
		if k < 0 {
			break
		}
		budget[k]++
		used++
	}
	// Slots no share can use: round the renewed shards, so that what
	// arrives starts before the next lease.
	for k := 0; used < total; k = (k + 1) % n {
		if !shards[k].renewed {
			if !anyRenewed(shards) {
				break
			}
			continue
		}
		budget[k]++
		used++
	}
	// No slot is leased twice: a shard that holds more than its new budget
	// keeps those slots until its grants end, so the others' budgets wait.
	held := 0
	for k := range shards {
		held += max(budget[k], shards[k].running)
	}
	for held > total {
		k := argBest(n, func(k int) (bool, float64) {
			return budget[k] > shards[k].running, float64(budget[k]) - shards[k].exact
		})
		if k < 0 {
			break
		}
		budget[k]--
		held--
	}
	for k := range shards {
		lastHeld[k] = float64(max(budget[k], shards[k].running))
	}
	return budget
}

func anyRenewed(shards []shardDemand) bool {
	for _, sd := range shards {
		if sd.renewed {
			return true
		}
	}
	return false
}

// argBest returns the index in [0, n) that may be chosen with the largest
// score, the first of equals; -1 if none may.
func argBest(n int, score func(int) (bool, float64)) int {
	best, bestScore := -1, 0.0
	for k := 0; k < n; k++ {
		ok, v := score(k)
		if ok && (best < 0 || v > bestScore) {
			best, bestScore = k, v
		}
	}
	return best
}

// waterFill divides total slots between shares in proportion to their
// weights, none above its demand, handing what a capped share cannot use on
// to the others: each share's exact, fractional part.
func waterFill(total float64, shares []core.ShareDemand) []float64 {
	out := make([]float64, len(shares))
	capped := make([]bool, len(shares))
	left := total
	for {
		var weight float64
		for i, sh := range shares {
			if !capped[i] {
				weight += float64(sh.Weight)
			}
		}
		if weight == 0 || left <= 0 {
			return out
		}
		done := true
		for i, sh := range shares {
			if !capped[i] && left*float64(sh.Weight)/weight >= float64(sh.Demand) {
				out[i], capped[i], done = float64(sh.Demand), true, false
				left -= float64(sh.Demand)
			}
		}
		if done {
			for i, sh := range shares {
				if !capped[i] {
					out[i] = left * float64(sh.Weight) / weight
				}
			}
			return out
		}
	}
}
