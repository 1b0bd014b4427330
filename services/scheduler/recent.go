package scheduler

import (
	"time"

	"github.com/google/uuid"
)

// recentIDs remembers the ids of DTRs that finished lately, for between
// one and two spans: a redelivered submission of one is taken as seen
// until its record is journaled. Two generations of ids, swapped every
// span, forget old ids without a scan.
type recentIDs struct {
	span      time.Duration
	cur, prev map[uuid.UUID]struct{}
	since     time.Time // when cur began
}

func newRecentIDs(span time.Duration) *recentIDs {
	return &recentIDs{span: span, cur: map[uuid.UUID]struct{}{}}
}

// Add remembers id as finished at now.
func (r *recentIDs) Add(id uuid.UUID, now time.Time) {
	r.roll(now)
	r.cur[id] = struct{}{}
}

// Has says whether id finished within the last one to two spans before now.
func (r *recentIDs) Has(id uuid.UUID, now time.Time) bool {
	r.roll(now)
	_, ok := r.cur[id]
	if !ok {
		_, ok = r.prev[id]
	}
	return ok
}

// roll starts a new generation once the current one is a span old; after
// two spans without one, the previous one goes too.
func (r *recentIDs) roll(now time.Time) {
	switch age := now.Sub(r.since); {
	case r.since.IsZero():
		r.since = now
	case age >= 2*r.span:
		r.prev, r.cur, r.since = nil, map[uuid.UUID]struct{}{}, now
	case age >= r.span:
		r.prev, r.cur, r.since = r.cur, make(map[uuid.UUID]struct{}, len(r.cur)), now
	}
}
