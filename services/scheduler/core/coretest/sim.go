// Package coretest runs the scheduler's core on a virtual clock, for the
// tests of the core and of the policies: workers that take a set time per
// grant, and the slot-time each share used in TRANSFER.
package coretest

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

// T0 is when every simulation starts.
var T0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// NewDTR makes the i-th DTR of an owner, with an id that depends only on
// them and the direction.
func NewDTR(i int, dn string, dir dtr.Direction) *dtr.DTR {
	return &dtr.DTR{
		ID:          uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "%s-%s-%d", dn, dir, i)),
		Source:      fmt.Sprintf("http://src.example/%s/%d", dn, i),
		Destination: fmt.Sprintf("file:///data/%s/%d", dn, i),
		Owner:       dtr.Identity{DN: dn},
		Direction:   dir,
	}
}

// Sim is a core with workers on a virtual clock. Processing is instant;
// a transfer takes TransferTime.
type Sim struct {
	T    testing.TB
	Core *core.Core
	Now  time.Time
	// Ends says when each running grant ends; Held holds them.
	Ends map[string]time.Time
	Held map[string]core.Grant
	// TransferTime gives the duration of the i-th transfer of a share.
	TransferTime func(share string, i int) time.Duration
	// Bytes, if set, gives the bytes a transfer of a share moved.
	Bytes       func(share string) int64
	Moved       map[string]int64 // bytes moved per share
	Nth         map[string]int
	SlotTime    map[string]time.Duration // TRANSFER slot-time per share
	BusyTime    time.Duration            // time all TRANSFER slots were busy
	QueuedTime  time.Duration            // time some DTR waited in TRANSFER
	Final       map[uuid.UUID]dtr.DTR
	FirstGrant  map[string]time.Time // first TRANSFER grant per share
	GrantsOrder []uuid.UUID          // TRANSFER grants in order
}

// NewSim makes a core of cfg at T0, with transfers of 10 s.
func NewSim(t testing.TB, cfg core.Config) *Sim {
	return &Sim{T: t, Core: core.New(cfg), Now: T0, Ends: map[string]time.Time{}, Held: map[string]core.Grant{},
		Nth: map[string]int{}, SlotTime: map[string]time.Duration{}, Final: map[uuid.UUID]dtr.DTR{},
		FirstGrant: map[string]time.Time{}, Moved: map[string]int64{},
		TransferTime: func(string, int) time.Duration { return 10 * time.Second }}
}

// Submit submits n DTRs of the owner share with a user priority.
func (s *Sim) Submit(share string, n int, userPrio int) []uuid.UUID {
	var ids []uuid.UUID
	for i := 0; i < n; i++ {
		d := NewDTR(s.Nth[share+"/submitted"], share, "")
		s.Nth[share+"/submitted"]++
		d.UserPriority = userPrio
		if err := s.Core.Submit(s.Now, d); err != nil {
			s.T.Fatal(err)
		}
		ids = append(ids, d.ID)
	}
	return ids
}

// Run advances the virtual clock by d in steps of tick.
func (s *Sim) Run(d, tick time.Duration) {
	end := s.Now.Add(d)
	for s.Now.Before(end) {
		s.Core.Tick(s.Now)
		out := s.Core.Take()
		for _, f := range out.Final {
			s.Final[f.ID] = *f
		}
		for _, g := range out.Grants {
			s.Held[g.ID] = g
			if g.State == dtr.Transferring {
				share := g.DTR.Share
				if _, ok := s.FirstGrant[share]; !ok {
					s.FirstGrant[share] = s.Now
				}
				s.GrantsOrder = append(s.GrantsOrder, g.DTR.ID)
				s.Ends[g.ID] = s.Now.Add(s.TransferTime(share, s.Nth[share]))
				s.Nth[share]++
			} else {
				s.Ends[g.ID] = s.Now // processing is instant here
			}
		}
		// Account the step, then let time pass and finish what is due.
		busy := 0
		for _, g := range s.Held {
			if g.State == dtr.Transferring {
				s.SlotTime[g.DTR.Share] += tick
				busy++
			}
		}
		if busy >= s.Core.Limit(dtr.Transfer) {
			s.BusyTime += tick
		}
		if s.Core.Queued(dtr.Transfer) > 0 {
			s.QueuedTime += tick
		}
		s.Now = s.Now.Add(tick)
		var due []string
		for id, at := range s.Ends {
			if !at.After(s.Now) {
				due = append(due, id)
			}
		}
		sort.Strings(due)
		for _, id := range due {
			g := s.Held[id]
			delete(s.Held, id)
			delete(s.Ends, id)
			r := core.Result{DTR: g.DTR.ID, Grant: g.ID}
			if s.Bytes != nil && g.State == dtr.Transferring {
				r.Bytes = s.Bytes(g.DTR.Share)
				s.Moved[g.DTR.Share] += r.Bytes
			}
			if err := s.Core.Result(s.Now, r); err != nil {
				s.T.Fatal(err)
			}
		}
	}
}

// QueuedIn counts a share's DTRs waiting in a state.
func (s *Sim) QueuedIn(state dtr.State, share string) int {
	stats, _ := s.Core.Shares()
	n := 0
	for _, st := range stats {
		if st.State == state && strings.HasPrefix(st.Share, share) {
			n += st.Queued
		}
	}
	return n
}

// Running counts a share's transfers in progress.
func (s *Sim) Running(share string) int {
	n := 0
	for _, g := range s.Held {
		if g.State == dtr.Transferring && strings.HasPrefix(g.DTR.Share, share) {
			n++
		}
	}
	return n
}
