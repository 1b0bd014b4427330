package core

import "sort"

// owedFirst returns the indexes of st.order in the order their shares are
// served. Where limits hold places back (byNeed: per endpoint, per link,
// per activity), the share furthest below its part of the split comes
// first, then the one running the fewest for its weight, then the one
// owed the most slot-time, then the one whose first DTR came first, then
// by name: when a link
// or endpoint at its limit frees one place as a transfer ends, the place
// goes to the share that is owed it, never always to the same one.
// Otherwise every share can take its part and they are served by name.
func owedFirst(st *stateQueues, slots []int, byNeed bool) []int {
	idx := make([]int, len(st.order))
	for i := range idx {
		idx[i] = i
	}
	if !byNeed || len(idx) < 2 {
		return idx
	}
	sort.SliceStable(idx, func(a, b int) bool {
		i, j := idx[a], idx[b]
		si, sj := st.order[i], st.order[j]
		if bi, bj := si.running-slots[i], sj.running-slots[j]; bi != bj {
			return bi < bj
		}
		// Equally far below their parts (held DTRs are parked, so the
		// split may see only the ones a freed place let back): the share
		// running the fewest for its weight first.
		if ri, rj := si.running*max(sj.prio, 1), sj.running*max(si.prio, 1); ri != rj {
			return ri < rj
		}
		if si.deficit != sj.deficit {
			return si.deficit > sj.deficit
		}
		// Owed the same (held shares bank nothing): the one whose first
		// DTR came first, so that a tie does not always go by name.
		if si.q.Len() > 0 && sj.q.Len() > 0 {
			return si.q.head().cameBefore(sj.q.head())
		}
		return false
	})
	return idx
}
