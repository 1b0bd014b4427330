package bench

import (
	"slices"
	"time"
)

// slotTimeMoving returns the part of slots' time in which bytes moved,
// from the transfers' spans (start, end): saturated is over the time the
// slots were saturated, from the moment all of them first ran a transfer
// to the start of the last transfer (until then a DTR waited for each
// slot freed), and whole over the run, from the first start to the last
// end (with the slots filling at the start and emptying at the end).
// saturated is 0 if the slots were never all busy.
func slotTimeMoving(spans [][2]time.Time, slots int) (saturated, whole float64) {
	if len(spans) == 0 || slots <= 0 {
		return 0, 0
	}
	type edge struct {
		at    time.Time
		delta int
	}
	edges := make([]edge, 0, 2*len(spans))
	first, last, lastStart := spans[0][0], spans[0][1], spans[0][0]
	var moving time.Duration
	for _, sp := range spans {
		edges = append(edges, edge{sp[0], +1}, edge{sp[1], -1})
		if sp[0].Before(first) {
			first = sp[0]
		}
		if sp[1].After(last) {
			last = sp[1]
		}
		if sp[0].After(lastStart) {
			lastStart = sp[0]
		}
		moving += sp[1].Sub(sp[0])
	}
	if span := last.Sub(first); span > 0 {
		whole = moving.Seconds() / (span.Seconds() * float64(slots))
	}
	// Ends before starts at the same instant: a slot handed on at once
	// is not counted twice.
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta
	})
	var full time.Time
	running := 0
	for _, e := range edges {
		running += e.delta
		if running >= slots {
			full = e.at
			break
		}
	}
	if full.IsZero() || !lastStart.After(full) {
		return 0, whole
	}
	var busy time.Duration
	for _, sp := range spans {
		from, to := sp[0], sp[1]
		if from.Before(full) {
			from = full
		}
		if to.After(lastStart) {
			to = lastStart
		}
		if to.After(from) {
			busy += to.Sub(from)
		}
	}
	return busy.Seconds() / (lastStart.Sub(full).Seconds() * float64(slots)), whole
}
