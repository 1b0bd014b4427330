package core

// Per-link adaptive concurrency: how many transfers a link (source
// endpoint → destination endpoint) may run at once, tuned from what its
// transfers achieve. The controller that decides is behind LinkController
// (optimizer.go holds Sluice's); this file keeps the links' measurements,
// enforces their limits in grants and answers queries.

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// LocalEndpoint names the local end of a transfer (a file:// URL) in a
// link's name.
const LocalEndpoint = "local"

// OptimizerConfig configures the per-link optimizer.
type OptimizerConfig struct {
	// Enabled turns it on; off, links have no limit of their own (only
	// MaxPerHost applies).
	Enabled bool
	// Min, Max and Start bound each link's limit and give a new link's.
	Min, Max, Start int
	// Interval is how often each link's limit is decided.
	Interval time.Duration
	// History is how many decisions each link keeps.
	History int
	// Controller decides; nil means Sluice's (NewLinkOptimizer).
	Controller func(OptimizerConfig) LinkController
}

// DefaultOptimizerConfig returns the optimizer's defaults.
func DefaultOptimizerConfig() OptimizerConfig {
	return OptimizerConfig{Enabled: true, Min: 2, Max: 100, Start: 10, Interval: 10 * time.Second, History: 32}
}

// Validate reports a bad setting.
func (o OptimizerConfig) Validate() error {
	switch {
	case o.Min < 1:
		return fmt.Errorf("optimizer min %d is below 1", o.Min)
	case o.Max < o.Min:
		return fmt.Errorf("optimizer max %d is below its min %d", o.Max, o.Min)
	case o.Start < o.Min || o.Start > o.Max:
		return fmt.Errorf("optimizer start %d is outside its min %d and max %d", o.Start, o.Min, o.Max)
	case o.Interval < time.Second:
		return fmt.Errorf("optimizer interval %s is under 1s", o.Interval)
	case o.History < 1:
		return fmt.Errorf("optimizer history %d is below 1", o.History)
	}
	return nil
}

// LinkSample is what a link did during one interval, for its controller.
type LinkSample struct {
	At time.Time
	// Interval is the time the sample covers.
	Interval time.Duration
	// Limit is the link's limit during it, Running the mean number of
	// transfers it ran (weighted by time), Waiting says whether DTRs waited
	// for the link during it.
	Limit   int
	Running float64
	Waiting bool
	// Bytes is what its transfers moved: reported, spread between reports
	// (flow), corrected by later reports and results.
	Bytes int64
	// Ended counts the transfers that ended, Failed those of them that
	// failed in a way that points at the link (TEMPORARY_REMOTE,
	// TRANSFER_SPEED). Transfers that failed otherwise (a missing file,
	// a refused credential) or were cancelled count in neither.
	Ended, Failed int
	// Absorbed says Bytes may hold bytes moved before the interval: a
	// transfer restored after a restart or failover reported for the first
	// time in it (what it moved since its record was saved is not known
	// to have been moved in the interval). Its throughput is no measure
	// of the link's best.
	Absorbed bool
}

// Throughput is the sample's bytes per second.
func (s LinkSample) Throughput() float64 {
	if s.Interval <= 0 {
		return 0
	}
	return float64(s.Bytes) / s.Interval.Seconds()
}

// LinkDecision is a controller's answer: the limit from now on, and why.
type LinkDecision struct {
	Limit  int
	Reason string
	// EMA is the controller's smoothed throughput (bytes/s), and
	// ErrorRate the failure rate it judged by, for the history.
	EMA       float64
	ErrorRate float64
}

// LinkController decides one link's limit from its samples, one call per
// interval. Each link has its own.
type LinkController interface {
	Decide(s LinkSample) LinkDecision
}

// LinkRecord is one decision with its inputs, as kept in a link's
// history; LinkStatus describes one link. Both are the wire's (pkg/api).
type (
	LinkRecord = api.LinkRecord
	LinkStatus = api.LinkStatus
)

type linkKey [2]uint32 // the entry's hosts: 0 is the local end

// link is one link's state.
type link struct {
	key     linkKey
	limit   int
	running int
	ctl     LinkController
	// The current interval's measurements.
	start       time.Time
	runningTime float64 // transfer-seconds
	last        time.Time
	// bytes is what its transfers moved in the interval, as far as the
	// reports tell (flow.estimate); corrections may make it negative.
	bytes         float64
	ended, failed int
	// perTransfer is the throughput per transfer of the last interval,
	// the rate assumed for a transfer that has not reported yet.
	perTransfer float64
	waited      bool
	// absorbed marks the interval as holding bytes from before it
	// (LinkSample.Absorbed).
	absorbed bool
	// idle counts the intervals in a row with nothing running, nothing
	// ended and no DTR waiting: the link is forgotten after maxIdle.
	idle           int
	lastThroughput float64
	lastErrorRate  float64
	history        []LinkRecord // a ring of the last decisions, oldest first
}

// linkSet is the core's links.
type linkSet struct {
	cfg   OptimizerConfig
	links map[linkKey]*link
	// flows holds the running transfers on a tracked link, by DTR; a
	// transfer's link is counted in and out through its flow alone.
	flows map[uuid.UUID]*flow
	// now is the time of the last tick: a grant made since began no
	// earlier (its transfer's rate is never overestimated).
	now time.Time
}

// maxLinks bounds the links the optimizer tracks. A DTR on a link made
// while maxLinks are tracked has no link limit (MaxPerHost still applies)
// until idle links are forgotten; then its link is made at its next grant.
const maxLinks = 10000

// maxIdle is how many idle intervals in a row make a link forgotten,
// whether or not it has decided anything.
const maxIdle = 10

// flow is a running transfer's bytes: reported, and counted in its
// link's intervals. Workers report every lease renewal (10 s by default),
// as often as the optimizer decides, so a report's bytes are spread over
// the time since the last one: between reports a transfer is taken to
// move at its last rate (before its first, at its link's rate per
// transfer), and what it really moved corrects the count when it reports
// or ends.
type flow struct {
	l         *link
	started   time.Time // zero until the first tick after its grant
	lastAt    time.Time // of its last report (its start before one)
	lastBytes int64
	rate      float64 // bytes/s between its last two reports (0: none yet)
	counted   float64 // bytes counted in its link's intervals so far
	// reported is set by its first report; resumed marks a transfer
	// restored as running after a restart or failover, whose lastBytes
	// are its record's.
	reported, resumed bool
}

// estimate returns the bytes f has moved by now, as far as is known.
func (f *flow) estimate(now time.Time) float64 {
	if f.started.IsZero() {
		return f.counted
	}
	rate := f.rate
	if !f.reported {
		rate = f.l.perTransfer
	}
	return float64(f.lastBytes) + rate*now.Sub(f.lastAt).Seconds()
}

func newLinkSet(cfg OptimizerConfig) *linkSet {
	if !cfg.Enabled {
		return nil
	}
	cfg.History = max(cfg.History, 1)
	if cfg.Controller == nil {
		cfg.Controller = func(o OptimizerConfig) LinkController { return NewLinkOptimizer(o) }
	}
	return &linkSet{cfg: cfg, links: map[linkKey]*link{}, flows: map[uuid.UUID]*flow{}}
}

// of returns e's link, made on first use, or nil if e has no remote end.
func (ls *linkSet) of(e *entry) *link {
	if ls == nil || e.hosts == (linkKey{}) {
		return nil
	}
	l := ls.links[e.hosts]
	if l == nil {
		if len(ls.links) >= maxLinks {
			return nil
		}
		l = &link{key: e.hosts, limit: ls.cfg.Start, ctl: ls.cfg.Controller(ls.cfg)}
		ls.links[e.hosts] = l
	}
	return l
}

// atLimit reports whether e's link runs as many transfers as its limit.
func (ls *linkSet) atLimit(e *entry) bool {
	if ls == nil {
		return false
	}
	l := ls.links[e.hosts]
	return l != nil && l.running >= l.limit
}

// want marks e's link as wanted beyond its limit: a DTR waited for it.
func (ls *linkSet) want(e *entry) {
	if l := ls.of(e); l != nil {
		l.waited = true
	}
}

// add counts a grant of e in (n = 1) or out (n = -1). A grant is
// counted out of the link it was counted in, through its flow: one made
// while maxLinks were tracked was counted in none.
func (ls *linkSet) add(e *entry, n int) {
	if ls == nil {
		return
	}
	if n < 0 {
		if f := ls.flows[e.d.ID]; f != nil {
			f.l.running--
			delete(ls.flows, e.d.ID)
		}
		return
	}
	if l := ls.of(e); l != nil && ls.flows[e.d.ID] == nil {
		l.running++
		ls.flows[e.d.ID] = &flow{l: l, started: ls.now, lastAt: ls.now}
	}
}

// resume starts the byte count of a transfer restored as running from
// the bytes its record holds: the worker's next report counts from
// there, and its interval is marked absorbed (LinkSample.Absorbed).
func (ls *linkSet) resume(e *entry, bytes int64) {
	if ls == nil {
		return
	}
	if f := ls.flows[e.d.ID]; f != nil && bytes > 0 {
		f.lastBytes, f.counted, f.resumed = bytes, float64(bytes), true
	}
}

// moved takes a running transfer's report of the bytes it moved in all.
func (ls *linkSet) moved(now time.Time, e *entry, bytes int64) {
	if ls == nil {
		return
	}
	f := ls.flows[e.d.ID]
	if f == nil || bytes <= f.lastBytes {
		return
	}
	if f.started.IsZero() {
		f.started, f.lastAt = now, now
	}
	if dt := now.Sub(f.lastAt).Seconds(); dt > 0 {
		f.rate = float64(bytes-f.lastBytes) / dt
	}
	if !f.reported {
		f.reported = true
		switch span := now.Sub(f.started).Seconds(); {
		case f.resumed:
			// Some of its bytes may have moved before the restore.
			f.l.absorbed = true
		case span > 0:
			// The first report: its bytes were moved since the start,
			// those before the link's interval in earlier intervals. The
			// interval counts only its own part of them (at the mean
			// rate); what the earlier ones estimated stays theirs.
			f.rate = float64(bytes) / span
			if before := f.l.start.Sub(f.started).Seconds(); before > 0 {
				f.counted = f.rate * before
			}
		}
	}
	f.lastBytes, f.lastAt = bytes, now
}

// ended counts a transfer's result at now, before its slot is released:
// the bytes it moved correct what was counted of it.
func (ls *linkSet) ended(now time.Time, e *entry, r Result) {
	if ls == nil {
		return
	}
	f := ls.flows[e.d.ID]
	if f == nil {
		return
	}
	l := f.l
	l.advance(now) // its slot is released at now
	total := float64(max(r.Bytes, f.lastBytes, 0))
	l.bytes += total - f.counted
	f.counted = total
	if r.Returned {
		return
	}
	switch {
	case r.Error == nil:
		l.ended++
	case r.Error.Kind == dtr.ErrTemporaryRemote || r.Error.Kind == dtr.ErrTransferSpeed:
		l.ended++
		l.failed++
	}
}

// advance counts the transfers running since the last event until now.
func (l *link) advance(now time.Time) {
	if l.start.IsZero() {
		l.start, l.last = now, now
	}
	if dt := now.Sub(l.last).Seconds(); dt > 0 {
		l.runningTime += float64(l.running) * dt
		l.last = now
	}
}

// tick adds the time since the last one to each link's interval and
// decides the links whose interval is over. Links idle for ten intervals
// with nothing running are forgotten.
func (ls *linkSet) tick(now time.Time) {
	if ls == nil {
		return
	}
	ls.now = now
	due := false
	for _, l := range ls.links {
		due = due || !l.start.IsZero() && now.Sub(l.start) >= ls.cfg.Interval
	}
	for _, f := range ls.flows {
		if f.started.IsZero() {
			f.started, f.lastAt = now, now
		}
		if due && now.Sub(f.l.start) >= ls.cfg.Interval {
			// The bytes its link's closing interval should count.
			est := f.estimate(now)
			f.l.bytes += est - f.counted
			f.counted = est
		}
	}
	for k, l := range ls.links {
		if l.start.IsZero() {
			l.start, l.last = now, now
			continue
		}
		l.advance(now)
		span := now.Sub(l.start)
		if span < ls.cfg.Interval {
			continue
		}
		s := LinkSample{At: now, Interval: span, Limit: l.limit, Running: l.runningTime / span.Seconds(),
			Waiting: l.waited, Bytes: clampBytes(l.bytes), Ended: l.ended, Failed: l.failed, Absorbed: l.absorbed}
		if s.Running >= 0.5 {
			l.perTransfer = s.Throughput() / s.Running
		}
		idle := l.running == 0 && s.Bytes == 0 && s.Ended == 0 && !s.Waiting
		if !idle {
			l.idle = 0
		} else if l.idle++; l.idle >= maxIdle {
			delete(ls.links, k)
			continue
		}
		l.start, l.runningTime, l.bytes, l.ended, l.failed, l.waited, l.absorbed = now, 0, 0, 0, 0, false, false
		if idle {
			continue
		}
		d := l.ctl.Decide(s)
		d.Limit = min(max(d.Limit, ls.cfg.Min), ls.cfg.Max)
		l.lastThroughput, l.lastErrorRate = s.Throughput(), d.ErrorRate
		rec := LinkRecord{At: now, Running: s.Running, Throughput: s.Throughput(), EMA: d.EMA, ErrorRate: d.ErrorRate,
			Ended: s.Ended, Failed: s.Failed, From: l.limit, Limit: d.Limit, Reason: d.Reason}
		if len(l.history) >= ls.cfg.History {
			l.history = append(l.history[:0], l.history[1:]...)
		}
		l.history = append(l.history, rec)
		l.limit = d.Limit
	}
}

// clampBytes converts a byte count to int64, within 0 and MaxInt64.
func clampBytes(b float64) int64 {
	switch {
	case b <= 0 || math.IsNaN(b):
		return 0
	case b >= math.MaxInt64:
		return math.MaxInt64
	}
	return int64(b)
}

// Links describes the links the optimizer knows, busiest first; with
// history, each with its decisions (oldest first). Nil when it is off.
func (c *Core) Links(history bool) []LinkStatus {
	if c.links == nil {
		return nil
	}
	out := make([]LinkStatus, 0, len(c.links.links))
	for _, l := range c.links.links {
		s := LinkStatus{Source: c.endpointName(l.key[0]), Destination: c.endpointName(l.key[1]),
			Limit: l.limit, Running: l.running, Throughput: l.lastThroughput, ErrorRate: l.lastErrorRate}
		if n := len(l.history); n > 0 {
			last := l.history[n-1]
			s.Last = &last
			if history {
				s.History = append([]LinkRecord(nil), l.history...)
			}
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Running != out[j].Running {
			return out[i].Running > out[j].Running
		}
		if out[i].Source != out[j].Source {
			return out[i].Source < out[j].Source
		}
		return out[i].Destination < out[j].Destination
	})
	return out
}

// LinkLimit returns the limit of the link from source to destination (as
// in LinkStatus), and whether the optimizer knows it.
func (c *Core) LinkLimit(source, destination string) (int, bool) {
	for _, s := range c.Links(false) {
		if s.Source == source && s.Destination == destination {
			return s.Limit, true
		}
	}
	return 0, false
}

func (c *Core) endpointName(h uint32) string {
	if h == 0 {
		return LocalEndpoint
	}
	return c.names[h-1]
}

// linkOf names the link of a DTR's transfer ("" if it has none).
func (c *Core) linkName(e *entry) string {
	if e.hosts == (linkKey{}) {
		return ""
	}
	return c.endpointName(e.hosts[0]) + " → " + c.endpointName(e.hosts[1])
}
