package simulate

import (
	"bytes"
	"encoding/csv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

func linkConfig(controller func(core.OptimizerConfig) core.LinkController) core.Config {
	cfg := core.DefaultConfig()
	cfg.Optimizer = core.DefaultOptimizerConfig()
	cfg.Optimizer.Controller = controller
	cfg.Optimizer.History = 1000
	return cfg
}

func runLinks(t *testing.T, name string, ctl func(core.OptimizerConfig) core.LinkController, links []LinkModel, opt LinkOptions) LinkResult {
	t.Helper()
	cfg := linkConfig(ctl)
	if name == "fts3" {
		cfg.Optimizer.Start = cfg.Optimizer.Min // as sluice simulate starts it
	}
	r, err := RunLinks(name, cfg, links, opt)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestSluiceOptimizerReachesNinetyPercentWithinThreeMinutesOfEachCapacityStep(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4, 5} {
		r := runLinks(t, "sluice", nil, LinkExample()[:1], LinkOptions{Seed: seed})
		cv := r.Links[0].Convergence
		if len(cv) != 3 {
			t.Fatalf("seed %d: convergence %+v, want the start and two steps", seed, cv)
		}
		for _, c := range cv {
			if c.Took < 0 || c.Took > 3*time.Minute {
				t.Errorf("seed %d: after the change at %s the link took %s to reach 90%% of its throughput (-1: never), want at most 3m", seed, c.At, c.Took)
			}
		}
	}
}

func TestFTS3RuleClimbsOneTransferAMinute(t *testing.T) {
	r := runLinks(t, "fts3", NewFTS3Optimizer, LinkExample()[:1], LinkOptions{Duration: 20 * time.Minute})
	pts := r.Links[0].Points
	for i := 6; i < len(pts); i++ { // samples 10 s apart: 6 make a minute
		if up := pts[i].Limit - pts[i-6].Limit; up > 1 {
			t.Fatalf("limit rose by %d between %s and %s, want at most 1 a minute", up, pts[i-6].At, pts[i].At)
		}
	}
	if last := pts[len(pts)-1].Limit; last < 15 || last > 22 {
		t.Fatalf("after 20 minutes from 2 the limit is %d, want about 2 + 19", last)
	}
	s := runLinks(t, "sluice", nil, LinkExample()[:1], LinkOptions{Duration: 20 * time.Minute})
	if ft, st := r.Links[0].Convergence[0].Took, s.Links[0].Convergence[0].Took; !(ft < 0 || ft > 3*st) {
		t.Fatalf("FTS3's rule reached 90%% after %s, Sluice's after %s: want FTS3's far slower", ft, st)
	}
}

func TestSluiceOptimizerHalvesWithinAMinuteOfFailuresAboveThreePercent(t *testing.T) {
	r := runLinks(t, "sluice", nil, LinkExample()[1:], LinkOptions{Duration: 25 * time.Minute})
	cv := r.Links[0].Convergence[1] // failures rise at 20 minutes
	if cv.FailuresRose == 0 || cv.Halved < 0 || cv.Halved > time.Minute {
		t.Fatalf("after the step at %s failures passed 3%% at %s and the limit halved %s later (-1: never), want within a minute",
			cv.At, cv.FailuresRose, cv.Halved)
	}
	if cv0 := r.Links[0].Convergence[0]; cv0.FailuresRose != 0 {
		t.Fatalf("failures passed 3%% at %s before the step (0.2%% failing)", cv0.FailuresRose)
	}
}

func TestConvergenceMeasuresTheTimeToNinetyPercentAndToHalving(t *testing.T) {
	pt := func(s, limit int, thr float64, ended, failed int) LinkPoint {
		return LinkPoint{At: time.Duration(s) * time.Second, Limit: limit, Throughput: thr, Achievable: 100, Ended: ended, Failed: failed}
	}
	points := []LinkPoint{pt(10, 8, 50, 10, 0), pt(20, 12, 95, 10, 0), pt(30, 12, 95, 10, 0),
		pt(40, 12, 40, 10, 3), pt(50, 12, 40, 10, 1), pt(60, 6, 40, 10, 0), pt(70, 6, 90, 10, 0)}
	got := convergence(points, []LinkStep{{At: 30 * time.Second}}, 70*time.Second, 2)
	want := []Convergence{{At: 0, Took: 20 * time.Second}, {At: 30 * time.Second, Took: 40 * time.Second, FailuresRose: 40 * time.Second, Halved: 20 * time.Second}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("convergence %+v, want %+v", got, want)
	}
}

func TestFTS3RuleStepsBackOnLowSuccessRate(t *testing.T) {
	cfg := core.DefaultOptimizerConfig()
	f := NewFTS3Optimizer(cfg)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := core.LinkSample{At: t0, Interval: time.Minute, Limit: 20, Running: 20, Waiting: true, Bytes: 6e9, Ended: 100}
	if d := f.Decide(s); d.Limit != cfg.Min || !strings.Contains(d.Reason, "starts at its minimum 2") {
		t.Fatalf("unconfigured: %+v", d)
	}
	s.Limit = cfg.Min
	if d := f.Decide(s); d.Limit != cfg.Min || !strings.Contains(d.Reason, "first feedback") {
		t.Fatalf("first: %+v", d)
	}
	s.At, s.Bytes = t0.Add(time.Minute), 7e9
	if d := f.Decide(s); d.Limit != 3 || !strings.Contains(d.Reason, "larger than the preceding") {
		t.Fatalf("throughput up: %+v", d)
	}
	s.At, s.Limit = t0.Add(90*time.Second), 3
	if d := f.Decide(s); d.Limit != 3 || !strings.Contains(d.Reason, "once a minute") {
		t.Fatalf("within the minute: %+v", d)
	}
	s.At, s.Failed = t0.Add(2*time.Minute), 40
	if d := f.Decide(s); d.Limit != 2 || !strings.Contains(d.Reason, "bad link efficiency") {
		t.Fatalf("success rate under 97%%: %+v", d)
	}
}

func TestFTS3RuleSkipsASteadyLinkUntilItsSteadyInterval(t *testing.T) {
	cfg := core.DefaultOptimizerConfig()
	f := NewFTS3Optimizer(cfg)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := core.LinkSample{At: t0, Interval: time.Minute, Limit: 2, Running: 2, Waiting: true, Bytes: 6e9, Ended: 100}
	f.Decide(s) // first feedback
	// No bytes and no results since: the average and the success rate
	// stay as they were.
	s.Bytes, s.Ended = 0, 0
	for m := 1; m < 5; m++ {
		s.At = t0.Add(time.Duration(m) * time.Minute)
		if d := f.Decide(s); d.Limit != 2 || !strings.Contains(d.Reason, "not enough time passed since the last update") {
			t.Fatalf("minute %d: %+v, want a skip", m, d)
		}
	}
	s.At = t0.Add(5 * time.Minute)
	if d := f.Decide(s); d.Limit != 3 || !strings.Contains(d.Reason, "increment") {
		t.Fatalf("after the steady interval: %+v, want +1", d)
	}
}

func TestLinksCSVAndSVGHoldEveryControllerAndLink(t *testing.T) {
	opt := LinkOptions{Duration: 5 * time.Minute}
	rs := []LinkResult{runLinks(t, "sluice", nil, LinkExample(), opt), runLinks(t, "fts3", NewFTS3Optimizer, LinkExample(), opt)}
	var b bytes.Buffer
	if err := WriteLinksCSV(&b, rs); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&b).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	// 2 controllers × 2 links × 30 samples, and the header.
	if len(rows) != 1+2*2*30 || rows[0][0] != "controller" || rows[1][0] != "sluice" || rows[len(rows)-1][0] != "fts3" {
		t.Fatalf("%d rows, first %v, last %v", len(rows), rows[0], rows[len(rows)-1])
	}
	b.Reset()
	if err := LinksSVG(&b, rs, LinkExample()); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	// Per link two panels, each with the reference line and one line per
	// controller.
	if n := strings.Count(svg, "<polyline"); n != 2*2*3 || !strings.Contains(svg, "capacity.example:443 → local: concurrency") {
		t.Fatalf("%d lines in the picture, want 12", n)
	}
	b.Reset()
	if err := LinksTable(&b, rs); err != nil || !strings.Contains(b.String(), "errors.example:443 → local") {
		t.Fatalf("table: %v\n%s", err, b.String())
	}
}

func TestRunLinksRefusesBadLinks(t *testing.T) {
	for _, tc := range []struct {
		links []LinkModel
		cfg   core.Config
		want  string
	}{
		{[]LinkModel{{Source: "x", LinkParams: LinkParams{Capacity: 0, PerTransfer: 1}}}, linkConfig(nil), "capacity and per-transfer rate must be above 0"},
		{nil, linkConfig(nil), "no links"},
		{LinkExample(), core.DefaultConfig(), "optimizer is off"},
	} {
		if _, err := RunLinks("x", tc.cfg, tc.links, LinkOptions{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v, want %q", err, tc.want)
		}
	}
}

func TestReadLinksTakesStepsAndRefusesBadLines(t *testing.T) {
	links, err := ReadLinks(strings.NewReader("# two links\nsource,at,capacity,per_transfer,latency,overload,error_rate,file_size\n" +
		"se.example:443,0,1000,25,2,0.01,0,500\nse.example:443,1200,500,25,2,0.01,0,\ntape.example,,400,20,,,0.1,\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := LinkModel{Source: "se.example:443", FileSize: 500e6,
		LinkParams: LinkParams{Capacity: 1e9, PerTransfer: 25e6, Latency: 2 * time.Second, Overload: 0.01},
		Steps:      []LinkStep{{At: 20 * time.Minute, LinkParams: LinkParams{Capacity: 500e6, PerTransfer: 25e6, Latency: 2 * time.Second, Overload: 0.01}}}}
	if len(links) != 2 || links[0].Source != want.Source || links[0].FileSize != want.FileSize || links[0].LinkParams != want.LinkParams ||
		len(links[0].Steps) != 1 || links[0].Steps[0] != want.Steps[0] || links[1].ErrorRate != 0.1 {
		t.Fatalf("links %+v", links)
	}
	for _, tc := range []struct{ csv, want string }{
		{"at,capacity\n", `lacks the column "source"`},
		{"source,capacity,per_transfer\nx,0,1\n", "line 2: capacity and per_transfer must be above 0"},
		{"source,capacity,per_transfer\nx,ten,1\n", `line 2: capacity "ten" is not a number`},
		{"source,at,capacity,per_transfer\nx,5,1,1\n", "the first line of x is at 5s, want 0"},
		{"source,at,capacity,per_transfer\nx,0,1,1\nx,0,1,1\n", "x's step at 0s is not after its previous one"},
		{"source,capacity,per_transfer,error_rate\nx,1,1,2\n", "fractions, at most 1"},
		{"source,capacity,per_transfer\n", "no links"},
	} {
		if _, err := ReadLinks(strings.NewReader(tc.csv)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.csv, err, tc.want)
		}
	}
}

// halvings records when a controller halved its link for failures.
type halvings struct {
	core.LinkController
	at *[]time.Time
}

func (h halvings) Decide(s core.LinkSample) core.LinkDecision {
	d := h.LinkController.Decide(s)
	if strings.Contains(d.Reason, "halved") {
		*h.at = append(*h.at, s.At)
	}
	return d
}

func TestSluiceOptimizerHalvesASlowLinkSoonAfterItsFailuresAreEvident(t *testing.T) {
	// Files of 2 GB at 25 MB/s each, 8 at once: about six transfers end a
	// minute, so a tenth failing is never three failures in one minute.
	// The failures are evident once three of the transfers ended since
	// the step have failed, more than 3% of them; the limit must have
	// been halved by a minute after that.
	step := 10 * time.Minute
	slow := LinkModel{Source: "slow.example:443", FileSize: 2e9,
		LinkParams: LinkParams{Capacity: 200e6, PerTransfer: 25e6, Latency: time.Second, Overload: 0.01, ErrorRate: 0.002},
		Steps: []LinkStep{{At: step,
			LinkParams: LinkParams{Capacity: 200e6, PerTransfer: 25e6, Latency: time.Second, Overload: 0.01, ErrorRate: 0.1}}}}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for seed := uint64(1); seed <= 8; seed++ {
		var halved []time.Time
		ctl := func(c core.OptimizerConfig) core.LinkController {
			return halvings{core.NewLinkOptimizer(c), &halved}
		}
		r := runLinks(t, "sluice", ctl, []LinkModel{slow}, LinkOptions{Duration: 30 * time.Minute, Seed: seed})
		evident, ended, failed := time.Duration(-1), 0, 0
		for _, p := range r.Links[0].Points {
			if p.At-10*time.Second < step {
				continue
			}
			ended, failed = ended+p.Ended, failed+p.Failed
			if failed >= 3 && float64(failed) > 0.03*float64(ended) {
				evident = p.At
				break
			}
		}
		if evident < 0 {
			t.Fatalf("seed %d: the failures never became evident", seed)
		}
		ok := false
		for _, at := range halved {
			ok = ok || at.Sub(start) >= step && at.Sub(start) <= evident+time.Minute
		}
		if !ok {
			t.Errorf("seed %d: failures evident at %s, the limit halved at %v: want a halving between the step and a minute after", seed, evident, halved)
		}
	}
}

func TestALinkNamedWithoutItsPortReportsItsLimits(t *testing.T) {
	link := LinkExample()[0]
	link.Source = "Plain.Example"
	r := runLinks(t, "sluice", nil, []LinkModel{link}, LinkOptions{Duration: 2 * time.Minute})
	pts := r.Links[0].Points
	if len(pts) == 0 || pts[len(pts)-1].Limit == 0 || len(r.Links[0].Decisions) == 0 {
		t.Fatalf("a link written without its port: points %+v, decisions %d; want its limits and decisions", pts, len(r.Links[0].Decisions))
	}
}
