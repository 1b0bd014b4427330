package core

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func chainConfig() Config {
	cfg := DefaultConfig()
	cfg.ChainPreClean = true
	cfg.Lease = time.Minute
	return cfg
}

// checkSlotCounts fails unless every state's count of running DTRs, and
// every share's there, is what the core's active grants hold: their own
// slots, and a PRE_CLEAN slot for each chained one.
func checkSlotCounts(t *testing.T, c *Core) {
	t.Helper()
	type key struct {
		s     dtr.State
		share string
	}
	total, byShare, reserved := map[dtr.State]int{}, map[key]int{}, map[string]int{}
	for _, e := range c.active {
		total[e.queued]++
		byShare[key{e.queued, e.d.Share}]++
		if e.d.Chained {
			if e.queued != dtr.QueryReplica {
				t.Errorf("dtr %s is chained in %s", e.d.ID, e.d.State)
			}
			total[dtr.PreClean]++
			byShare[key{dtr.PreClean, e.d.Share}]++
			reserved[e.d.Share]++
		}
	}
	for s, st := range c.states {
		if st.total != total[s] {
			t.Errorf("%s counts %d running, its grants and reservations are %d", s, st.total, total[s])
		}
		for name, ss := range st.shares {
			if ss.running != byShare[key{s, name}] {
				t.Errorf("%s share %s counts %d running, want %d", s, name, ss.running, byShare[key{s, name}])
			}
			if want := map[bool]int{true: reserved[name]}[s == dtr.PreClean]; ss.reserved != want {
				t.Errorf("%s share %s counts %d reserved, want %d", s, name, ss.reserved, want)
			}
		}
	}
	for _, e := range c.dtrs {
		if d := c.peekEntry(e); d.Chained && c.active[d.ID] != e {
			t.Errorf("dtr %s is chained in %s without a grant", d.ID, d.State)
		}
	}
}

// chainedGrant submits d and returns its QUERY_REPLICA grant, which must
// be chained.
func (h *harness) chainedGrant(d *dtr.DTR) Grant {
	h.t.Helper()
	h.submit(d)
	for _, g := range h.tick(time.Second) {
		if g.DTR.ID != d.ID {
			continue
		}
		if g.State != dtr.QueryingReplica || g.Then == nil {
			h.t.Fatalf("grant %s in %s, then %+v: want a chained QUERYING_REPLICA grant", g.ID, g.State, g.Then)
		}
		return g
	}
	h.t.Fatalf("dtr %s not granted", d.ID)
	return Grant{}
}

// chainedResult is a chained grant's result: the query and pre-clean
// both done, or the pre-clean's failure.
func chainedResult(g Grant, preClean *dtr.Failure) Result {
	return Result{DTR: g.DTR.ID, Grant: g.ID, State: g.State, Size: 42,
		Then: &Result{DTR: g.DTR.ID, Grant: g.Then.Grant, State: g.Then.State, Error: preClean}}
}

func TestAChainedGrantRunsQueryAndPreCleanUnderOneGrantAndOneResult(t *testing.T) {
	h := newHarness(t, chainConfig())
	d := newDTR(1, "alice", dtr.Download)
	g := h.chainedGrant(d)
	if g.Then.State != dtr.PreCleaning || g.Then.Grant != grantID(d.ID, 2) || g.ID != grantID(d.ID, 1) {
		t.Fatalf("grant %s then %+v: want PRE_CLEANING under %s", g.ID, g.Then, grantID(d.ID, 2))
	}
	if st := h.c.states[dtr.PreClean]; st.total != 1 {
		t.Fatalf("PRE_CLEAN counts %d running while the chained grant runs, want 1", st.total)
	}
	checkSlotCounts(t, h.c)
	if why, err := h.c.Explain(h.now, d.ID); err != nil || !strings.Contains(why.Reason, "PRE_CLEAN slot") || !strings.Contains(why.Reason, g.Then.Grant) {
		t.Fatalf("why: %q, %v; want it to say the grant holds a PRE_CLEAN slot for %s", why.Reason, err, g.Then.Grant)
	}
	grants := h.c.Counts().Grants

	h.now = h.now.Add(3 * time.Second)
	if err := h.c.Result(h.now, chainedResult(g, nil)); err != nil {
		t.Fatal(err)
	}
	delete(h.running, g.ID)
	dec := h.collect()
	checkSlotCounts(t, h.c)
	if len(dec.Chained) != 1 || dec.Chained[0].ID != g.Then.Grant || dec.Chained[0].State != dtr.PreCleaning {
		t.Fatalf("chained grants decided: %+v, want the PRE_CLEANING one under %s", dec.Chained, g.Then.Grant)
	}
	if got := h.c.Counts().Grants - grants; got != 1 {
		t.Fatalf("the pre-clean counted %d grants, want 1", got)
	}
	got, _ := h.c.Get(d.ID)
	if got.State != dtr.Transfer || got.Size != 42 || got.Grant != g.Then.Grant || got.Chained {
		t.Fatalf("after the chained result: %s size %d grant %s chained %v; want TRANSFER, size 42, grant %s",
			got.State, got.Size, got.Grant, got.Chained, g.Then.Grant)
	}
	gs := h.tick(time.Second)
	if len(gs) != 1 || gs[0].State != dtr.Transferring || gs[0].ID != grantID(d.ID, 3) {
		t.Fatalf("next grants %+v, want its transfer under %s", gs, grantID(d.ID, 3))
	}
	h.drain()
	if f := h.final[d.ID]; f.State != dtr.Done {
		t.Fatalf("ended %s, want DONE", f.State)
	}
	checkSlotCounts(t, h.c)
}

func TestAChainedPreCleanFailureIsThePreCleansOwn(t *testing.T) {
	h := newHarness(t, chainConfig())
	d := newDTR(1, "alice", dtr.Download)
	g := h.chainedGrant(d)
	fail := &dtr.Failure{Kind: dtr.ErrPermanentRemote, Text: "destination exists and overwrite is not set", Location: dtr.LocationDestination}
	if err := h.c.Result(h.now, chainedResult(g, fail)); err != nil {
		t.Fatal(err)
	}
	delete(h.running, g.ID)
	h.drain()
	checkSlotCounts(t, h.c)
	f := h.final[d.ID]
	if f.State != dtr.Error || f.Error == nil || f.Error.State != dtr.PreCleaning || f.Error.Kind != dtr.ErrPermanentRemote {
		t.Fatalf("ended %s with %+v, want ERROR with the pre-clean's error, in PRE_CLEANING", f.State, f.Error)
	}
}

// Each way a chained grant ends without its pre-clean done frees the
// PRE_CLEAN slot it held once, and the DTR goes on as after any such end.
func TestAChainedGrantsPreCleanSlotIsFreedOnceWhenThePreCleanIsNotDone(t *testing.T) {
	cases := []struct {
		name string
		end  func(h *harness, g Grant) // what happens to the running grant
		// state is where the DTR is then (before the next tick).
		state dtr.State
	}{
		{"a worker that knows no chaining sends the query's result alone", func(h *harness, g Grant) {
			h.result(Result{DTR: g.DTR.ID, Grant: g.ID, State: g.State, Size: 42})
		}, dtr.PreClean},
		{"the query fails", func(h *harness, g Grant) {
			r := chainedResult(g, nil)
			r.Error = &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "503", Location: dtr.LocationSource}
			h.result(r)
		}, dtr.New}, // to be tried again
		{"the pre-clean's outcome is under another grant id", func(h *harness, g Grant) {
			r := chainedResult(g, nil)
			r.Then.Grant = grantID(g.DTR.ID, 7)
			h.result(r)
		}, dtr.PreClean},
		{"the worker gives the grant back", func(h *harness, g Grant) {
			h.result(Result{DTR: g.DTR.ID, Grant: g.ID, State: g.State, Returned: true})
		}, dtr.QueryReplica},
		{"its lease runs out (the worker hung)", func(h *harness, g Grant) {
			h.now = h.now.Add(2 * time.Minute)
			h.c.expireLeases(h.now)
		}, dtr.New},
		{"the DTR is cancelled, then its result comes", func(h *harness, g Grant) {
			if err := h.c.Cancel(h.now, g.DTR.ID); err != nil {
				h.t.Fatal(err)
			}
			checkSlotCounts(h.t, h.c)
			if st := h.c.states[dtr.PreClean]; st.total != 0 {
				h.t.Fatalf("PRE_CLEAN counts %d running after the cancel, want 0", st.total)
			}
			h.result(chainedResult(g, nil))
		}, dtr.Cancelled},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, chainConfig())
			d := newDTR(1, "alice", dtr.Download)
			g := h.chainedGrant(d)
			delete(h.running, g.ID)
			tc.end(h, g)
			dec := h.collect()
			checkSlotCounts(t, h.c)
			if st := h.c.states[dtr.PreClean]; st.total != 0 || len(st.shares) != st.waiting() {
				t.Fatalf("PRE_CLEAN counts %d running in %d shares, %d waiting; want none running, no share left without a DTR", st.total, len(st.shares), st.waiting())
			}
			if len(dec.Chained) != 0 {
				t.Fatalf("a pre-clean was applied: %+v", dec.Chained)
			}
			state := dtr.Cancelled
			if got, ok := h.c.Get(d.ID); ok {
				state = got.State
				if got.Chained {
					t.Fatal("the DTR is still marked chained")
				}
			}
			if state != tc.state {
				t.Fatalf("the DTR is in %s, want %s", state, tc.state)
			}
			// A result of the chained grant that comes again applies
			// nothing and frees nothing.
			before := h.c.states[dtr.PreClean].total
			if err := h.c.Result(h.now, chainedResult(g, nil)); !errors.Is(err, ErrStaleResult) && !errors.Is(err, ErrUnknownDTR) {
				t.Fatalf("the old result again: %v, want it refused", err)
			}
			if h.c.states[dtr.PreClean].total != before {
				t.Fatal("a refused result changed PRE_CLEAN's count")
			}
			checkSlotCounts(t, h.c)
			h.drain()
			checkSlotCounts(t, h.c)
			for s, st := range h.c.states {
				if st.total != 0 {
					t.Fatalf("%s counts %d running once every DTR ended", s, st.total)
				}
			}
		})
	}
}

// result applies a worker's result, which must be taken.
func (h *harness) result(r Result) {
	h.t.Helper()
	if err := h.c.Result(h.now, r); err != nil {
		h.t.Fatalf("result for %s: %v", r.Grant, err)
	}
}

func TestAStaleChainedResultAppliesNothing(t *testing.T) {
	t.Run("redelivered after it was applied", func(t *testing.T) {
		h := newHarness(t, chainConfig())
		d := newDTR(1, "alice", dtr.Download)
		g := h.chainedGrant(d)
		h.result(chainedResult(g, nil))
		h.collect()
		before, _ := h.c.Get(d.ID)
		counts := h.c.Counts()
		err := h.c.Result(h.now, chainedResult(g, nil))
		if !errors.Is(err, ErrStaleResult) {
			t.Fatalf("redelivered chained result: %v, want ErrStaleResult", err)
		}
		if dec := h.collect(); len(dec.Chained) != 0 || len(dec.Changed) != 0 {
			t.Fatalf("a redelivered result decided %d pre-cleans and changed %d DTRs", len(dec.Chained), len(dec.Changed))
		}
		after, _ := h.c.Get(d.ID)
		if after.State != before.State || after.Grant != before.Grant || h.c.Counts() != counts {
			t.Fatalf("a redelivered result changed the DTR: %s %s, was %s %s", after.State, after.Grant, before.State, before.Grant)
		}
		checkSlotCounts(t, h.c)
	})
	t.Run("from a worker frozen past its lease, after the DTR was granted again", func(t *testing.T) {
		h := newHarness(t, chainConfig())
		d := newDTR(1, "alice", dtr.Download)
		old := h.chainedGrant(d)
		delete(h.running, old.ID)
		h.now = h.now.Add(2 * time.Minute) // the worker froze
		var again Grant
		for i := 0; i < 1000 && again.ID == ""; i++ {
			for _, g := range h.tick(5 * time.Second) {
				if g.State == dtr.QueryingReplica {
					again = g
					delete(h.running, g.ID)
				} else {
					h.answer(g, nil)
				}
			}
		}
		if again.ID == "" || again.Then == nil || again.Then.Grant == old.Then.Grant {
			t.Fatalf("granted again as %+v, want a chained grant of its own", again)
		}
		checkSlotCounts(t, h.c)
		// The frozen worker resumes and sends its old result.
		if err := h.c.Result(h.now, chainedResult(old, nil)); !errors.Is(err, ErrStaleResult) {
			t.Fatalf("the frozen worker's result: %v, want ErrStaleResult", err)
		}
		if st := h.c.states[dtr.PreClean]; st.total != 1 {
			t.Fatalf("PRE_CLEAN counts %d running, want the new grant's 1", st.total)
		}
		checkSlotCounts(t, h.c)
		h.result(chainedResult(again, nil))
		h.drain()
		if f := h.final[d.ID]; f.State != dtr.Done || f.Attempts != 2 {
			t.Fatalf("ended %s after %d attempts, want DONE after 2", f.State, f.Attempts)
		}
		checkSlotCounts(t, h.c)
	})
}

func TestAGrantIsChainedOnlyWhenPreCleanCanTakeTheDTRAtOnce(t *testing.T) {
	cases := []struct {
		name string
		// setup prepares the core; then d is granted QUERY_REPLICA.
		setup func(h *harness)
		cfg   func(*Config)
		want  bool
	}{
		{"PRE_CLEAN has a free slot and nothing waits", func(h *harness) {}, nil, true},
		{"chaining is off", func(h *harness) {}, func(c *Config) { c.ChainPreClean = false }, false},
		{"every PRE_CLEAN slot is held", func(h *harness) {
			// One DTR pre-cleaning holds the only slot.
			mustSetLimit(h, dtr.PreClean, 1)
			h.submit(newDTR(9, "bob", dtr.Download))
			for _, g := range h.tick(time.Second) {
				h.result(Result{DTR: g.DTR.ID, Grant: g.ID, State: g.State, Size: 1}) // the query alone
			}
			h.tick(time.Second) // its pre-clean is granted, the emergency slot unused
		}, nil, false},
		{"a DTR waits in PRE_CLEAN", func(h *harness) {
			// Two queries answered alone: the second waits for the one
			// PRE_CLEAN slot until the first is pre-cleaned; then that one
			// is freed, and the waiting DTR is first to it.
			mustSetLimit(h, dtr.PreClean, 1)
			h.c.cfg.MaxEmergency = 0
			h.submit(newDTR(8, "bob", dtr.Download), newDTR(9, "bob", dtr.Download))
			for _, g := range h.tick(time.Second) {
				h.result(Result{DTR: g.DTR.ID, Grant: g.ID, State: g.State, Size: 1})
			}
			for _, g := range h.tick(time.Second) {
				h.result(Result{DTR: g.DTR.ID, Grant: g.ID, State: g.State})
			}
			h.collect()
			if st := h.c.states[dtr.PreClean]; st.total != 0 || st.waiting() != 1 {
				h.t.Fatalf("setup: PRE_CLEAN runs %d and has %d waiting, want 0 and 1", st.total, st.waiting())
			}
		}, nil, false},
		{"the DTR goes on to the next replica after its source failed", func(h *harness) {}, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := chainConfig()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			h := newHarness(t, cfg)
			tc.setup(h)
			d := newDTR(1, "alice", dtr.Download)
			if tc.name == "the DTR goes on to the next replica after its source failed" {
				d.Replicas = []string{"http://other.example/f"}
				h.submit(d)
				g := h.tick(time.Second)[0]
				h.result(Result{DTR: d.ID, Grant: g.ID, State: g.State, Error: &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "gone", Location: dtr.LocationSource}})
				h.collect()
				// Its source failed: it goes to the next replica's query, its
				// error cleared, so that query goes on to PRE_CLEAN too.
			} else {
				h.submit(d)
			}
			var got *Grant
			for _, g := range h.tick(time.Second) {
				if g.DTR.ID == d.ID && g.State == dtr.QueryingReplica {
					got = &g
				}
			}
			if got == nil {
				t.Fatal("no QUERY_REPLICA grant")
			}
			if chained := got.Then != nil; chained != tc.want {
				t.Fatalf("chained %v, want %v", chained, tc.want)
			}
			checkSlotCounts(t, h.c)
			if l := h.c.Limit(dtr.PreClean); h.c.states[dtr.PreClean].total > l {
				t.Fatalf("PRE_CLEAN runs %d, above its limit %d", h.c.states[dtr.PreClean].total, l)
			}
		})
	}
}

func mustSetLimit(h *harness, s dtr.State, n int) {
	h.t.Helper()
	if err := h.c.SetLimit(s, n); err != nil {
		h.t.Fatal(err)
	}
}

// A scheduler restarted (or a standby taking over) restores a running
// chained grant from its record with its PRE_CLEAN slot, once however
// often the record is applied, and the chained result is taken.
func TestARestoredChainedGrantHoldsItsPreCleanSlotAgain(t *testing.T) {
	cases := []struct {
		name string
		end  func(h *harness, g Grant)
		done bool // whether the pre-clean was applied
	}{
		{"its chained result comes", func(h *harness, g Grant) { h.result(chainedResult(g, nil)) }, true},
		{"its lease runs out", func(h *harness, g Grant) {
			h.now = h.now.Add(2 * time.Minute)
			h.c.expireLeases(h.now)
		}, false},
		{"its query's result comes alone", func(h *harness, g Grant) {
			h.result(Result{DTR: g.DTR.ID, Grant: g.ID, State: g.State})
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			leader := newHarness(t, chainConfig())
			d := newDTR(1, "alice", dtr.Download)
			g := leader.chainedGrant(d)
			record, _ := leader.c.Get(d.ID)
			if !record.Chained {
				t.Fatal("the running chained grant's record is not marked chained")
			}
			// Its successor restores the record as recover.go does (packed),
			// a standby as standby.go does (Forget, then Restore, again and
			// again as records come).
			h := newHarness(t, chainConfig())
			h.now = leader.now
			if err := h.c.RestorePacked(h.now, h.c.Pack(&record), 0); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				h.c.Forget(d.ID)
				again := record
				if err := h.c.Restore(h.now, &again); err != nil {
					t.Fatal(err)
				}
			}
			h.collect()
			checkSlotCounts(t, h.c)
			if st := h.c.states[dtr.PreClean]; st.total != 1 {
				t.Fatalf("PRE_CLEAN counts %d running after the restore, want 1", st.total)
			}
			tc.end(h, g)
			dec := h.collect()
			checkSlotCounts(t, h.c)
			if applied := len(dec.Chained) == 1; applied != tc.done {
				t.Fatalf("pre-clean applied %v, want %v", applied, tc.done)
			}
			h.drain()
			checkSlotCounts(t, h.c)
			if st := h.c.states[dtr.PreClean]; st.total != 0 {
				t.Fatalf("PRE_CLEAN counts %d running once the DTR ended", st.total)
			}
		})
	}
}

// Forget drops a chained grant's PRE_CLEAN slot with it.
func TestForgettingAChainedGrantFreesItsPreCleanSlot(t *testing.T) {
	h := newHarness(t, chainConfig())
	d := newDTR(1, "alice", dtr.Download)
	h.chainedGrant(d)
	if !h.c.Forget(d.ID) {
		t.Fatal("not forgotten")
	}
	checkSlotCounts(t, h.c)
	if st := h.c.states[dtr.PreClean]; st.total != 0 || len(st.shares) != 0 {
		t.Fatalf("PRE_CLEAN counts %d running in %d shares after Forget", st.total, len(st.shares))
	}
}

// With chaining, no state runs more than its limit and emergency slots,
// and every share's part of the slots holds, over a run of many DTRs of
// two shares with some queries answered by workers that do not chain.
func TestChainingKeepsEveryLimit(t *testing.T) {
	cfg := chainConfig()
	cfg.MaxProcessor = 3
	h := newHarness(t, cfg)
	for i := range 40 {
		dn := "alice"
		if i%3 == 0 {
			dn = "bob"
		}
		h.submit(newDTR(i, dn, dtr.Download))
	}
	chained := 0
	for step := 0; h.c.Len() > 0; step++ {
		if step > 10000 {
			t.Fatal("did not finish")
		}
		h.tick(50 * time.Millisecond)
		for s, st := range h.c.states {
			if l := h.c.Limit(s) + h.c.cfg.MaxEmergency; st.total > l {
				t.Fatalf("%s runs %d, above %d", s, st.total, l)
			}
		}
		checkSlotCounts(t, h.c)
		n := 0
		for id, g := range h.running {
			n++
			if n%2 == 0 {
				continue // answered at a later step
			}
			delete(h.running, id)
			if g.Then != nil && n%3 != 0 {
				chained++
				h.result(chainedResult(g, nil))
				h.collect()
				continue
			}
			h.answer(g, nil)
		}
	}
	if chained == 0 {
		t.Fatal("no grant was chained")
	}
	checkSlotCounts(t, h.c)
}

func TestTheSharesCountAChainedDTROnceAndItsReservationApart(t *testing.T) {
	h := newHarness(t, chainConfig())
	d := newDTR(1, "alice", dtr.Download)
	g := h.chainedGrant(d)
	count := func() (running, reserved int) {
		stats, _ := h.c.Shares()
		for _, st := range stats {
			running += st.Queued + st.Running
			reserved += st.Reserved
		}
		return running, reserved
	}
	if running, reserved := count(); running != 1 || reserved != 1 {
		t.Fatalf("while the chained grant runs the shares count %d DTRs and %d reserved, want 1 and 1", running, reserved)
	}
	checkSlotCounts(t, h.c)
	h.result(chainedResult(g, nil))
	checkSlotCounts(t, h.c)
	if _, reserved := count(); reserved != 0 {
		t.Fatalf("after the result the shares count %d reserved, want 0", reserved)
	}
}

func TestADTRWaitingInPreCleanTakesTheSlotAChainedQueryStillRunningHolds(t *testing.T) {
	cfg := chainConfig()
	cfg.MaxEmergency = 0
	h := newHarness(t, cfg)
	mustSetLimit(h, dtr.PreClean, 1)
	a, b := newDTR(1, "alice", dtr.Download), newDTR(2, "bob", dtr.Download)
	h.submit(a, b)
	var ga, gb Grant
	for _, g := range h.tick(time.Second) {
		switch g.DTR.ID {
		case a.ID:
			ga = g
		case b.ID:
			gb = g
		}
	}
	if ga.Then == nil || gb.Then != nil {
		t.Fatalf("a chained %v, b chained %v: want only a's grant chained (one PRE_CLEAN slot)", ga.Then != nil, gb.Then != nil)
	}
	h.result(Result{DTR: b.ID, Grant: gb.ID, State: gb.State, Size: 1}) // b's query ends first
	var bPreClean bool
	for _, g := range h.tick(time.Second) {
		bPreClean = bPreClean || g.DTR.ID == b.ID && g.State == dtr.PreCleaning
	}
	checkSlotCounts(t, h.c)
	if !bPreClean {
		bd, _ := h.c.Get(b.ID)
		t.Fatalf("b waits in %s behind a's chained query: want the PRE_CLEAN slot a's grant held", bd.State)
	}
	// a's query ends with its pre-clean done: the outcome is ignored, and
	// a queues for PRE_CLEAN as after any query.
	h.now = h.now.Add(30 * time.Second)
	h.result(chainedResult(ga, nil))
	checkSlotCounts(t, h.c)
	if ad, _ := h.c.Get(a.ID); ad.State != dtr.PreClean {
		t.Fatalf("a in %s after its chained result whose slot was taken back, want PRE_CLEAN (queued)", ad.State)
	}
}

// A tick grants PRE_CLEAN's waiting DTRs before it grants queries, so a
// DTR waiting there takes a slot and the queries granted in the same tick
// may still hold the free ones left: under steady work one DTR nearly
// always waits in PRE_CLEAN, and chaining would otherwise stop.
func TestQueriesGrantedInTheTickADTRWaitsInPreCleanAreStillChained(t *testing.T) {
	h := newHarness(t, chainConfig())
	w := newDTR(1, "alice", dtr.Download)
	g := h.chainedGrant(w)
	h.result(Result{DTR: w.ID, Grant: g.ID, State: g.State, Size: 1}) // the query alone
	h.collect()
	if st := h.c.states[dtr.PreClean]; st.waiting() != 1 || st.total != 0 {
		t.Fatalf("setup: PRE_CLEAN has %d waiting and %d running, want 1 and 0", st.waiting(), st.total)
	}
	queries := []*dtr.DTR{newDTR(2, "alice", dtr.Download), newDTR(3, "bob", dtr.Download), newDTR(4, "bob", dtr.Download)}
	h.submit(queries...)
	var preCleaned bool
	chained := 0
	for _, g := range h.tick(time.Second) {
		switch {
		case g.DTR.ID == w.ID:
			preCleaned = g.State == dtr.PreCleaning
		case g.State == dtr.QueryingReplica && g.Then != nil:
			chained++
		}
	}
	checkSlotCounts(t, h.c)
	if !preCleaned {
		t.Fatal("the DTR waiting in PRE_CLEAN was not granted its pre-clean")
	}
	if chained != len(queries) {
		t.Fatalf("%d of the tick's %d queries chained, want all: PRE_CLEAN has slots free once its waiting DTR is granted", chained, len(queries))
	}
}

// A chained grant's lease that runs out is said to be the chained grant's,
// so that the error tells why the DTR's pre-clean was not done either.
func TestAChainedGrantsExpiredLeaseNamesBothSteps(t *testing.T) {
	h := newHarness(t, chainConfig())
	d := newDTR(1, "alice", dtr.Download)
	g := h.chainedGrant(d)
	delete(h.running, g.ID)
	h.now = h.now.Add(2 * time.Minute)
	h.c.expireLeases(h.now)
	got, _ := h.c.Get(d.ID)
	if got.Error == nil || !strings.Contains(got.Error.Text, "chained QUERY_REPLICA and PRE_CLEAN grant "+g.ID) {
		t.Fatalf("error %+v, want it to name the chained grant %s", got.Error, g.ID)
	}
	checkSlotCounts(t, h.c)
}

// The time a chained grant held its slots covers two steps: it is left
// out of the means of how long one step holds a slot (the states', the
// shares' and the average grant time), which a lone step's time enters.
func TestAChainedGrantsTimeIsLeftOutOfTheHoldMeans(t *testing.T) {
	h := newHarness(t, chainConfig())
	d := newDTR(1, "alice", dtr.Download)
	g := h.chainedGrant(d)
	h.now = h.now.Add(30 * time.Second)
	h.result(chainedResult(g, nil))
	h.collect()
	for _, s := range []dtr.State{dtr.QueryReplica, dtr.PreClean} {
		st := h.c.states[s]
		if _, ok := h.c.took[s]; ok || st.hold != 0 {
			t.Errorf("%s: average grant time %v (set: %v), hold mean %.1f s; want neither to count the chained grant", s, h.c.took[s], ok, st.hold)
		}
		for name, ss := range st.shares {
			if ss.hold != 0 {
				t.Errorf("%s share %s hold mean %.1f s, want none", s, name, ss.hold)
			}
		}
	}
	// A lone query's time is counted.
	cfg := chainConfig()
	cfg.ChainPreClean = false
	h = newHarness(t, cfg)
	h.submit(newDTR(2, "alice", dtr.Download))
	q := h.tick(time.Second)[0]
	h.now = h.now.Add(3 * time.Second)
	h.result(Result{DTR: q.DTR.ID, Grant: q.ID, State: q.State, Size: 1})
	if took := h.c.took[dtr.QueryReplica]; took != 3*time.Second || h.c.states[dtr.QueryReplica].hold != 3 {
		t.Fatalf("a lone query: average %v, hold mean %.1f s; want 3s", took, h.c.states[dtr.QueryReplica].hold)
	}
}
