package core

// What the core tells about the DTRs it holds and the load of its shares,
// without changing anything.

import (
	"bytes"
	"sort"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// Get returns a copy of a known, unfinished DTR.
func (c *Core) Get(id uuid.UUID) (dtr.DTR, bool) {
	e, ok := c.dtrs[id]
	if !ok {
		return dtr.DTR{}, false
	}
	return *c.peekEntry(e), true
}

// Retrying returns copies of a job's DTRs that wait to be tried again after
// an error (in NEW to start over, or in CACHE_PROCESSED to finalise again),
// each with its error, its attempts so far and when it goes on
// (NextProcess), soonest first.
func (c *Core) Retrying(jobID string) []dtr.DTR {
	var out []dtr.DTR
	for _, e := range c.delayed {
		d := e.d // waiting: not packed
		if d.JobID == jobID && d.Error != nil && (d.State == dtr.New || d.State == dtr.CacheProcessed) {
			out = append(out, *d)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].NextProcess.Equal(out[j].NextProcess) {
			return out[i].NextProcess.Before(out[j].NextProcess)
		}
		return out[i].ID.String() < out[j].ID.String()
	})
	return out
}

// Queued returns how many DTRs wait in a queue state.
func (c *Core) Queued(s dtr.State) int {
	if st := c.states[s]; st != nil {
		return st.waiting()
	}
	return 0
}

// Longest returns up to n DTRs that wait in a queue or for a retry, those
// that came to their queue first first.
func (c *Core) Longest(n int) []uuid.UUID {
	if n <= 0 {
		return nil
	}
	found := oldest{keep: n}
	keep := found.offer
	for _, s := range dtr.QueueStates {
		for _, ss := range c.states[s].order {
			for _, e := range ss.q.items {
				keep(e)
			}
			for _, p := range ss.parked {
				for _, e := range p.items {
					keep(e)
				}
			}
		}
	}
	for _, e := range c.delayed {
		keep(e)
	}
	ids := make([]uuid.UUID, len(found.waiters))
	for i, w := range found.waiters {
		ids[i] = c.peekEntry(w.e).ID
	}
	return ids
}

// oldest keeps, of the entries offered, the keep that came to their queue
// first (cameBefore), in that order, each with the seq it had then.
type oldest struct {
	waiters []waiter
	keep    int
}

// waiter is an entry met waiting, with the place it had in its queue then
// (an entry granted and queued again in its next state gets a new seq).
type waiter struct {
	e       *entry
	arrival arrival
}

// offer keeps e if it is among the keep oldest offered so far.
func (o *oldest) offer(e *entry) {
	i := sort.Search(len(o.waiters), func(i int) bool {
		return e.arrival().before(o.waiters[i].arrival)
	})
	if i >= o.keep {
		return
	}
	if len(o.waiters) < o.keep {
		o.waiters = append(o.waiters, waiter{})
	}
	copy(o.waiters[i+1:], o.waiters[i:])
	o.waiters[i] = waiter{e, e.arrival()}
}

// Len returns the number of unfinished DTRs.
func (c *Core) Len() int { return len(c.dtrs) }

// ShareStats is one share's load in one state.
type ShareStats struct {
	Share    string    `json:"share"`
	State    dtr.State `json:"state"`
	Priority int       `json:"priority"`
	Queued   int       `json:"queued"`
	// Running counts the share's grants in the state; Reserved the slots
	// of the state held by chained QUERY_REPLICA grants for their DTRs'
	// PRE_CLEAN, not in Running: each DTR counts once across states.
	Running  int `json:"running"`
	Reserved int `json:"reserved,omitempty"`
	// Slots is the share's part of the state's limit under the current split.
	Slots int `json:"slots"`
	// Weight is the share's weight in that split under the policy in force
	// (the configured priority under ARC's).
	Weight int64 `json:"weight"`
	// Activity is the share's activity under an activity share policy
	// (voms:vo+activity), else empty.
	Activity string `json:"activity,omitempty"`
	// Unread is about how many of Queued a scheduler restarted over a
	// restart index has not yet read from its store (SharesReply.Reading).
	Unread int `json:"unread,omitempty"`
}

// Shares returns the load of every share in every queue state that has any,
// sorted by state then share, and the number of DTRs waiting for a retry
// per share.
func (c *Core) Shares() (stats []ShareStats, retrying map[string]int) {
	for _, s := range dtr.QueueStates {
		st := c.states[s]
		slots, _ := c.shareSlots(st)
		for i, ss := range st.order {
			stats = append(stats, ShareStats{Share: ss.name, State: s, Priority: ss.prio,
				Queued: ss.q.Len() + ss.parkedN + ss.unloaded, Running: ss.running - ss.reserved, Reserved: ss.reserved, Slots: slots[i], Weight: st.demand[i].Weight,
				Unread: ss.unloaded})
			if _, act, ok := c.cfg.SharePolicy.SplitShare(ss.name); ok {
				stats[len(stats)-1].Activity = act
			}
		}
	}
	retrying = map[string]int{}
	for _, e := range c.delayed {
		retrying[e.d.Share]++ // waiting for a retry: not packed
	}
	return stats, retrying
}

// DTRs returns a copy of every unfinished DTR, in the order they arrived.
func (c *Core) DTRs() []dtr.DTR {
	out := make([]dtr.DTR, 0, len(c.dtrs))
	for _, e := range c.dtrs {
		out = append(out, *c.peekEntry(e))
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return bytes.Compare(out[i].ID[:], out[j].ID[:]) < 0
	})
	return out
}
