package core

// Per-link adaptive concurrency: how many transfers a link (source
// endpoint → destination endpoint) may run at once, tuned from what its
// transfers achieve. The controller that decides is behind LinkController
// (optimizer.go holds Sluice's); this file keeps the links' measurements,
// enforces their limits in grants and answers queries.

import (
	"fmt"
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
	return OptimizerConfig{Enabled: true, Min: 2, Max: 100, Start: 8, Interval: 10 * time.Second, History: 32}
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
	// transfers it ran (weighted by time), Queued says whether DTRs waited
	// for the link at its end.
	Limit   int
	Running float64
	Waiting bool
	// Bytes is what its transfers moved (progress and results).
	Bytes int64
	// Ended counts the transfers that ended, Failed those of them that
	// failed in a way that points at the link (TEMPORARY_REMOTE,
	// TRANSFER_SPEED). Transfers that failed otherwise (a missing file,
	// a refused credential) or were cancelled count in neither.
	Ended, Failed int
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
	start          time.Time
	runningTime    float64 // transfer-seconds
	last           time.Time
	bytes          int64
	ended, failed  int
	waited         bool
	lastThroughput float64
	lastErrorRate  float64
	history        []LinkRecord // a ring of the last decisions, oldest first
}

// linkSet is the core's links.
type linkSet struct {
	cfg   OptimizerConfig
	links map[linkKey]*link
	// counted holds, per running transfer, the bytes already counted for
	// its current grant.
	counted map[uuid.UUID]int64
}

func newLinkSet(cfg OptimizerConfig) *linkSet {
	if !cfg.Enabled {
		return nil
	}
	if cfg.Controller == nil {
		cfg.Controller = func(o OptimizerConfig) LinkController { return NewLinkOptimizer(o) }
	}
	return &linkSet{cfg: cfg, links: map[linkKey]*link{}, counted: map[uuid.UUID]int64{}}
}

// of returns e's link, made on first use, or nil if e has no remote end.
func (ls *linkSet) of(e *entry) *link {
	if ls == nil || e.hosts == (linkKey{}) {
		return nil
	}
	l := ls.links[e.hosts]
	if l == nil {
		l = &link{key: e.hosts, limit: ls.cfg.Start, ctl: ls.cfg.Controller(ls.cfg)}
		ls.links[e.hosts] = l
	}
	return l
}

// full reports whether e's link runs as many transfers as its limit; a
// DTR found so marks the link as wanted beyond it.
func (ls *linkSet) full(e *entry) bool {
	l := ls.of(e)
	if l == nil || l.running < l.limit {
		return false
	}
	l.waited = true
	return true
}

// add counts a grant of e in (n = 1) or out (n = -1).
func (ls *linkSet) add(e *entry, n int) {
	l := ls.of(e)
	if l == nil {
		return
	}
	l.running += n
	if n > 0 {
		ls.counted[e.d.ID] = 0
	} else {
		delete(ls.counted, e.d.ID)
	}
}

// moved counts the bytes a running transfer reports having moved in all.
func (ls *linkSet) moved(e *entry, bytes int64) {
	l := ls.of(e)
	if l == nil {
		return
	}
	if done, ok := ls.counted[e.d.ID]; ok && bytes > done {
		l.bytes += bytes - done
		ls.counted[e.d.ID] = bytes
	}
}

// ended counts a transfer's result at now, before its slot is released.
func (ls *linkSet) ended(now time.Time, e *entry, r Result) {
	l := ls.of(e)
	if l == nil {
		return
	}
	l.advance(now) // its slot is released at now
	ls.moved(e, r.Bytes)
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
			Waiting: l.waited, Bytes: l.bytes, Ended: l.ended, Failed: l.failed}
		idle := l.running == 0 && s.Bytes == 0 && s.Ended == 0 && !s.Waiting
		if idle && len(l.history) > 0 && now.Sub(l.history[len(l.history)-1].At) > 10*ls.cfg.Interval {
			delete(ls.links, k)
			continue
		}
		l.start, l.runningTime, l.bytes, l.ended, l.failed, l.waited = now, 0, 0, 0, 0, false
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
