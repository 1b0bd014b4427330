package core

import (
	"math"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// checkLinkCounts checks that each link counts exactly the transfers
// running on it, and that every running transfer on a tracked link has
// its flow.
func checkLinkCounts(t *testing.T, c *Core, when string) {
	t.Helper()
	want := map[linkKey]int{}
	n := 0
	for _, e := range c.active {
		if classOf(e.queued).PerHost && e.hosts != (linkKey{}) {
			want[e.hosts]++
			n++
		}
	}
	for k, l := range c.links.links {
		if l.running != want[k] || l.running < 0 {
			t.Fatalf("%s: link %s counts %d running, %d run", when, c.endpointName(k[0]), l.running, want[k])
		}
	}
	if len(c.links.flows) != n {
		t.Fatalf("%s: %d flows for %d running transfers", when, len(c.links.flows), n)
	}
}

func TestLinkRunningCountStaysExact(t *testing.T) {
	transfers := func(h *harness) []Grant {
		var gs []Grant
		for _, g := range h.running {
			if g.State == dtr.Transferring {
				gs = append(gs, g)
			}
		}
		return gs
	}
	for _, tc := range []struct {
		name string
		do   func(h *harness, g Grant)
	}{
		{"a transfer ends", func(h *harness, g Grant) { h.answer(g, nil) }},
		{"a transfer fails", func(h *harness, g Grant) {
			h.answer(g, &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "timeout"})
		}},
		{"a transfer is given back", func(h *harness, g Grant) {
			delete(h.running, g.ID)
			if err := h.c.Result(h.now, Result{DTR: g.DTR.ID, Grant: g.ID, Returned: true}); err != nil {
				h.t.Fatal(err)
			}
			h.collect()
		}},
		{"a running DTR is cancelled", func(h *harness, g Grant) {
			if err := h.c.Cancel(h.now, g.DTR.ID); err != nil {
				h.t.Fatal(err)
			}
			h.collect()
			h.answer(g, nil)
		}},
		{"leases expire", func(h *harness, g Grant) {
			h.tick(3 * time.Minute)
			for id, g := range h.running {
				if g.State == dtr.Transferring {
					delete(h.running, id) // their workers are gone
				}
			}
		}},
		{"a running DTR is forgotten", func(h *harness, g Grant) {
			delete(h.running, g.ID)
			if !h.c.Forget(g.DTR.ID) {
				h.t.Fatalf("Forget(%s) found nothing", g.DTR.ID)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxDelivery, cfg.MaxEmergency = 10, 0
			cfg.Optimizer = fixedOptimizer(2)
			h := newHarness(t, cfg)
			for i := 0; i < 8; i++ {
				h.submit(hostDTR(i, "alice", "one.example"), hostDTR(100+i, "alice", "two.example"))
			}
			h.runToTransfer()
			checkLinkCounts(t, h.c, "at the start")
			for round := 0; round < 4; round++ {
				gs := transfers(h)
				if len(gs) == 0 {
					break
				}
				tc.do(h, gs[0])
				checkLinkCounts(t, h.c, tc.name)
				for _, g := range h.tick(time.Second) {
					if g.Stage != dtr.StageDelivery {
						h.answer(g, nil)
					}
				}
				checkLinkCounts(t, h.c, "after the next tick")
			}
			for _, g := range transfers(h) {
				h.answer(g, nil)
			}
			h.drain()
			checkLinkCounts(t, h.c, "all done")
		})
	}
}

func TestIdleLinksAreForgottenEvenWithoutDecisions(t *testing.T) {
	// Every transfer fails in a way that says nothing about its link:
	// its link decides nothing, and must still be forgotten once idle.
	cfg := DefaultConfig()
	cfg.MaxDelivery, cfg.MaxEmergency = 10, 0
	cfg.Optimizer = DefaultOptimizerConfig()
	h := newHarness(t, cfg)
	for i := 0; i < 5; i++ {
		h.submit(hostDTR(i, "alice", "one.example"), hostDTR(100+i, "alice", "two.example"))
	}
	for i := 0; i < 20; i++ {
		for _, g := range h.tick(time.Second) {
			if g.Stage == dtr.StageDelivery {
				delete(h.running, g.ID)
				f := &dtr.Failure{Kind: dtr.ErrPermanentRemote, Text: "no such file"}
				if err := h.c.Result(h.now, Result{DTR: g.DTR.ID, Grant: g.ID, Error: f}); err != nil {
					t.Fatal(err)
				}
				h.collect()
			} else {
				h.answer(g, nil)
			}
		}
	}
	h.tick(cfg.Optimizer.Interval)
	if l := h.c.Links(true); len(l) != 2 || len(l[0].History)+len(l[1].History) != 0 {
		t.Fatalf("links %+v, want 2 that decided nothing", l)
	}
	for i := 0; i < maxIdle+2; i++ {
		h.tick(cfg.Optimizer.Interval)
	}
	if l := h.c.Links(true); len(l) != 0 {
		t.Fatalf("links %+v still known after %d idle intervals", l, maxIdle+2)
	}
}

func TestLinksBeyondTheBoundAreNotTracked(t *testing.T) {
	ls := newLinkSet(DefaultOptimizerConfig())
	entries := make([]*entry, maxLinks+1)
	for i := range entries {
		entries[i] = &entry{d: &dtr.DTR{ID: uuid.New()}, hosts: linkKey{uint32(i + 1), 0}}
		ls.add(entries[i], 1)
	}
	last := entries[maxLinks]
	if len(ls.links) != maxLinks || ls.atLimit(last) || ls.flows[last.d.ID] != nil {
		t.Fatalf("%d links tracked, the one past the bound limited %v", len(ls.links), ls.atLimit(last))
	}
	// Its end changes nothing, even once its link could be tracked.
	ls.add(entries[0], -1)
	delete(ls.links, entries[0].hosts)
	ls.ended(t0, last, Result{Bytes: 10})
	ls.add(last, -1)
	if _, ok := ls.links[last.hosts]; ok || len(ls.flows) != maxLinks-1 {
		t.Fatalf("ending an untracked transfer made its link (%v) or lost flows (%d)", ok, len(ls.flows))
	}
}

func TestLinkSetGuardsItsInputs(t *testing.T) {
	cfg := DefaultOptimizerConfig()
	cfg.History = 0
	ls := newLinkSet(cfg)
	e := &entry{d: &dtr.DTR{ID: uuid.New()}, hosts: linkKey{1, 0}}
	ls.tick(t0)
	ls.add(e, 1)
	now := t0
	for i := 0; i < 5; i++ {
		now = now.Add(cfg.Interval)
		ls.moved(now, e, int64(i+1)*math.MaxInt64/8)
		ls.tick(now) // with History 0 this panicked
	}
	ls.ended(now, e, Result{Bytes: math.MaxInt64})
	e2 := &entry{d: &dtr.DTR{ID: uuid.New()}, hosts: linkKey{1, 0}}
	ls.add(e2, 1)
	ls.ended(now, e2, Result{Bytes: math.MaxInt64})
	ls.tick(now.Add(cfg.Interval))
	if h := ls.links[linkKey{1, 0}].history; len(h) != 1 || h[0].Throughput < 0 {
		t.Fatalf("history %+v, want one decision with a throughput of at least 0", h)
	}
	for _, tc := range []struct {
		in   float64
		want int64
	}{{-5, 0}, {math.NaN(), 0}, {12.7, 12}, {9.3e18, math.MaxInt64}, {math.Inf(1), math.MaxInt64}} {
		if got := clampBytes(tc.in); got != tc.want {
			t.Errorf("clampBytes(%v) = %d, want %d", tc.in, got, tc.want)
		}
	}
}
