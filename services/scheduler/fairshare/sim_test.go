package fairshare

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func newDTR(i int, dn string, dir dtr.Direction) *dtr.DTR {
	return &dtr.DTR{
		ID:          uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "%s-%s-%d", dn, dir, i)),
		Source:      fmt.Sprintf("http://src.example/%s/%d", dn, i),
		Destination: fmt.Sprintf("file:///data/%s/%d", dn, i),
		Owner:       dtr.Identity{DN: dn},
		Direction:   dir,
	}
}

// sim runs the core on a virtual clock with workers that take a set time
// per grant, and measures the slot-time each share uses in TRANSFER.
type sim struct {
	t   *testing.T
	c   *core.Core
	now time.Time
	// running grants and when each ends.
	ends map[string]time.Time
	held map[string]core.Grant
	// transferTime gives the duration of the i-th transfer of a share.
	transferTime func(share string, i int) time.Duration
	// bytes, if set, gives the bytes a transfer of a share moved.
	bytes       func(share string) int64
	moved       map[string]int64 // bytes moved per share
	nth         map[string]int
	slotTime    map[string]time.Duration // TRANSFER slot-time per share
	final       map[uuid.UUID]dtr.DTR
	grantsOrder []uuid.UUID // TRANSFER grants in order
}

func newSim(t *testing.T, cfg core.Config) *sim {
	return &sim{t: t, c: core.New(cfg), now: t0, ends: map[string]time.Time{}, held: map[string]core.Grant{},
		nth: map[string]int{}, slotTime: map[string]time.Duration{}, final: map[uuid.UUID]dtr.DTR{},
		moved:        map[string]int64{},
		transferTime: func(string, int) time.Duration { return 10 * time.Second }}
}

func (s *sim) submit(share string, n int, userPrio int) []uuid.UUID {
	var ids []uuid.UUID
	for i := 0; i < n; i++ {
		d := newDTR(s.nth[share+"/submitted"], share, "")
		s.nth[share+"/submitted"]++
		d.UserPriority = userPrio
		if err := s.c.Submit(s.now, d); err != nil {
			s.t.Fatal(err)
		}
		ids = append(ids, d.ID)
	}
	return ids
}

// run advances the virtual clock by d in steps of tick.
func (s *sim) run(d, tick time.Duration) {
	end := s.now.Add(d)
	for s.now.Before(end) {
		s.c.Tick(s.now)
		out := s.c.Take()
		for _, f := range out.Final {
			s.final[f.ID] = *f
		}
		for _, g := range out.Grants {
			s.held[g.ID] = g
			if g.State == dtr.Transferring {
				share := g.DTR.Share
				s.grantsOrder = append(s.grantsOrder, g.DTR.ID)
				s.ends[g.ID] = s.now.Add(s.transferTime(share, s.nth[share]))
				s.nth[share]++
			} else {
				s.ends[g.ID] = s.now // processing is instant here
			}
		}
		// Account the step, then let time pass and finish what is due.
		for _, g := range s.held {
			if g.State == dtr.Transferring {
				s.slotTime[g.DTR.Share] += tick
			}
		}
		s.now = s.now.Add(tick)
		var due []string
		for id, at := range s.ends {
			if !at.After(s.now) {
				due = append(due, id)
			}
		}
		sort.Strings(due)
		for _, id := range due {
			g := s.held[id]
			delete(s.held, id)
			delete(s.ends, id)
			r := core.Result{DTR: g.DTR.ID, Grant: g.ID}
			if s.bytes != nil && g.State == dtr.Transferring {
				r.Bytes = s.bytes(g.DTR.Share)
				s.moved[g.DTR.Share] += r.Bytes
			}
			if err := s.c.Result(s.now, r); err != nil {
				s.t.Fatal(err)
			}
		}
	}
}

// queuedIn counts a share's DTRs waiting in a state.
func (s *sim) queuedIn(state dtr.State, share string) int {
	stats, _ := s.c.Shares()
	n := 0
	for _, st := range stats {
		if st.State == state && strings.HasPrefix(st.Share, share) {
			n += st.Queued
		}
	}
	return n
}

// running counts a share's transfers in progress.
func (s *sim) running(share string) int {
	n := 0
	for _, g := range s.held {
		if g.State == dtr.Transferring && strings.HasPrefix(g.DTR.Share, share) {
			n++
		}
	}
	return n
}
