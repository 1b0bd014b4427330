package core

import "sort"

// ShareDemand is one share's claim on the slots of a state: its weight (the
// configured priority under ARC's policy; see Policy) and its demand (queued
// plus running DTRs).
type ShareDemand struct {
	Name   string
	Weight int64
	Demand int
	// Running is how many of the demand run now, and Queued counts the
	// waiting DTRs by priority (1–100): for policies to read.
	Running int
	Queued  *[101]int32
	// Tier orders shares strictly: the slots go to the highest tier with
	// demand first, and a lower tier only gets what the higher ones cannot
	// use. Weights share out the slots inside a tier. Default 0.
	Tier int
	// Min is a number of slots the share is guaranteed while it has that
	// much demand (capacity it owns); others use them while it is idle.
	Min int
}

// Split divides n slots between shares in proportion to their priorities
// (ARC's transfer shares). Only shares with demand take part; each gets at
// least one slot and never more than its demand; what a capped share cannot
// use is handed on to the others (water-filling), and the fractions left
// over go by largest remainder, ties to the higher priority, then to the
// name that sorts first.
//
// ARC computes the same split with float32 and hands leftover slots out
// round-robin in name order; Split is exact (integer arithmetic) and its
// leftovers follow the remainders, so 60/40 on 5 gives 3/2 and 20/80 on 10
// gives 2/8 whatever the share names are.
//
// When there are more active shares than slots, the n shares of highest
// priority get one slot each and the rest none: they wait for a slot or an
// emergency slot.
func Split(n int, shares []ShareDemand) map[string]int {
	alloc, _ := apportion(n, shares, nil)
	out := make(map[string]int, len(shares))
	for i, a := range alloc {
		if a > 0 {
			out[shares[i].Name] = a
		}
	}
	return out
}

// apportion is Split that also returns each share's exact, fractional quota,
// and hands the leftover slots to the shares owed the most slot-time
// (deficit, in slot-seconds) before it looks at the remainders. Over a long
// run that makes each share's slot-time follow its exact quota, which fixed
// integer slots cannot: 10 slots at 15/85 would otherwise give 2/8 for ever.
// Both results are indexed like shares.
func apportion(n int, shares []ShareDemand, deficit []float64) ([]int, []float64) {
	alloc := make([]int, len(shares))
	exact := make([]float64, len(shares))
	tiers := map[int][]int{}
	var order []int
	for i, s := range shares {
		if s.Demand > 0 {
			if _, ok := tiers[s.Tier]; !ok {
				order = append(order, s.Tier)
			}
			tiers[s.Tier] = append(tiers[s.Tier], i)
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(order)))
	for _, t := range order {
		if n <= 0 {
			break
		}
		n -= apportionTier(n, shares, tiers[t], deficit, alloc, exact, true)
	}
	return alloc, exact
}

// apportionTier shares n slots between the shares active (all with demand, of
// one tier), writing alloc and exact, and returns the slots it gave. With
// minOne each share gets at least one slot (while they fit); without, a
// share may get none (the activities of one group, activitysplit.go).
func apportionTier(n int, shares []ShareDemand, active []int, deficit []float64, alloc []int, exact []float64, minOne bool) int {
	// Weights may be large (DIRAC's are scaled by a million, byte-fair's
	// by more): they are scaled down to a sum below 2^24, so that no
	// product below comes near int64's limit.
	sumW := 0.0
	for _, i := range active {
		sumW += float64(max(shares[i].Weight, 1))
	}
	scale := max(sumW/(1<<24), 1)
	prio := func(i int) int64 { return max(int64(float64(max(shares[i].Weight, 1))/scale), 1) }
	least := 0
	if minOne {
		least = 1
	}
	lo := func(i int) int64 { return int64(max(least, min(shares[i].Min, shares[i].Demand))) }
	total, sumLo := 0, int64(0)
	for _, i := range active {
		total += shares[i].Demand
		sumLo += lo(i)
	}
	if n <= 0 || len(active) == 0 {
		return 0
	}
	// Stable, deterministic order: owners of capacity first, then the
	// slot-time owed, then weight descending, then name.
	sort.Slice(active, func(a, b int) bool {
		if oa, ob := shares[active[a]].Min > 0, shares[active[b]].Min > 0; oa != ob {
			return oa
		}
		if da, db := valueAt(deficit, active[a]), valueAt(deficit, active[b]); da != db {
			return da > db
		}
		if pa, pb := prio(active[a]), prio(active[b]); pa != pb {
			return pa > pb
		}
		return shares[active[a]].Name < shares[active[b]].Name
	})
	if sumLo >= int64(n) {
		// Not even the minimums fit: owners get theirs first, then one
		// slot each to the shares owed the most slot-time. Each share's
		// exact quota is its weight's part of the slots, so that the ones
		// left out now are owed time, and come first next: more shares
		// than slots take turns.
		var sumP int64
		for _, i := range active {
			sumP += prio(i)
		}
		left := int64(n)
		for _, i := range active {
			exact[i] = float64(n) * float64(prio(i)) / float64(sumP)
			give := min(lo(i), left)
			alloc[i] = int(give)
			left -= give
		}
		return n
	}
	m := int64(min(n, total)) // slots that can be used at all

	// Water-filling: find the allocation a_i = clamp(λ·p_i, 1, d_i) with
	// Σa_i = m. Shares whose bound is certain are fixed one round at a time:
	// if the slots the upper-bound violators would give back outweigh what
	// the lower-bound violators need, the true λ is no smaller than the
	// current one and the violators above stay capped; otherwise λ is smaller
	// and the ones below stay at one. All comparisons are in integers,
	// scaled by the free shares' priority sum.
	fixed := make([]int64, len(shares)) // 0: free, else the fixed allocation
	// free returns the slots not fixed yet and the free shares' weight sum.
	free := func() (r, p int64) {
		r = m
		for _, i := range active {
			if fixed[i] > 0 {
				r -= fixed[i]
			} else {
				p += prio(i)
			}
		}
		return r, p
	}
	var over, under []int
	for {
		r, p := free()
		if p == 0 {
			break
		}
		over, under = over[:0], under[:0]
		excess, lack := int64(0), int64(0) // both scaled by p
		for _, i := range active {
			if fixed[i] > 0 {
				continue
			}
			scaled := r * prio(i) // the share's quota times p
			switch d := min(int64(shares[i].Demand), m); {
			case scaled > d*p:
				over = append(over, i)
				excess += scaled - d*p
			case scaled < lo(i)*p:
				under = append(under, i)
				lack += lo(i)*p - scaled
			}
		}
		if len(over) == 0 && len(under) == 0 {
			break
		}
		if excess >= lack && len(over) > 0 {
			for _, i := range over {
				fixed[i] = int64(shares[i].Demand)
			}
		} else {
			for _, i := range under {
				fixed[i] = lo(i)
			}
		}
	}

	// Integer parts, then the leftovers: by deficit, then by remainder.
	r, p := free()
	rems := make([]int, 0, len(active))
	rem := make([]int64, len(shares))
	used := int64(0)
	for _, i := range active {
		if fixed[i] > 0 {
			alloc[i], exact[i] = int(fixed[i]), float64(fixed[i])
			used += fixed[i]
			continue
		}
		alloc[i] = int(r * prio(i) / p)
		exact[i] = float64(r*prio(i)) / float64(p)
		rem[i] = r * prio(i) % p
		used += int64(alloc[i])
		rems = append(rems, i)
	}
	sort.SliceStable(rems, func(a, b int) bool {
		if da, db := valueAt(deficit, rems[a]), valueAt(deficit, rems[b]); da != db {
			return da > db
		}
		return rem[rems[a]] > rem[rems[b]]
	})
	for _, i := range rems {
		if used >= m {
			break
		}
		if alloc[i] < shares[i].Demand {
			alloc[i]++
			used++
		}
	}
	return int(used)
}

// valueAt returns xs[i], or 0 if xs is nil.
func valueAt(xs []float64, i int) float64 {
	if xs == nil {
		return 0
	}
	return xs[i]
}
