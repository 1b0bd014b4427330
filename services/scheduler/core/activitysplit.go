package core

// The two-level split under an activity share policy: the slots go first
// to the groups of shares of one identity and direction (each group
// weighing its priority, at least one slot per group as between any
// shares), then each group's slots to its activities by activity weight,
// without a minimum per activity. A minimum per activity would give an
// identity with k activities k slots whatever its priority; without it
// the deficit takes the activities in turn, so that each still gets its
// exact part of the time.

// apportionActivities is apportion for shares that weighActivities
// weighed; both results are indexed like shares.
func (c *Core) apportionActivities(n int, shares []ShareDemand, deficit []float64) ([]int, []float64) {
	type groupKey struct{ identity, direction string }
	index := map[groupKey]int{}
	var groups []ShareDemand
	var groupDeficit []float64
	var members [][]int
	for i, s := range shares {
		sa := c.activityOf(s.Name)
		key := groupKey{sa.identity, sa.direction}
		if sa.weight == 0 {
			key = groupKey{identity: s.Name, direction: "\x00"} // a share of its own
		}
		g, ok := index[key]
		if !ok {
			g = len(groups)
			index[key] = g
			groups = append(groups, ShareDemand{Name: key.identity + key.direction, Tier: s.Tier})
			groupDeficit = append(groupDeficit, 0)
			members = append(members, nil)
		}
		gd := &groups[g]
		if s.Demand > 0 {
			gd.Weight += s.Weight
			gd.Tier = max(gd.Tier, s.Tier)
		}
		gd.Demand += s.Demand
		gd.Running += s.Running
		gd.Min += s.Min
		groupDeficit[g] += valueAt(deficit, i)
		members[g] = append(members[g], i)
	}
	groupAlloc, groupExact := apportion(n, groups, groupDeficit)
	alloc := make([]int, len(shares))
	exact := make([]float64, len(shares))
	for g, ms := range members {
		var active []int
		var sumW float64
		for _, i := range ms {
			if shares[i].Demand > 0 {
				active = append(active, i)
				sumW += float64(max(shares[i].Weight, 1))
			}
		}
		if len(active) == 0 {
			continue
		}
		if groupAlloc[g] == 0 {
			// The group has no slot now: its activities are owed their
			// parts of its quota.
			for _, i := range active {
				exact[i] = groupExact[g] * float64(max(shares[i].Weight, 1)) / sumW
			}
			continue
		}
		apportionTier(groupAlloc[g], shares, active, deficit, alloc, exact, false)
		// The activities' quotas add up to the group's exact quota, not
		// to its whole slots, so that the group's deficit (their sum)
		// follows its share of the time.
		scale := groupExact[g] / float64(groupAlloc[g])
		for _, i := range active {
			exact[i] *= scale
		}
	}
	return alloc, exact
}
