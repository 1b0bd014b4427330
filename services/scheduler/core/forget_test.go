package core

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// copyRecord copies a DTR record deeply: what Take hands out points into
// the core, and Restore keeps the record it is given.
func copyRecord(d *dtr.DTR) *dtr.DTR {
	cp := *d
	if d.Error != nil {
		f := *d.Error
		cp.Error = &f
	}
	cp.Replicas = slices.Clone(d.Replicas)
	cp.Owner.FQANs = slices.Clone(d.Owner.FQANs)
	return &cp
}

// records returns copies of every DTR a core holds, sorted by id.
func records(c *Core) []*dtr.DTR {
	var out []*dtr.DTR
	for _, d := range c.DTRs() {
		out = append(out, copyRecord(&d))
	}
	sort.Slice(out, func(i, j int) bool { return bytes.Compare(out[i].ID[:], out[j].ID[:]) < 0 })
	return out
}

// observed is everything a core shows of its DTRs at now, its public
// answers and its indexes, as text to compare.
func observed(t *testing.T, c *Core, now time.Time) string {
	t.Helper()
	type why struct {
		Why Why
		Err string
	}
	var o struct {
		Len      int
		Shares   []ShareStats
		Retrying map[string]int
		Queued   map[string]int
		DTRs     []*dtr.DTR
		Owners   map[string]OwnerUse
		Explain  []why
		// The indexes behind them.
		Active, Delayed, Dirty int
		Pins                   map[string]int
		PinPrios               map[string][101]int32
		Hosts                  map[string]int
		Caching                map[string]string
		Pending                int
	}
	o.Len = c.Len()
	o.Shares, o.Retrying = c.Shares()
	o.Queued = map[string]int{}
	for _, s := range dtr.QueueStates {
		o.Queued[s.String()] = c.Queued(s)
	}
	o.DTRs = records(c)
	o.Owners = map[string]OwnerUse{}
	for _, d := range o.DTRs {
		o.Owners[d.Owner.DN] = c.Owner(d.Owner.DN)
		w, err := c.Explain(now, d.ID)
		var msg string
		if err != nil {
			msg = err.Error()
		}
		o.Explain = append(o.Explain, why{w, msg})
	}
	o.Active, o.Delayed, o.Dirty = len(c.active), len(c.delayed), len(c.dirty)
	o.Pins, o.PinPrios = map[string]int{}, map[string][101]int32{}
	for share, p := range c.pins.byShare {
		o.Pins[share], o.PinPrios[share] = p.n, p.byPrio
	}
	o.Hosts = map[string]int{}
	for h, n := range c.hosts.running {
		o.Hosts[c.names[h-1]] = n
	}
	o.Caching = map[string]string{}
	for src, e := range c.caching {
		o.Caching[src] = c.peekEntry(e).ID.String()
	}
	o.Pending = len(c.out.Grants) + len(c.out.CancelRunning) + len(c.out.Final)
	b, err := json.MarshalIndent(o, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// pending counts decisions.
func pending(out Decisions) string {
	return fmt.Sprintf("%d grants, %d changed, %d final, %d to stop", len(out.Grants), len(out.Changed), len(out.Final), len(out.CancelRunning))
}

func asJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// firstDiff returns the first line where two texts differ, with context.
func firstDiff(a, b string) string {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < max(len(la), len(lb)); i++ {
		var x, y string
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if x != y {
			lo := max(0, i-8)
			return fmt.Sprintf("line %d:\n  want %s\n  got  %s\nwant from line %d:\n%s\ngot:\n%s", i+1, x, y, lo+1,
				strings.Join(la[lo:min(len(la), i+4)], "\n"), strings.Join(lb[lo:min(len(lb), i+4)], "\n"))
		}
	}
	return "no difference"
}

// step drives a core one way: the clock moves on by dt, it ticks, and
// every DTR that holds a grant is answered with success, in id order. It
// returns the decisions of the tick and those of the answers, as text.
func step(t *testing.T, c *Core, now time.Time) string {
	t.Helper()
	c.Tick(now)
	var out []Decisions
	out = append(out, c.Take())
	for _, d := range records(c) {
		if !d.State.IsActive() {
			continue
		}
		r := Result{DTR: d.ID, Grant: d.Grant, Size: 10, Bytes: 10, Checksum: "adler32:00000001"}
		if err := c.Result(now, r); err != nil {
			t.Fatalf("result for %s in %s: %v", d.ID, d.State, err)
		}
		out = append(out, c.Take())
	}
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// place drives a leader harness until one of its DTRs rests where a case
// wants it. respond answers a grant: nil holds it (its worker works on).
type place struct {
	name  string
	cfg   func() Config
	dtrs  func() []*dtr.DTR
	steps int
	dt    time.Duration
	// respond answers the grants in step i; a nil result holds the grant.
	respond func(i int, g Grant) *Result
	// then, if set, acts on the leader after its steps (a cancel).
	then func(h *harness)
	// holds reports whether the leader holds the DTR in the place.
	holds func(h *harness) bool
}

func ok(g Grant) *Result {
	return &Result{DTR: g.DTR.ID, Grant: g.ID, Size: 10, Bytes: 10, Checksum: "adler32:00000001"}
}

func holdIn(s dtr.State) func(int, Grant) *Result {
	return func(_ int, g Grant) *Result {
		if g.State == s {
			return nil
		}
		return ok(g)
	}
}

// holdsIn reports whether a DTR of the leader is in state s, and further
// (if set) is true of it.
func holdsIn(s dtr.State, further func(h *harness, d dtr.DTR) bool) func(h *harness) bool {
	return func(h *harness) bool {
		for _, d := range h.c.DTRs() {
			if d.State == s && (further == nil || further(h, d)) {
				return true
			}
		}
		return false
	}
}

// lead drives a leader to the place and returns it with the records it
// held after each step before the last, the earlier records a standby
// may hold.
func (p place) lead(t *testing.T) (h *harness, earlier [][]*dtr.DTR) {
	cfg := DefaultConfig()
	if p.cfg != nil {
		cfg = p.cfg()
	}
	h = newHarness(t, cfg)
	h.submit(p.dtrs()...)
	dt := p.dt
	if dt == 0 {
		dt = time.Second
	}
	for i := 0; i < p.steps; i++ {
		for _, g := range h.tick(dt) {
			r := p.respond(i, g)
			if r == nil {
				continue
			}
			delete(h.running, g.ID)
			if err := h.c.Result(h.now, *r); err != nil {
				t.Fatalf("result for %s in %s: %v", g.DTR.ID, g.State, err)
			}
			h.collect()
		}
		earlier = append(earlier, records(h.c))
	}
	if p.then != nil {
		p.then(h)
		h.collect()
	}
	if !p.holds(h) {
		t.Fatalf("the leader does not hold a DTR %s: %s", p.name, observed(t, h.c, h.now))
	}
	return h, earlier
}

func forgetPlaces() []place {
	three := func() []*dtr.DTR {
		return []*dtr.DTR{newDTR(1, "alice", dtr.Download), newDTR(2, "alice", dtr.Download), newDTR(3, "bob", dtr.Upload)}
	}
	narrow := func() Config {
		cfg := DefaultConfig()
		cfg.MaxProcessor, cfg.MaxDelivery, cfg.MaxEmergency = 1, 1, 0
		cfg.MaxPerHost = 1
		return cfg
	}
	packed := func(h *harness, d dtr.DTR) bool { return h.c.dtrs[d.ID].d == nil }
	staged := func() []*dtr.DTR {
		return []*dtr.DTR{stagedDTR(1, "alice", 50), stagedDTR(2, "alice", 60), stagedDTR(3, "alice", 40)}
	}
	sameFile := func() []*dtr.DTR {
		return []*dtr.DTR{newDTR(1, "alice", dtr.Download), newDTR(3, "bob", dtr.Download)}
	}
	waitForIt := func(h *harness) {
		b := newDTR(2, "alice", dtr.Download)
		b.Source = newDTR(1, "alice", dtr.Download).Source
		b.UserPriority = 80 // its wait raises the download's priority
		h.submit(b)
	}
	return []place{
		{
			name: "queued and packed", cfg: narrow, dtrs: three, steps: 2,
			respond: holdIn(dtr.QueryingReplica),
			holds:   holdsIn(dtr.QueryReplica, packed),
		},
		{
			name: "active in pre-processing", cfg: narrow, dtrs: three, steps: 3,
			respond: holdIn(dtr.PreCleaning),
			holds:   holdsIn(dtr.PreCleaning, nil),
		},
		{
			name: "active in delivery", cfg: narrow, dtrs: three, steps: 6,
			respond: holdIn(dtr.Transferring),
			holds:   holdsIn(dtr.Transferring, nil),
		},
		{
			name: "active in post-processing", cfg: narrow, dtrs: three, steps: 8,
			respond: holdIn(dtr.RegisteringReplica),
			holds:   holdsIn(dtr.RegisteringReplica, nil),
		},
		{
			name: "cancelled while transferring", cfg: narrow, dtrs: three, steps: 6,
			respond: holdIn(dtr.Transferring),
			then: func(h *harness) {
				for _, g := range h.running {
					if err := h.c.Cancel(h.now, g.DTR.ID); err != nil {
						h.t.Fatal(err)
					}
				}
			},
			holds: holdsIn(dtr.TransferringCancel, nil),
		},
		{
			name: "pinned, with another waiting for MaxPrepared",
			cfg: func() Config {
				cfg := DefaultConfig()
				cfg.MaxPrepared, cfg.MaxEmergency = 1, 0
				return cfg
			},
			dtrs: staged, steps: 6,
			respond: holdIn(dtr.Transferring),
			holds: holdsIn(dtr.Transferring, func(h *harness, d dtr.DTR) bool {
				return h.c.dtrs[d.ID].pinned && h.c.Queued(dtr.StagePrepare) > 0
			}),
		},
		{
			name: "downloading into the cache, another waiting for it",
			cfg:  cacheConfig, dtrs: sameFile, steps: 4,
			respond: func(_ int, g Grant) *Result {
				switch g.State {
				case dtr.Transferring:
					return nil
				case dtr.CheckingCache:
					r := ok(g)
					r.Cache, r.CacheFile = dtr.CacheDownload, "file:///cache/"+g.DTR.Source
					return r
				}
				return ok(g)
			},
			then:  waitForIt,
			holds: holdsIn(dtr.CacheWait, func(h *harness, d dtr.DTR) bool { return len(h.c.caching) > 0 }),
		},
		{
			name: "waiting for a retry",
			cfg: func() Config {
				cfg := DefaultConfig()
				cfg.RetryBase = 10 * time.Minute
				return cfg
			},
			dtrs: three, steps: 8,
			respond: func(_ int, g Grant) *Result {
				r := ok(g)
				if g.State == dtr.Transferring && g.DTR.ID == newDTR(1, "alice", dtr.Download).ID {
					r.Error = &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "503"}
				}
				return r
			},
			holds: holdsIn(dtr.New, func(_ *harness, d dtr.DTR) bool { return !d.NextProcess.IsZero() }),
		},
		{
			name: "waiting to finalise again",
			cfg: func() Config {
				cfg := DefaultConfig()
				cfg.RetryBase = 10 * time.Minute
				return cfg
			},
			dtrs: three, steps: 8,
			respond: func(_ int, g Grant) *Result {
				r := ok(g)
				if g.State == dtr.RegisteringReplica && g.DTR.ID == newDTR(2, "alice", dtr.Download).ID {
					r.Error = &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "disk full"}
				}
				return r
			},
			holds: holdsIn(dtr.CacheProcessed, func(_ *harness, d dtr.DTR) bool { return !d.NextProcess.IsZero() }),
		},
	}
}

// A standby core that restored earlier records and then forgets and
// restores each DTR with its latest record holds the same as a core that
// restored only the latest records, and goes on to decide the same.
func TestForgetThenRestoreIsLikeRestoringTheLatestRecordOnly(t *testing.T) {
	for _, p := range forgetPlaces() {
		t.Run(p.name, func(t *testing.T) {
			leader, snaps := p.lead(t)
			for i, earlier := range snaps {
				t.Run(fmt.Sprintf("holding the records of step %d", i), func(t *testing.T) {
					forgetAndRestore(t, p, leader, earlier)
				})
			}
		})
	}
}

// forgetAndRestore checks that a standby that holds earlier records and
// forgets and restores each of the leader's latest ones is like a core
// that restored the latest only.
func forgetAndRestore(t *testing.T, p place, leader *harness, earlier []*dtr.DTR) {
	latest := records(leader.c)
	now := leader.now
	cfg := leader.c.Config()

	// Both cores started an hour before the leader's records came.
	// (Times in a core count from the first it computes, and a
	// grant at that very instant is taken for no grant in the
	// average of how long grants take: a core's first tick keeps
	// the two cores' averages alike.)
	before := now.Add(-time.Hour)
	plain := New(cfg)
	plain.Tick(before)
	for _, d := range latest {
		if err := plain.Restore(now, copyRecord(d)); err != nil {
			t.Fatal(err)
		}
	}

	// The standby held earlier records, and had gone on with them
	// on its own (grants and changes not yet taken) before it
	// learnt the latest ones.
	standby := New(cfg)
	standby.Tick(before)
	for _, d := range earlier {
		if err := standby.Restore(before, copyRecord(d)); err != nil {
			t.Fatal(err)
		}
	}
	standby.Tick(before)
	for _, d := range earlier {
		if !slices.ContainsFunc(latest, func(l *dtr.DTR) bool { return l.ID == d.ID }) {
			if !standby.Forget(d.ID) {
				t.Fatalf("Forget(%s) of a DTR it held = false", d.ID)
			}
		}
	}
	counts := standby.Counts()
	for _, d := range latest {
		held := slices.ContainsFunc(earlier, func(e *dtr.DTR) bool { return e.ID == d.ID })
		if got := standby.Forget(d.ID); got != held {
			t.Fatalf("Forget(%s) = %v, want %v", d.ID, got, held)
		}
		if err := standby.Restore(now, copyRecord(d)); err != nil {
			t.Fatal(err)
		}
	}
	if got := standby.Counts(); got != counts {
		t.Fatalf("Forget changed the counts: %+v, were %+v", got, counts)
	}
	if want, got := observed(t, plain, now), observed(t, standby, now); want != got {
		t.Fatalf("after Forget and Restore the standby differs from a plain restore at %s", firstDiff(want, got))
	}
	if want, got := pending(plain.Take()), pending(standby.Take()); want != got {
		t.Fatalf("decisions pending after restore: plain %s, standby %s", want, got)
	}
	dt := time.Second
	if p.name == "waiting for a retry" || p.name == "waiting to finalise again" {
		dt = time.Minute
	}
	for i := 0; i < 200 && plain.Len() > 0; i++ {
		now = now.Add(dt)
		want, got := step(t, plain, now), step(t, standby, now)
		if want != got {
			t.Fatalf("step %d: decisions differ:\n  plain   %s\n  standby %s", i, want, got)
		}
		if want, got := observed(t, plain, now), observed(t, standby, now); want != got {
			t.Fatalf("step %d: the cores differ at %s", i, firstDiff(want, got))
		}
	}
	if plain.Len() != 0 {
		t.Fatalf("the plain core still holds %d DTRs", plain.Len())
	}
}

func TestForgetRemovesTheDTRAndDecidesNothing(t *testing.T) {
	narrow := func() Config {
		cfg := DefaultConfig()
		cfg.MaxProcessor, cfg.MaxDelivery, cfg.MaxEmergency = 1, 1, 0
		return cfg
	}
	// Each case submits DTRs of its own: the core keeps what it is given.
	two := func() (*dtr.DTR, *dtr.DTR) { return newDTR(1, "alice", dtr.Download), newDTR(2, "alice", dtr.Download) }
	tests := []struct {
		name string
		cfg  func() Config
		run  func(t *testing.T, h *harness)
	}{
		{"an unknown DTR is not held and nothing changes", narrow, func(t *testing.T, h *harness) {
			h.submit(newDTR(1, "alice", dtr.Download), newDTR(2, "bob", dtr.Upload))
			h.tick(time.Second)
			before := observed(t, h.c, h.now)
			if h.c.Forget(uuid.NewSHA1(uuid.NameSpaceOID, []byte("never submitted"))) {
				t.Fatal("Forget of an unknown DTR = true")
			}
			if got := observed(t, h.c, h.now); got != before {
				t.Fatalf("Forget of an unknown DTR changed the core at %s", firstDiff(before, got))
			}
		}},
		{"a forgotten DTR is not held any more", narrow, func(t *testing.T, h *harness) {
			h.submit(newDTR(1, "alice", dtr.Download))
			h.tick(time.Second)
			id := newDTR(1, "alice", dtr.Download).ID
			if !h.c.Forget(id) {
				t.Fatal("Forget of a held DTR = false")
			}
			if h.c.Forget(id) {
				t.Fatal("a second Forget = true")
			}
			if _, ok := h.c.Get(id); ok || h.c.Len() != 0 || h.c.Owner("alice") != (OwnerUse{}) {
				t.Fatalf("after Forget: held %v, %d DTRs, alice holds %+v", ok, h.c.Len(), h.c.Owner("alice"))
			}
			if stats, retrying := h.c.Shares(); len(stats) != 0 || len(retrying) != 0 {
				t.Fatalf("after Forget the shares are %+v, %v", stats, retrying)
			}
		}},
		{"the counts stay as they are", func() Config {
			cfg := narrow()
			cfg.RetryBase = time.Hour
			return cfg
		}, func(t *testing.T, h *harness) {
			a, b, c := newDTR(1, "alice", dtr.Download), newDTR(2, "alice", dtr.Download), newDTR(3, "bob", dtr.Download)
			h.submit(a, b, c)
			for len(h.final) == 0 {
				for _, g := range h.tick(time.Second) {
					var f *dtr.Failure
					if g.State == dtr.Transferring && g.DTR.ID == a.ID {
						f = &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "503"}
					}
					h.answer(g, f)
				}
			}
			// One waits for a retry, one runs or waits in a queue.
			counts := h.c.Counts()
			for _, id := range []uuid.UUID{a.ID, b.ID, c.ID} {
				h.c.Forget(id)
				if got := h.c.Counts(); got != counts {
					t.Fatalf("Forget changed the counts to %+v from %+v", got, counts)
				}
			}
			if out := h.collect(); len(out.Grants)+len(out.Changed)+len(out.Final)+len(out.CancelRunning) != 0 {
				t.Fatalf("Forget decided %+v", out)
			}
		}},
		{"an active DTR's slot is free for the next", narrow, func(t *testing.T, h *harness) {
			first, second := two()
			h.submit(first, second)
			gs := h.tick(time.Second)
			if len(gs) != 1 || gs[0].DTR.ID != first.ID {
				t.Fatalf("first grants %v, want one to the first DTR", gs)
			}
			if got := h.tick(time.Second); len(got) != 0 {
				t.Fatalf("grants %v while the only slot is held", got)
			}
			h.c.Forget(first.ID)
			gs = h.tick(time.Second)
			if len(gs) != 1 || gs[0].DTR.ID != second.ID || gs[0].State != dtr.QueryingReplica {
				t.Fatalf("after Forget the grants are %v, want the second DTR's", gs)
			}
		}},
		{"a grant decided and not taken is not handed out", narrow, func(t *testing.T, h *harness) {
			first, second := two()
			h.submit(first, second)
			h.collect()
			h.now = h.now.Add(time.Second)
			h.c.Tick(h.now)
			h.c.Forget(first.ID)
			out := h.collect()
			if len(out.Grants) != 0 || len(out.Changed) != 0 {
				t.Fatalf("after Forget Take hands out grants %v and changes %v of a DTR not held", out.Grants, out.Changed)
			}
			// The slot was freed with it: the second DTR gets it.
			if gs := h.tick(time.Second); len(gs) != 1 || gs[0].DTR.ID != second.ID {
				t.Fatalf("then the grants are %v, want the second DTR's", gs)
			}
		}},
		{"a stop decided and not taken is not handed out", narrow, func(t *testing.T, h *harness) {
			first, _ := two()
			h.submit(first)
			h.tick(time.Second)
			if err := h.c.Cancel(h.now, first.ID); err != nil {
				t.Fatal(err)
			}
			h.c.Forget(first.ID)
			if out := h.collect(); len(out.CancelRunning) != 0 || len(out.Changed) != 0 {
				t.Fatalf("after Forget Take stops %v and changes %v", out.CancelRunning, out.Changed)
			}
		}},
		{"a DTR waiting for a forgotten download into the cache checks the cache itself", cacheConfig, func(t *testing.T, h *harness) {
			first, waiter := two()
			waiter.Source = first.Source
			h.submit(first)
			gs := h.tick(time.Second)
			if len(gs) != 1 || gs[0].State != dtr.CheckingCache {
				t.Fatalf("first grants %v, want a cache check", gs)
			}
			delete(h.running, gs[0].ID)
			r := Result{DTR: first.ID, Grant: gs[0].ID, Cache: dtr.CacheDownload, CacheFile: "file:///cache/x"}
			if err := h.c.Result(h.now, r); err != nil {
				t.Fatal(err)
			}
			h.submit(waiter)
			h.collect()
			if got, _ := h.c.Get(waiter.ID); got.State != dtr.CacheWait {
				t.Fatalf("the second DTR for the file is in %s, want CACHE_WAIT", got.State)
			}
			h.c.Forget(first.ID)
			var states []dtr.State
			for range 5 {
				for _, g := range h.tick(time.Second) {
					states = append(states, g.State)
				}
			}
			if len(states) == 0 || states[0] != dtr.CheckingCache {
				t.Fatalf("after Forget of the download the waiter is granted %v, want a cache check", states)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.run(t, newHarness(t, tt.cfg()))
		})
	}
}

// A standby that applies every record a leader journals, in order, with
// Forget then Restore (just Forget for a final record), holds what the
// leader holds after each batch: the same DTRs in the same states, and the
// same queued, running and retrying DTRs in each share.
func TestAStandbyThatAppliesEveryRecordHoldsWhatTheLeaderHolds(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			cfg := DefaultConfig()
			cfg.MaxProcessor, cfg.MaxDelivery, cfg.MaxEmergency = 3, 2, 1
			cfg.MaxPrepared, cfg.MaxPerHost = 2, 2
			cfg.MaxTransferTries = 3
			cfg.RetryBase, cfg.Lease = 2*time.Second, 30*time.Second
			cfg.Cache, cfg.CacheWait = seed%2 == 0, time.Second
			cfg.SharePolicy = PolicyDN
			leader := New(cfg)
			standby := New(cfg)
			now := t0
			standby.PauseLeases(now)
			running := map[string]Grant{}
			var ids []uuid.UUID
			sources := []string{"http://a.example/f", "http://b.example/g", "https://c.example/h"}

			apply := func() {
				out := leader.Take()
				for _, g := range out.Grants {
					running[g.ID] = g
				}
				// The journal: copies of the changed and final records,
				// in the order Take gives them.
				var batch []*dtr.DTR
				for _, d := range out.Changed {
					batch = append(batch, copyRecord(d))
				}
				for _, d := range out.Final {
					batch = append(batch, copyRecord(d))
				}
				for _, d := range batch {
					standby.Forget(d.ID)
					if !d.State.Final() {
						if err := standby.Restore(now, copyRecord(d)); err != nil {
							t.Fatalf("standby restore of %s in %s: %v", d.ID, d.State, err)
						}
					}
				}
				standby.Take()
				compareStandby(t, leader, standby)
			}

			for i := 0; i < 600; i++ {
				switch op := rng.IntN(20); {
				case op < 5: // a new DTR
					n := len(ids)
					dir := []dtr.Direction{dtr.Download, dtr.Upload}[rng.IntN(2)]
					d := newDTR(n, []string{"alice", "bob", "carol"}[rng.IntN(3)], dir)
					if rng.IntN(3) == 0 {
						d.Source = sources[rng.IntN(len(sources))] // a file others fetch too
					}
					d.Options.Stage = rng.IntN(5) == 0
					d.JobID = fmt.Sprintf("job-%d", rng.IntN(4))
					d.UserPriority = 1 + rng.IntN(100)
					if err := leader.Submit(now, d); err != nil {
						t.Fatal(err)
					}
					ids = append(ids, d.ID)
				case op < 12: // a worker answers
					if len(running) == 0 {
						break
					}
					keys := make([]string, 0, len(running))
					for k := range running {
						keys = append(keys, k)
					}
					sort.Strings(keys)
					g := running[keys[rng.IntN(len(keys))]]
					delete(running, g.ID)
					r := Result{DTR: g.DTR.ID, Grant: g.ID, Size: 10, Bytes: 10, Checksum: "adler32:00000001"}
					switch g.State {
					case dtr.CheckingCache:
						r.Cache, r.CacheFile = []string{dtr.CacheDownload, dtr.CacheHit, dtr.CacheLocked, ""}[rng.IntN(4)], "file:///cache/x"
					case dtr.StagingPreparing:
						r.TURL = "file:///stage/x"
					}
					switch k := rng.IntN(10); {
					case k == 0:
						continue // the worker is lost: its lease runs out
					case k == 1:
						r.Returned = true
					case k == 2:
						r.Error = &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "503", Location: dtr.LocationSource}
					case k == 3:
						r.Error = &dtr.Failure{Kind: dtr.ErrPermanentRemote, Text: "404"}
					}
					if err := leader.Result(now, r); err != nil && !errors.Is(err, ErrStaleResult) && !errors.Is(err, ErrUnknownDTR) {
						t.Fatal(err)
					}
				case op < 13 && len(ids) > 0: // a user cancels
					if err := leader.Cancel(now, ids[rng.IntN(len(ids))]); err != nil && !errors.Is(err, ErrUnknownDTR) {
						t.Fatal(err)
					}
				case op < 14 && len(ids) > 0:
					if err := leader.SetPriority(now, ids[rng.IntN(len(ids))], 1+rng.IntN(100)); err != nil && !errors.Is(err, ErrUnknownDTR) {
						t.Fatal(err)
					}
				default:
					dt := time.Duration(1+rng.IntN(3000)) * time.Millisecond
					if rng.IntN(40) == 0 {
						dt = 40 * time.Second // past the leases of lost workers
					}
					now = now.Add(dt)
					leader.Tick(now)
				}
				apply()
			}
			if leader.Counts().Grants == 0 || leader.Counts().Done == 0 {
				t.Fatalf("the leader did little: %+v", leader.Counts())
			}
		})
	}
}

// compareStandby checks that a standby holds the leader's DTRs in the same
// states, and the same load in each share.
func compareStandby(t *testing.T, leader, standby *Core) {
	t.Helper()
	states := func(c *Core) string {
		var b strings.Builder
		for _, d := range records(c) {
			fmt.Fprintf(&b, "%s %s\n", d.ID, d.State)
		}
		return b.String()
	}
	if want, got := states(leader), states(standby); want != got {
		t.Fatalf("the standby's DTRs differ at %s", firstDiff(want, got))
	}
	load := func(c *Core) string {
		var b strings.Builder
		stats, retrying := c.Shares()
		for _, s := range stats {
			fmt.Fprintf(&b, "%s %s queued %d running %d\n", s.State, s.Share, s.Queued, s.Running)
		}
		shares := make([]string, 0, len(retrying))
		for s := range retrying {
			shares = append(shares, s)
		}
		sort.Strings(shares)
		for _, s := range shares {
			fmt.Fprintf(&b, "%s retrying %d\n", s, retrying[s])
		}
		for _, dn := range []string{"alice", "bob", "carol"} {
			fmt.Fprintf(&b, "%s holds %d\n", dn, c.Owner(dn).DTRs)
		}
		for _, s := range dtr.QueueStates {
			fmt.Fprintf(&b, "%s queued %d\n", s, c.Queued(s))
		}
		return b.String()
	}
	if want, got := load(leader), load(standby); want != got {
		t.Fatalf("the standby's load differs at %s", firstDiff(want, got))
	}
}
