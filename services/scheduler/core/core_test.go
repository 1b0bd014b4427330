package core

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
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

// harness drives a core with a fake clock and records what it decided.
type harness struct {
	t     *testing.T
	c     *Core
	now   time.Time
	final map[uuid.UUID]dtr.DTR
	// running holds the grants handed out and not yet answered.
	running map[string]Grant
}

func newHarness(t *testing.T, cfg Config) *harness {
	return &harness{t: t, c: New(cfg), now: t0, final: map[uuid.UUID]dtr.DTR{}, running: map[string]Grant{}}
}

func (h *harness) submit(ds ...*dtr.DTR) {
	for _, d := range ds {
		if err := h.c.Submit(h.now, d); err != nil {
			h.t.Fatalf("submit %s: %v", d.ID, err)
		}
	}
}

// tick advances the clock, ticks the core and returns the new grants.
func (h *harness) tick(d time.Duration) []Grant {
	h.now = h.now.Add(d)
	h.c.Tick(h.now)
	return h.collect().Grants
}

// collect takes the core's decisions and records the grants handed out and
// the DTRs that ended.
func (h *harness) collect() Decisions {
	out := h.c.Take()
	for _, g := range out.Grants {
		h.running[g.ID] = g
	}
	for _, d := range out.Final {
		h.final[d.ID] = *d
	}
	return out
}

// answer returns a result for a running grant.
func (h *harness) answer(g Grant, f *dtr.Failure) {
	delete(h.running, g.ID)
	r := Result{DTR: g.DTR.ID, Grant: g.ID, Error: f, Size: 10, Bytes: 10, Checksum: "adler32:00000001"}
	if err := h.c.Result(h.now, r); err != nil {
		h.t.Fatalf("result for %s in %s: %v", g.ID, g.State, err)
	}
	h.collect()
}

// drain answers every grant successfully until every DTR is final.
func (h *harness) drain() {
	for i := 0; i < 100000; i++ {
		h.tick(50 * time.Millisecond)
		if h.c.Len() == 0 {
			return
		}
		for _, g := range h.running {
			h.answer(g, nil)
		}
	}
	h.t.Fatal("drain did not finish")
}

func TestDTRGoesThroughEveryStageToDone(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	d := newDTR(1, "alice", dtr.Download)
	h.submit(d)
	var states []string
	for len(h.final) == 0 {
		gs := h.tick(time.Second)
		if len(gs) != 1 {
			t.Fatalf("got %d grants, want 1", len(gs))
		}
		states = append(states, gs[0].State.String()+"/"+string(gs[0].Stage))
		h.answer(gs[0], nil)
	}
	want := "[QUERYING_REPLICA/pre PRE_CLEANING/pre TRANSFERRING/delivery REGISTERING_REPLICA/post]"
	if fmt.Sprint(states) != want {
		t.Fatalf("stages = %v, want %s", states, want)
	}
	got := h.final[d.ID]
	if got.State != dtr.Done || got.Share != "_default-download" || got.Priority != 25 || got.Attempts != 1 {
		t.Fatalf("final DTR = %s share %s prio %d attempts %d", got.State, got.Share, got.Priority, got.Attempts)
	}
	if h.c.Len() != 0 {
		t.Fatalf("core still holds %d DTRs", h.c.Len())
	}
}

func TestAShareNotInSharePriorityTakesTheDefaultSharesPriority(t *testing.T) {
	tests := []struct {
		name  string
		prios map[string]int
		vo    string
		dir   dtr.Direction
		share string
		want  int
	}{
		{"a configured share: 60 × 50 / 100", map[string]int{"atlas": 60}, "atlas", dtr.Download, "atlas-download", 30},
		{"a share not configured takes 50", map[string]int{"atlas": 60}, "lhcb", dtr.Download, "lhcb-download", 25},
		{"or the configured _default", map[string]int{"atlas": 60, DefaultShare: 20}, "lhcb", dtr.Download, "lhcb-download", 10},
		{"a sub-share may be configured on its own", map[string]int{"lhcb-upload": 90}, "lhcb", dtr.Upload, "lhcb-upload", 45},
		{"and its other direction then takes the default", map[string]int{"lhcb-upload": 90}, "lhcb", dtr.Download, "lhcb-download", 25},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.SharePolicy, cfg.SharePriority = PolicyVOMSVO, tt.prios
			h := newHarness(t, cfg)
			d := newDTR(1, "x", tt.dir)
			d.Owner.FQANs = []string{"/" + tt.vo}
			h.submit(d)
			got, _ := h.c.Get(d.ID)
			if got.Share != tt.share || got.Priority != tt.want {
				t.Fatalf("share %q at priority %d, want %q at %d", got.Share, got.Priority, tt.share, tt.want)
			}
		})
	}
}

func TestCountsFollowGrantsRetriesLeaseExpiriesAndEnds(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery, cfg.MaxProcessor, cfg.MaxEmergency = 1, 10, 0
	cfg.Lease = time.Minute
	cfg.RetryBase = time.Second
	cfg.MaxTransferTries = 2
	h := newHarness(t, cfg)
	ok, retried, lost := newDTR(1, "/CN=a", dtr.Download), newDTR(2, "/CN=a", dtr.Download), newDTR(3, "/CN=a", dtr.Download)
	h.submit(ok, retried, lost)
	failOnce := true
	for i := 0; i < 1000 && h.c.Len() > 0; i++ {
		for _, g := range h.tick(100 * time.Millisecond) {
			switch {
			case g.DTR.ID == lost.ID && g.State == dtr.Transferring:
				delete(h.running, g.ID) // its worker dies: only the lease ends it
			case g.DTR.ID == retried.ID && g.State == dtr.Transferring && failOnce:
				failOnce = false
				h.answer(g, &dtr.Failure{Kind: dtr.ErrTemporaryRemote, State: dtr.Transferring, Text: "503"})
			default:
				h.answer(g, nil)
			}
		}
		if i%100 == 99 {
			h.now = h.now.Add(time.Minute) // past every lease
		}
	}
	got := h.c.Counts()
	// One retry after a failure, one after the first lease expiry; the
	// second expiry spends the last attempt.
	if got.Retries != 2 || got.LeaseExpiries != 2 || got.Done != 2 || got.Failed != 1 || got.Cancelled != 0 {
		t.Fatalf("counts %+v: want 2 retries, 2 lease expiries, 2 done, 1 failed", got)
	}
	if got.Grants == 0 || got.EmergencyGrants != 0 {
		t.Fatalf("grants %d (emergency %d): want some, none on emergency slots", got.Grants, got.EmergencyGrants)
	}
}
