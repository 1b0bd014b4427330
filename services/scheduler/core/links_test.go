package core

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// fixedLimit is a controller that always answers the same limit.
type fixedLimit int

func (f fixedLimit) Decide(s LinkSample) LinkDecision {
	return LinkDecision{Limit: int(f), Reason: "fixed"}
}

func fixedOptimizer(limit int) OptimizerConfig {
	o := DefaultOptimizerConfig()
	o.Start, o.Min = limit, 1
	o.Controller = func(OptimizerConfig) LinkController { return fixedLimit(limit) }
	return o
}

func TestLinkLimitPassesOverDTRsOfAFullLinkKeepingTheirPlace(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.MaxDelivery, cfg.MaxEmergency = 10, 0
	cfg.Optimizer = fixedOptimizer(2)
	h := newHarness(t, cfg)
	for i := 0; i < 6; i++ {
		h.submit(hostDTR(i, "alice", "slow.example"), hostDTR(100+i, "alice", "fast.example"))
	}
	h.runToTransfer()
	if a, b := h.transfersBy("slow.example"), h.transfersBy("fast.example"); a != 2 || b != 2 {
		t.Fatalf("%d transfers on slow.example → local and %d on fast.example → local, want the links' limit 2 each", a, b)
	}
	var waiting *dtr.DTR
	for _, d := range h.c.DTRs() {
		if d.State == dtr.Transfer && strings.Contains(d.Source, "slow.example") {
			waiting = &d
			break
		}
	}
	w, err := h.c.Explain(h.now, waiting.ID)
	if err != nil || !strings.Contains(w.Reason, "link slow.example:443 → local already has 2 transfers running") {
		t.Fatalf("why: %q, %v", w.Reason, err)
	}
	// The first slow transfer ends: the next slow DTR in order takes its
	// place.
	var first Grant
	for _, g := range h.running {
		if g.State == dtr.Transferring && strings.Contains(g.DTR.Source, "slow.example") && (first.ID == "" || g.DTR.Source < first.DTR.Source) {
			first = g
		}
	}
	h.answer(first, nil)
	var got []Grant
	for _, g := range h.tick(time.Second) {
		if g.State == dtr.Transferring {
			got = append(got, g)
		}
	}
	if len(got) != 1 || !strings.HasSuffix(got[0].DTR.Source, "/data/2") {
		t.Fatalf("after one slow transfer ended, grants %v, want the third slow DTR (/data/2)", got)
	}
}

func TestLinkLimitNeverStarvesAShare(t *testing.T) {
	// Alice's and Bob's files all come over one link limited to 2: each
	// gets transfers as the others end, and Carol's files over another
	// link take the slots the first cannot use.
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.MaxDelivery, cfg.MaxEmergency = 6, 0
	cfg.Optimizer = fixedOptimizer(2)
	h := newHarness(t, cfg)
	for i := 0; i < 20; i++ {
		h.submit(hostDTR(i, "alice", "one.example"), hostDTR(100+i, "bob", "one.example"), hostDTR(200+i, "carol", "two.example"))
	}
	h.runToTransfer()
	started := map[string]int{}
	for round := 0; round < 12; round++ {
		for _, g := range h.running {
			if g.State == dtr.Transferring {
				started[g.DTR.Owner.DN]++
				h.answer(g, nil)
			}
		}
		for i := 0; i < 4; i++ {
			for _, g := range h.tick(time.Second) {
				if g.Stage != dtr.StageDelivery {
					h.answer(g, nil)
				}
			}
		}
		if n := h.transfersBy("one.example"); n > 2 {
			t.Fatalf("round %d: %d transfers on a link limited to 2", round, n)
		}
	}
	for _, who := range []string{"alice", "bob", "carol"} {
		if started[who] < 4 {
			t.Fatalf("%s's transfers ended %d times in 12 rounds (%v): a share was starved", who, started[who], started)
		}
	}
}

func TestLinkOptimizerIsOffUnlessEnabled(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery, cfg.MaxEmergency = 10, 0
	h := newHarness(t, cfg)
	for i := 0; i < 10; i++ {
		h.submit(hostDTR(i, "alice", "one.example"))
	}
	h.runToTransfer()
	if n := h.transfersBy("one.example"); n != 10 || h.c.Links(false) != nil {
		t.Fatalf("%d transfers, links %v: want all 10 and no links with the optimizer off", n, h.c.Links(false))
	}
}

func TestLinksReportMeasuredThroughputAndDecisions(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery, cfg.MaxEmergency = 10, 0
	cfg.Optimizer = DefaultOptimizerConfig()
	cfg.Optimizer.Start = 4
	h := newHarness(t, cfg)
	for i := 0; i < 10; i++ {
		h.submit(hostDTR(i, "alice", "one.example"))
	}
	h.runToTransfer()
	// Each running transfer reports 10 MB more every second, for 40 s.
	moved := map[string]int64{}
	for s := 1; s <= 40; s++ {
		for _, g := range h.running {
			if g.State == dtr.Transferring {
				moved[g.ID] += 10e6
				if err := h.c.Progress(h.now, g.DTR.ID, g.ID, moved[g.ID]); err != nil {
					t.Fatal(err)
				}
			}
		}
		h.tick(time.Second)
	}
	links := h.c.Links(true)
	if len(links) != 1 {
		t.Fatalf("links %+v, want one", links)
	}
	l := links[0]
	if l.Source != "one.example:443" || l.Destination != LocalEndpoint || l.Last == nil || len(l.History) < 3 {
		t.Fatalf("link %+v", l)
	}
	// DTRs waited and each transfer kept its rate, so the limit grew; the
	// last decision measured 10 MB/s for each transfer that ran.
	last := l.History[len(l.History)-1]
	if l.Limit <= 4 || l.Throughput != last.Throughput || last.Throughput < 0.8*10e6*last.Running || last.Throughput > 1.2*10e6*last.Running {
		t.Fatalf("limit %d, last decision %+v: want a higher limit than 4 and about 10 MB/s per running transfer", l.Limit, last)
	}
}

// sample is a link's interval of 10 s with n transfers moving per bytes/s
// each.
func sample(at time.Duration, limit int, n float64, per float64, ended, failed int) LinkSample {
	return LinkSample{At: t0.Add(at), Interval: 10 * time.Second, Limit: limit, Running: n, Waiting: true,
		Bytes: int64(n * per * 10), Ended: ended, Failed: failed}
}

func TestLinkOptimizerDecides(t *testing.T) {
	cfg := DefaultOptimizerConfig()
	type step struct {
		s         LinkSample
		wantLimit int
		reason    string
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"grows by half while each transfer keeps its rate", []step{
			{sample(10*time.Second, 8, 8, 10e6, 8, 0), 12, "+50%"},
			{sample(20*time.Second, 12, 12, 10e6, 12, 0), 12, "settling"},
			{sample(30*time.Second, 12, 12, 10e6, 12, 0), 18, "brought +50%"},
		}},
		{"goes back when an increase went past the knee", []step{
			{sample(10*time.Second, 20, 20, 10e6, 8, 0), 30, "+50%"},
			{sample(20*time.Second, 30, 30, 200e6/30, 8, 0), 30, "settling"},
			{sample(30*time.Second, 30, 30, 170e6/30, 8, 0), 20, "past the knee: 5.7 MB/s per transfer is 57% of the uncongested 10.0 MB/s; back to 20"},
			{sample(40*time.Second, 20, 20, 10e6, 8, 0), 20, "settling"},
			// The next probe goes halfway to where the knee was found.
			{sample(50*time.Second, 20, 20, 10e6, 8, 0), 25, "+5, below the knee found at 30"},
		}},
		{"cuts to the knee when the capacity halves", []step{
			{sample(10*time.Second, 40, 40, 10e6, 8, 0), 60, "+50%"},
			{sample(20*time.Second, 60, 40, 10e6, 8, 0), 60, "settling"},
			{sample(30*time.Second, 60, 40, 10e6, 8, 0), 60, "waiting for the link to run up"},
			{sample(40*time.Second, 60, 60, 10e6, 8, 0), 60, "no DTR waits"},
			{sample(50*time.Second, 60, 60, 5e6, 8, 0), 33, "past the knee: 5.0 MB/s per transfer is 50% of the uncongested 10.0 MB/s; 300.0 MB/s needs 33"},
		}},
		{"halves on more than 3% failures", []step{
			{sample(10*time.Second, 40, 40, 10e6, 40, 1), 60, "+50%"},
			{sample(20*time.Second, 60, 60, 10e6, 40, 2), 30, "3 of 80 transfers failed in the last 20s (3.8% > 3%): halved from 60 running"},
		}},
		{"judges a slow link by its last results, not the last minute", []step{
			// One transfer in ten fails, one or two end a minute: never
			// three failures in a minute, but three of 17 in three.
			{sample(10*time.Second, 8, 8, 10e6, 2, 1), 12, "+50%"},
			{sample(20*time.Second, 12, 8, 10e6, 0, 0), 12, "settling"},
			{sample(60*time.Second, 12, 8, 10e6, 5, 0), 12, ""},
			{sample(100*time.Second, 12, 8, 10e6, 4, 1), 12, ""},
			{sample(150*time.Second, 12, 8, 10e6, 6, 1), 4, "3 of 17 transfers failed in the last 2m30s (17.6% > 3%): halved from 8 running"},
		}},
		{"grows with no bytes reported when transfers end and DTRs wait", []step{
			{sample(10*time.Second, 10, 10, 0, 20, 0), 15, "no bytes moved; 2.00 transfers ended per second at 10: +50%"},
			{sample(20*time.Second, 15, 15, 0, 25, 0), 15, "settling"},
			{sample(30*time.Second, 15, 15, 0, 30, 0), 23, "+50%"},
			{sample(40*time.Second, 23, 23, 0, 30, 0), 23, "settling"},
			{sample(50*time.Second, 23, 23, 0, 30, 0), 15, "not the 27% they should: back to 15"},
		}},
		{"keeps the uncongested rate over intervals without bytes", []step{
			{sample(10*time.Second, 40, 40, 10e6, 8, 0), 60, "+50%"},
			{sample(20*time.Second, 60, 60, 0, 0, 0), 60, "nothing to judge by"},
			{sample(30*time.Second, 60, 60, 0, 5, 0), 90, "no bytes moved; 0.50 transfers ended per second at 60: +50%"},
			{sample(40*time.Second, 90, 90, 5e6, 8, 0), 90, "settling"},
			{sample(50*time.Second, 90, 90, 5e6, 8, 0), 50, "past the knee: 5.0 MB/s per transfer is 50% of the uncongested 10.0 MB/s"},
		}},
		{"does not judge an interval a restored transfer's first report is in", []step{
			{func() LinkSample { s := sample(10*time.Second, 8, 8, 100e6, 8, 0); s.Absorbed = true; return s }(), 8, "restored"},
			{sample(20*time.Second, 8, 8, 10e6, 8, 0), 12, "+50%"},
		}},
		{"keeps growth below where failures rose", []step{
			{sample(10*time.Second, 40, 40, 10e6, 40, 3), 20, "halved"},
			{sample(20*time.Second, 20, 20, 10e6, 40, 0), 20, "settling"},
			{sample(30*time.Second, 20, 20, 10e6, 40, 0), 20, "probing for more in 10s"},
			{sample(40*time.Second, 20, 20, 10e6, 40, 0), 22, "+10%"},
			{sample(50*time.Second, 22, 22, 10e6, 40, 0), 22, "settling"},
			{sample(60*time.Second, 22, 22, 10e6, 40, 0), 25, "+10%"},
			{sample(70*time.Second, 25, 25, 10e6, 40, 0), 25, "settling"},
			{sample(80*time.Second, 25, 25, 10e6, 40, 0), 38, "+50%"},
			{sample(90*time.Second, 38, 38, 10e6, 40, 0), 38, "settling"},
			{sample(100*time.Second, 38, 38, 10e6, 40, 0), 39, "kept below 40"},
		}},
		{"ignores one failure in a minute", []step{
			{sample(10*time.Second, 40, 40, 10e6, 10, 1), 60, "+50%"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewLinkOptimizer(cfg)
			for i, st := range tc.steps {
				if strings.HasPrefix(st.reason, "no DTR") {
					st.s.Waiting = false
				}
				d := o.Decide(st.s)
				if d.Limit != st.wantLimit || !strings.Contains(d.Reason, strings.TrimPrefix(st.reason, "no DTR")) {
					t.Fatalf("step %d: limit %d (%s), want %d (%q)", i, d.Limit, d.Reason, st.wantLimit, st.reason)
				}
			}
		})
	}
}

func TestOptimizerConfigRefusesBadSettings(t *testing.T) {
	for _, tc := range []struct {
		change func(*OptimizerConfig)
		want   string
	}{
		{func(o *OptimizerConfig) { o.Min = 0 }, "min 0 is below 1"},
		{func(o *OptimizerConfig) { o.Max = 1 }, "max 1 is below its min 2"},
		{func(o *OptimizerConfig) { o.Start = 200 }, "start 200 is outside"},
		{func(o *OptimizerConfig) { o.Interval = time.Millisecond }, "interval 1ms is under 1s"},
	} {
		o := DefaultOptimizerConfig()
		tc.change(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", o, err, tc.want)
		}
	}
	if err := DefaultOptimizerConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestLinkThroughputIsSpreadBetweenSparseReports(t *testing.T) {
	// Transfers at 10 MB/s that report every 15 s, against decisions every
	// 10 s: an interval holds a report of each transfer or none, yet every
	// decision once the reports began should measure about 10 MB/s a
	// transfer.
	cfg := DefaultConfig()
	cfg.MaxDelivery, cfg.MaxEmergency = 4, 0
	cfg.Optimizer = fixedOptimizer(4)
	h := newHarness(t, cfg)
	for i := 0; i < 4; i++ {
		h.submit(hostDTR(i, "alice", "one.example"))
	}
	h.runToTransfer()
	moved := map[string]int64{}
	for s := 1; s <= 90; s++ {
		for _, g := range h.running {
			if g.State == dtr.Transferring {
				moved[g.ID] += 10e6
				if s%15 == 0 {
					if err := h.c.Progress(h.now, g.DTR.ID, g.ID, moved[g.ID]); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		h.tick(time.Second)
	}
	hist := h.c.Links(true)[0].History
	if len(hist) < 7 {
		t.Fatalf("%d decisions in 90 s, want 8 or so", len(hist))
	}
	// Until the first reports (at 15 s) nothing is known of the link's
	// rate, and the interval with them takes the bytes of the time before;
	// from then on each interval counts what was moved in it.
	for _, rec := range hist[4:] {
		if per := rec.Throughput / rec.Running; per < 7e6 || per > 13e6 {
			t.Errorf("%s: %.1f MB/s per transfer measured, want about 10", rec.At.Format(time.TimeOnly), per/1e6)
		}
	}
}

func TestARestoredCoreCountsTheTransfersRunningOnEachLink(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery, cfg.MaxEmergency = 10, 0
	cfg.Optimizer = fixedOptimizer(2)
	h := newHarness(t, cfg)
	for i := 0; i < 5; i++ {
		h.submit(hostDTR(i, "alice", "slow.example"))
	}
	h.runToTransfer()
	h2 := newHarness(t, cfg)
	for _, e := range h.c.dtrs {
		cp := *h.c.peekEntry(e)
		if err := h2.c.Restore(h.now, &cp); err != nil {
			t.Fatal(err)
		}
	}
	if got := h2.tick(time.Second); len(got) != 0 {
		t.Fatalf("a restored core started %d more transfers on a link at its limit", len(got))
	}
	if l := h2.c.Links(false); len(l) != 1 || l[0].Running != 2 || l[0].Limit != 2 {
		t.Fatalf("restored links %+v, want slow.example → local running 2 of 2", l)
	}
}
