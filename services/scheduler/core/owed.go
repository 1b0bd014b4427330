package core

import "sort"

// owedFirst returns the indexes of st.order in the order their shares are
// served: the share furthest below its part of the split first, then the
// one owed the most slot-time, then by name. When only a few places are
// free (a link or endpoint at its limit frees one as a transfer ends), the
// place goes to the share that is owed it, never always to the same one.
func owedFirst(st *stateQueues, slots []int) []int {
	idx := make([]int, len(st.order))
	for i := range idx {
		idx[i] = i
	}
	if len(idx) < 2 {
		return idx
	}
	sort.SliceStable(idx, func(a, b int) bool {
		i, j := idx[a], idx[b]
		si, sj := st.order[i], st.order[j]
		if bi, bj := si.running-slots[i], sj.running-slots[j]; bi != bj {
			return bi < bj
		}
		return si.deficit > sj.deficit
	})
	return idx
}
