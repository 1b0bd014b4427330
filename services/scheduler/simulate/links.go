package simulate

// The link model: storage links with a capacity shared by their
// transfers, a rate one transfer cannot pass, a setup time per transfer,
// a loss of capacity past the knee and failures that may grow with
// concurrency, all of which can change at given times. RunLinks drives the
// real core over such links with an endless backlog of files and records
// each link's limit, concurrency and throughput, so that Sluice's per-link
// optimizer and FTS3's rule can be compared on the same links.

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// LinkModel is one simulated link: transfers from Source (a host) to the
// local disk.
type LinkModel struct {
	Source string
	// FileSize is the mean size of the link's files (0:
	// LinkOptions.FileSize).
	FileSize int64
	LinkParams
	// Steps change the parameters at given times.
	Steps []LinkStep
}

// LinkParams are a link's behaviour at one time.
type LinkParams struct {
	// Capacity is the bytes per second the link carries in all;
	// PerTransfer the most one transfer moves. Its knee is
	// Capacity/PerTransfer transfers.
	Capacity, PerTransfer float64
	// Latency is each transfer's setup time, with no bytes moved.
	Latency time.Duration
	// Overload is the part of the capacity lost per transfer past the
	// knee (contention), at most 80% in all.
	Overload float64
	// ErrorRate is the chance that a transfer fails; ErrorPerTransfer is
	// added for each transfer running past ErrorAbove (0: the knee).
	ErrorRate, ErrorPerTransfer float64
	ErrorAbove                  int
}

// LinkStep changes a link's parameters at a time.
type LinkStep struct {
	At time.Duration
	LinkParams
}

// params returns the link's parameters at el.
func (m LinkModel) params(el time.Duration) LinkParams {
	p := m.LinkParams
	for _, s := range m.Steps {
		if s.At <= el {
			p = s.LinkParams
		}
	}
	return p
}

// knee is where concurrency stops adding throughput.
func (p LinkParams) knee() float64 { return p.Capacity / p.PerTransfer }

// capacity is what the link carries with n transfers moving bytes.
func (p LinkParams) capacity(n int) float64 {
	over := math.Max(0, float64(n)-p.knee())
	return p.Capacity * math.Max(0.2, 1-p.Overload*over)
}

// throughput is what n transfers move per second once set up.
func (p LinkParams) throughput(n int) float64 {
	return math.Min(float64(n)*p.PerTransfer, p.capacity(n))
}

// failChance is the chance that one of n running transfers fails.
func (p LinkParams) failChance(n int) float64 {
	above := p.ErrorAbove
	if above == 0 {
		above = int(math.Ceil(p.knee()))
	}
	return math.Min(1, p.ErrorRate+p.ErrorPerTransfer*math.Max(0, float64(n-above)))
}

// Achievable is the best throughput the link gives at any concurrency
// between lo and hi (setup time and failures aside).
func (p LinkParams) Achievable(lo, hi int) float64 {
	best := 0.0
	for n := lo; n <= hi; n++ {
		best = math.Max(best, p.throughput(n))
	}
	return best
}

// LinkOptions shape a link run.
type LinkOptions struct {
	// FileSize is the mean size of the files: each is of half to one and
	// a half times it, drawn evenly.
	FileSize int64
	// Duration is how long the run lasts; Step is the virtual tick;
	// Sample how often each link is recorded.
	Duration, Step, Sample time.Duration
	// Progress is how often a transfer reports the bytes it moved (as
	// workers do with each lease renewal), from its start.
	Progress time.Duration
	// Seed seeds the failures.
	Seed uint64
}

func (o *LinkOptions) defaults() {
	if o.FileSize <= 0 {
		o.FileSize = 1e9
	}
	if o.Duration <= 0 {
		o.Duration = time.Hour
	}
	if o.Step <= 0 {
		o.Step = time.Second
	}
	if o.Sample <= 0 {
		o.Sample = 10 * time.Second
	}
	if o.Progress <= 0 {
		o.Progress = 10 * time.Second
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
}

// LinkPoint is a link at one sample.
type LinkPoint struct {
	At time.Duration `json:"at_ns"`
	// Limit is the optimizer's limit, Running the transfers running.
	Limit   int `json:"limit"`
	Running int `json:"running"`
	// Throughput is the bytes per second moved since the last sample;
	// Achievable the best the link could give at the time.
	Throughput float64 `json:"throughput"`
	Achievable float64 `json:"achievable"`
	// Failed counts the transfers that failed since the last sample,
	// Ended all that ended.
	Ended  int `json:"ended"`
	Failed int `json:"failed"`
}

// LinkSeries is one link's run.
type LinkSeries struct {
	Link   string      `json:"link"`
	Points []LinkPoint `json:"points"`
	// Convergence holds, for the start and each step change, how long
	// the link took to reach 90% of its achievable throughput (-1: it
	// did not before the next change or the end).
	Convergence []Convergence `json:"convergence"`
	// Decisions are the last decisions the link's controller made.
	Decisions []core.LinkRecord `json:"decisions"`
}

// Convergence is how long a link took to reach 90% of what it could
// carry after a change at At and, if its failures since passed 3% (two at
// least) at FailuresRose, how long the limit then took to halve (Halved,
// -1: it did not before the next change).
type Convergence struct {
	At           time.Duration `json:"at_ns"`
	Took         time.Duration `json:"took_ns"`
	FailuresRose time.Duration `json:"failures_rose_ns,omitempty"`
	Halved       time.Duration `json:"halved_ns,omitempty"`
}

// LinkResult is one controller's run over the links.
type LinkResult struct {
	Controller string       `json:"controller"`
	Links      []LinkSeries `json:"links"`
}

// transfer is a transfer grant on a simulated link.
type transfer struct {
	g       core.Grant
	link    int
	started time.Time
	moved   float64
	size    float64
}

// RunLinks drives a core made with cfg (its Optimizer decides the links'
// limits) over the links, with enough files always waiting for each.
func RunLinks(name string, cfg core.Config, links []LinkModel, opt LinkOptions) (LinkResult, error) {
	opt.defaults()
	if len(links) == 0 {
		return LinkResult{}, errors.New("no links to run")
	}
	for _, l := range links {
		for _, p := range append([]LinkParams{l.LinkParams}, stepParams(l.Steps)...) {
			if p.Capacity <= 0 || p.PerTransfer <= 0 {
				return LinkResult{}, fmt.Errorf("link %s: capacity and per-transfer rate must be above 0", l.Source)
			}
		}
	}
	if !cfg.Optimizer.Enabled {
		return LinkResult{}, errors.New("the optimizer is off: nothing limits the links")
	}
	backlog := cfg.Optimizer.Max + 20
	cfg.MaxDelivery = max(cfg.MaxDelivery, backlog*len(links))
	cfg.MaxProcessor = max(cfg.MaxProcessor, 2*backlog*len(links))
	cfg.MaxEmergency = 0
	// One share per link, so that each link's DTRs are counted apart.
	cfg.SharePolicy = core.PolicyDN
	c := core.New(cfg)
	rng := rand.New(rand.NewPCG(opt.Seed, 7))
	sizes := rand.New(rand.NewPCG(opt.Seed, 11))
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	res := LinkResult{Controller: name, Links: make([]LinkSeries, len(links))}
	outstanding := make([]int, len(links)) // DTRs submitted and not final
	linkOf := map[uuid.UUID]int{}
	var other []core.Grant // non-transfer grants, answered next step
	running := map[string]*transfer{}
	type tally struct {
		bytes         float64
		ended, failed int
	}
	tallies := make([]tally, len(links))
	next := 0
	for i := range links {
		res.Links[i].Link = links[i].Source + " → " + core.LocalEndpoint
	}
	for el := time.Duration(0); el <= opt.Duration; el += opt.Step {
		now := start.Add(el)
		for i, l := range links {
			for ; outstanding[i] < backlog; outstanding[i]++ {
				next++
				id := uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "link-%d", next))
				d := &dtr.DTR{ID: id, Source: fmt.Sprintf("https://%s/f%d", l.Source, next),
					Destination: fmt.Sprintf("file:///sim/%d", next), Owner: dtr.Identity{DN: "/CN=" + l.Source}}
				if err := c.Submit(now, d); err != nil {
					return res, err
				}
				linkOf[id] = i
			}
		}
		c.Tick(now)
		out := c.Take()
		for _, f := range out.Final {
			outstanding[linkOf[f.ID]]--
			delete(linkOf, f.ID)
		}
		for _, g := range out.Grants {
			if g.State == dtr.Transferring {
				t := &transfer{g: g, link: linkOf[g.DTR.ID], started: now}
				t.size = float64(opt.FileSize)
				if n := links[t.link].FileSize; n > 0 {
					t.size = float64(n)
				}
				t.size *= 0.5 + sizes.Float64() // files of half to one and a half times the size
				running[g.ID] = t
			} else {
				other = append(other, g)
			}
		}
		// Bytes move: each link's capacity shared by its transfers past
		// their setup.
		count := make([]int, len(links))
		moving := make([]int, len(links))
		for _, t := range running {
			count[t.link]++
			if now.Sub(t.started) >= links[t.link].params(el).Latency {
				moving[t.link]++
			}
		}
		ids := make([]string, 0, len(running))
		for id := range running {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		after := now.Add(opt.Step)
		var results []core.Result
		for _, id := range ids {
			t := running[id]
			p := links[t.link].params(el)
			if now.Sub(t.started) < p.Latency {
				continue
			}
			rate := math.Min(p.PerTransfer, p.capacity(moving[t.link])/float64(moving[t.link]))
			step := math.Min(rate*opt.Step.Seconds(), t.size-t.moved)
			t.moved += step
			tallies[t.link].bytes += step
			if t.moved < t.size {
				if after.Sub(t.started)%opt.Progress == 0 {
					if err := c.Progress(after, t.g.DTR.ID, t.g.ID, int64(t.moved)); err != nil {
						return res, err
					}
				}
				continue
			}
			r := core.Result{DTR: t.g.DTR.ID, Grant: t.g.ID, Size: int64(t.size), Bytes: int64(t.size)}
			tallies[t.link].ended++
			if rng.Float64() < p.failChance(count[t.link]) {
				r.Bytes = 0
				r.Error = &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "simulated failure"}
				tallies[t.link].failed++
			}
			results = append(results, r)
			delete(running, id)
		}
		for _, g := range other {
			results = append(results, core.Result{DTR: g.DTR.ID, Grant: g.ID, Size: opt.FileSize})
		}
		other = other[:0]
		for _, r := range results {
			if err := c.Result(after, r); err != nil {
				return res, fmt.Errorf("result: %w", err)
			}
		}
		if (el+opt.Step)%opt.Sample == 0 {
			for i, l := range links {
				p := l.params(el)
				limit, _ := c.LinkLimit(core.EndpointOf("https://"+l.Source+"/"), core.LocalEndpoint)
				res.Links[i].Points = append(res.Links[i].Points, LinkPoint{At: el + opt.Step, Limit: limit, Running: count[i],
					Throughput: tallies[i].bytes / opt.Sample.Seconds(), Achievable: p.Achievable(cfg.Optimizer.Min, cfg.Optimizer.Max),
					Ended: tallies[i].ended, Failed: tallies[i].failed})
				tallies[i] = tally{}
			}
		}
	}
	for i, l := range links {
		res.Links[i].Convergence = convergence(res.Links[i].Points, l.Steps, opt.Duration, cfg.Optimizer.Min)
		for _, s := range c.Links(true) {
			if s.Source == core.EndpointOf("https://"+l.Source+"/") {
				res.Links[i].Decisions = s.History
			}
		}
	}
	return res, nil
}

func stepParams(steps []LinkStep) []LinkParams {
	out := make([]LinkParams, len(steps))
	for i, s := range steps {
		out[i] = s.LinkParams
	}
	return out
}

// convergence finds, for the start and each step, how long until a
// sample's throughput reached 90% of what the link could carry, and how
// long after its failures were evident (three at least, and over 3% of
// the transfers ended since the change) its limit was halved (or at lo,
// the lowest limit).
func convergence(points []LinkPoint, steps []LinkStep, end time.Duration, lo int) []Convergence {
	changes := []time.Duration{0}
	for _, s := range steps {
		changes = append(changes, s.At)
	}
	var out []Convergence
	for i, at := range changes {
		until := end + time.Nanosecond
		if i+1 < len(changes) {
			until = changes[i+1]
		}
		cv := Convergence{At: at, Took: -1}
		for _, p := range points {
			// A sample covers the time before it: it counts once it lies
			// wholly after the change.
			if p.At-10*time.Second < at || p.At > until {
				continue
			}
			if p.Throughput >= 0.9*p.Achievable {
				cv.Took = p.At - at
				break
			}
		}
		limit, ended, failed := 0, 0, 0
		for _, p := range points {
			switch {
			case p.At <= at:
				limit = p.Limit
			case p.At > until:
			case cv.FailuresRose == 0:
				ended, failed = ended+p.Ended, failed+p.Failed
				if failed >= 3 && float64(failed) > 0.03*float64(ended) {
					cv.FailuresRose, cv.Halved = p.At, -1
				}
			case cv.Halved < 0 && p.Limit <= max(limit/2, lo):
				cv.Halved = p.At - cv.FailuresRose
			}
			if cv.FailuresRose == 0 && p.At > at {
				limit = max(limit, p.Limit)
			}
		}
		out = append(out, cv)
	}
	return out
}

// WriteLinksCSV writes the runs' samples: one line per controller, link
// and sample.
func WriteLinksCSV(w io.Writer, results []LinkResult) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"controller", "link", "at_s", "limit", "running", "throughput_mb_s", "achievable_mb_s", "ended", "failed"})
	for _, r := range results {
		for _, l := range r.Links {
			for _, p := range l.Points {
				_ = cw.Write([]string{r.Controller, l.Link, strconv.FormatFloat(p.At.Seconds(), 'f', 0, 64),
					strconv.Itoa(p.Limit), strconv.Itoa(p.Running),
					strconv.FormatFloat(p.Throughput/1e6, 'f', 1, 64), strconv.FormatFloat(p.Achievable/1e6, 'f', 1, 64),
					strconv.Itoa(p.Ended), strconv.Itoa(p.Failed)})
			}
		}
	}
	cw.Flush()
	return cw.Error()
}

// LinksTable writes, per controller and link, how long the link took
// after each change to reach 90% of what it could carry and, where its
// failures passed 3%, to halve its limit from then; with its mean
// throughput and the transfers that failed.
func LinksTable(w io.Writer, results []LinkResult) error {
	_, err := fmt.Fprintf(w, "%-10s %-32s %10s %10s %12s %10s %10s\n", "CONTROLLER", "LINK", "CHANGE AT", "TO 90%", "HALVED IN", "MEAN MB/S", "FAILED")
	for _, r := range results {
		for _, l := range r.Links {
			sum, failed := 0.0, 0
			for _, p := range l.Points {
				sum += p.Throughput
				failed += p.Failed
			}
			mean := 0.0
			if len(l.Points) > 0 {
				mean = sum / float64(len(l.Points)) / 1e6
			}
			for i, cv := range l.Convergence {
				took := "never"
				if cv.Took >= 0 {
					took = cv.Took.Round(time.Second).String()
				}
				m, f := "", ""
				if i == 0 {
					m, f = fmt.Sprintf("%.1f", mean), strconv.Itoa(failed)
				}
				halved := ""
				switch {
				case cv.FailuresRose > 0 && cv.Halved >= 0:
					halved = cv.Halved.Round(time.Second).String()
				case cv.FailuresRose > 0:
					halved = "never"
				}
				fmt.Fprintf(w, "%-10s %-32s %10s %10s %12s %10s %10s\n", r.Controller, l.Link, fmtMinutes(cv.At), took, halved, m, f)
			}
		}
	}
	return err
}

// LinkExample is the links of docs/simulate.md: one whose capacity halves
// after 20 minutes and then quadruples after 40, and one that starts
// failing a tenth of its transfers after 20 minutes and recovers after 40.
func LinkExample() []LinkModel {
	return []LinkModel{
		{Source: "capacity.example:443",
			LinkParams: LinkParams{Capacity: 1e9, PerTransfer: 25e6, Latency: 2 * time.Second, Overload: 0.01},
			Steps: []LinkStep{
				{At: 20 * time.Minute, LinkParams: LinkParams{Capacity: 500e6, PerTransfer: 25e6, Latency: 2 * time.Second, Overload: 0.01}},
				{At: 40 * time.Minute, LinkParams: LinkParams{Capacity: 2e9, PerTransfer: 25e6, Latency: 2 * time.Second, Overload: 0.01}},
			}},
		{Source: "errors.example:443", FileSize: 200e6,
			LinkParams: LinkParams{Capacity: 400e6, PerTransfer: 20e6, Latency: time.Second, Overload: 0.01, ErrorRate: 0.002},
			Steps: []LinkStep{
				{At: 20 * time.Minute, LinkParams: LinkParams{Capacity: 400e6, PerTransfer: 20e6, Latency: time.Second, Overload: 0.01, ErrorRate: 0.1}},
				{At: 40 * time.Minute, LinkParams: LinkParams{Capacity: 400e6, PerTransfer: 20e6, Latency: time.Second, Overload: 0.01, ErrorRate: 0.002}},
			}},
	}
}

// LinksSVG draws, for each link, the limit each controller set and the
// throughput it got over time, with the link's knee and achievable
// throughput dashed.
func LinksSVG(w io.Writer, results []LinkResult, models []LinkModel) error {
	if len(results) == 0 || len(results[0].Links) == 0 {
		return errors.New("nothing to draw")
	}
	const width, panelH, left, right, top, gap = 900, 150, 70, 20, 50, 50
	nLinks := len(results[0].Links)
	height := top + 2*nLinks*(panelH+gap)
	var end time.Duration
	for _, r := range results {
		for _, l := range r.Links {
			if n := len(l.Points); n > 0 {
				end = max(end, l.Points[n-1].At)
			}
		}
	}
	if end <= 0 {
		return errors.New("nothing to draw")
	}
	plotW := float64(width - left - right)
	x := func(t time.Duration) float64 { return left + plotW*float64(t)/float64(end) }
	var b []byte
	b = fmt.Appendf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	b = fmt.Appendf(b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	lx := float64(left)
	for i, r := range results {
		b = fmt.Appendf(b, `<rect x="%.0f" y="14" width="12" height="12" fill="%s"/><text x="%.0f" y="24">%s</text>`+"\n", lx, palette[i%len(palette)], lx+16, r.Controller)
		lx += 40 + 7.5*float64(len(r.Controller))
	}
	b = fmt.Appendf(b, `<line x1="%.0f" y1="20" x2="%.0f" y2="20" stroke="gray" stroke-dasharray="4 3"/><text x="%.0f" y="24">the link's knee / achievable throughput</text>`+"\n", lx, lx+24, lx+30)
	panel := 0
	for li := 0; li < nLinks; li++ {
		for _, what := range []string{"concurrency", "throughput MB/s"} {
			y0 := float64(top + panel*(panelH+gap) + 20)
			panel++
			val := func(p LinkPoint) float64 {
				if what == "concurrency" {
					return float64(p.Limit)
				}
				return p.Throughput / 1e6
			}
			ref := func(p LinkPoint) float64 {
				if what == "concurrency" && li < len(models) {
					return math.Ceil(models[li].params(p.At - time.Nanosecond).knee())
				}
				return p.Achievable / 1e6
			}
			top := 1.0
			for _, r := range results {
				for _, p := range r.Links[li].Points {
					top = math.Max(top, math.Max(val(p), ref(p)))
				}
			}
			top = niceCeil(top * 1.05)
			y := func(v float64) float64 { return y0 + panelH - panelH*v/top }
			b = fmt.Appendf(b, `<text x="%d" y="%.0f" font-weight="bold">%s: %s</text>`+"\n", left, y0-6, results[0].Links[li].Link, what)
			var pts []byte
			for _, p := range results[0].Links[li].Points {
				pts = fmt.Appendf(pts, "%.1f,%.1f ", x(p.At), y(ref(p)))
			}
			b = fmt.Appendf(b, `<polyline fill="none" stroke="gray" stroke-dasharray="4 3" points="%s"/>`+"\n", pts)
			for i, r := range results {
				pts = pts[:0]
				for _, p := range r.Links[li].Points {
					pts = fmt.Appendf(pts, "%.1f,%.1f ", x(p.At), y(val(p)))
				}
				b = fmt.Appendf(b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", palette[i%len(palette)], pts)
			}
			b = fmt.Appendf(b, `<line x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="black"/>`+"\n", left, y(0), width-right, y(0))
			b = fmt.Appendf(b, `<line x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="black"/>`+"\n", left, y(0), left, y(top))
			b = fmt.Appendf(b, `<text x="%d" y="%.0f" text-anchor="end">%g</text><text x="%d" y="%.0f" text-anchor="end">0</text>`+"\n", left-4, y(top)+4, top, left-4, y(0)+4)
			step := tickStep(end)
			for t := time.Duration(0); t <= end; t += step {
				b = fmt.Appendf(b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="black"/><text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n",
					x(t), y(0), x(t), y(0)+4, x(t), y(0)+16, fmtMinutes(t))
			}
		}
	}
	b = append(b, "</svg>\n"...)
	_, err := w.Write(b)
	return err
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// ReadLinks reads links in CSV with a header naming the columns: source
// (the link's source endpoint), at (seconds from the start the line's
// parameters hold from; 0 or empty for the first), capacity and
// per_transfer (MB/s), and optionally latency (seconds), overload (the
// part of the capacity lost per transfer past the knee), error_rate,
// error_per_transfer, error_above and file_size (MB). Lines of one source
// after its first are its step changes, in order of time.
func ReadLinks(r io.Reader) ([]LinkModel, error) {
	cr := csv.NewReader(r)
	cr.Comment = '#'
	cr.TrimLeadingSpace = true
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("links header: %w", err)
	}
	col := map[string]int{}
	for i, h := range header {
		col[strings.ToLower(strings.TrimSpace(h))] = i
	}
	for _, need := range []string{"source", "capacity", "per_transfer"} {
		if _, ok := col[need]; !ok {
			return nil, fmt.Errorf("links header %q lacks the column %q (want source, at, capacity, per_transfer, latency, overload, error_rate, error_per_transfer, error_above, file_size)", strings.Join(header, ","), need)
		}
	}
	cr.FieldsPerRecord = len(header)
	var out []LinkModel
	index := map[string]int{}
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("links: %w", err)
		}
		num := func(name string, lo float64) (float64, error) {
			i, ok := col[name]
			if !ok || strings.TrimSpace(rec[i]) == "" {
				return 0, nil
			}
			v, err := strconv.ParseFloat(strings.TrimSpace(rec[i]), 64)
			if err != nil || v < lo || math.IsInf(v, 0) || math.IsNaN(v) {
				return 0, fmt.Errorf("links line %d: %s %q is not a number ≥ %g", line, name, rec[i], lo)
			}
			return v, nil
		}
		var p LinkParams
		var at, latency, above, size float64
		for _, f := range []struct {
			name string
			to   *float64
		}{{"at", &at}, {"capacity", &p.Capacity}, {"per_transfer", &p.PerTransfer}, {"latency", &latency}, {"overload", &p.Overload},
			{"error_rate", &p.ErrorRate}, {"error_per_transfer", &p.ErrorPerTransfer}, {"error_above", &above}, {"file_size", &size}} {
			if *f.to, err = num(f.name, 0); err != nil {
				return nil, err
			}
		}
		if p.Capacity <= 0 || p.PerTransfer <= 0 {
			return nil, fmt.Errorf("links line %d: capacity and per_transfer must be above 0 MB/s", line)
		}
		if p.ErrorRate > 1 || p.Overload > 1 {
			return nil, fmt.Errorf("links line %d: error_rate and overload are fractions, at most 1", line)
		}
		p.Capacity, p.PerTransfer = p.Capacity*1e6, p.PerTransfer*1e6
		p.Latency = time.Duration(latency * float64(time.Second))
		p.ErrorAbove = int(above)
		source := strings.TrimSpace(rec[col["source"]])
		if source == "" {
			return nil, fmt.Errorf("links line %d: source is empty", line)
		}
		k, seen := index[source]
		switch {
		case !seen && at != 0:
			return nil, fmt.Errorf("links line %d: the first line of %s is at %gs, want 0", line, source, at)
		case !seen:
			index[source] = len(out)
			out = append(out, LinkModel{Source: source, FileSize: int64(size * 1e6), LinkParams: p})
		default:
			l := &out[k]
			last := time.Duration(0)
			if n := len(l.Steps); n > 0 {
				last = l.Steps[n-1].At
			}
			step := time.Duration(at * float64(time.Second))
			if step <= last {
				return nil, fmt.Errorf("links line %d: %s's step at %gs is not after its previous one", line, source, at)
			}
			l.Steps = append(l.Steps, LinkStep{At: step, LinkParams: p})
		}
	}
	if len(out) == 0 {
		return nil, errors.New("links file has no links")
	}
	return out, nil
}
