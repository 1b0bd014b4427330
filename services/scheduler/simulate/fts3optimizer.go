package simulate

// FTS3's connection optimizer, re-implemented from its published rules for
// comparison with Sluice's (core.LinkOptimizer). Once a minute it compares
// the link's success rate and an exponential moving average (α 0.1) of its
// throughput with the previous minute's: a success rate under 97% takes 2
// off the limit, a falling one 1; with a good success rate a rising
// average adds 1 (2 in its aggressive mode) and a falling one takes 1 off;
// nothing changes when there is no throughput yet. When the success rate
// and the average are what they were at the last decision, it decides
// nothing until its steady interval (5 minutes) has passed since then. A
// link with no range configured starts at the range's minimum (2). The
// limit is kept within the range, and not raised while fewer DTRs wait
// than it allows.
//
// What FTS3 reads from its database is taken here from the samples the
// core gives every interval: throughput is the bytes of the last minute,
// the success rate is over the last 5, 15 or 30 minutes depending on how
// long transfers take (estimated from running and ended transfers), its
// retry count is the failures of that window, and "files in the queue"
// is whether a DTR waited for the link. File sizes are not compared (the
// rule that holds when they shrink never fires with the model's files).

import (
	"fmt"
	"time"

	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// FTS3's constants.
const (
	fts3Interval       = time.Minute
	fts3EMAAlpha       = 0.1
	fts3MaxSuccessRate = 100.0
	fts3MedSuccessRate = 98.0
	fts3LowSuccessRate = 97.0
	fts3BaseSuccess    = 96.0
	// fts3SteadyInterval is FTS3's OptimizerSteadyInterval default.
	fts3SteadyInterval = 5 * time.Minute
)

// fts3State is what FTS3 keeps of a link's previous decision.
type fts3State struct {
	throughput, ema, successRate float64
	retries                      int
}

// FTS3Optimizer is FTS3's rule as a core.LinkController for one link.
type FTS3Optimizer struct {
	cfg     core.OptimizerConfig
	samples []core.LinkSample // the last 30 minutes
	last    time.Time         // of the last run
	stored  time.Time         // of the last decision stored (prev)
	prev    *fts3State
	// Aggressive is FTS3's optimizer mode 2 (steps of +2).
	Aggressive bool
}

// LinkControllers are the link controllers sluice simulate --links may
// compare, by name: nil is the core's own optimizer.
var LinkControllers = map[string]func(core.OptimizerConfig) core.LinkController{
	"sluice": nil,
	"fts3":   NewFTS3Optimizer,
}

// NewFTS3Optimizer returns FTS3's rule for a new link.
func NewFTS3Optimizer(cfg core.OptimizerConfig) core.LinkController {
	return &FTS3Optimizer{cfg: cfg}
}

// Decide implements core.LinkController.
func (f *FTS3Optimizer) Decide(s core.LinkSample) core.LinkDecision {
	f.samples = append(f.samples, s)
	for len(f.samples) > 0 && s.At.Sub(f.samples[0].At) >= 30*time.Minute {
		f.samples = f.samples[1:]
	}
	d := core.LinkDecision{Limit: s.Limit}
	if f.prev != nil {
		d.EMA = f.prev.ema
		d.ErrorRate = 1 - f.prev.successRate/100
	}
	if f.prev == nil && s.Limit != f.cfg.Min {
		// No decision stored yet: a link with no range of its own starts
		// at the minimum (the core made it at its own start).
		d.Limit, d.Reason = f.cfg.Min, fmt.Sprintf("FTS3: no information: an unconfigured link starts at its minimum %d", f.cfg.Min)
		f.samples = f.samples[:0] // measured from here
		return d
	}
	if !f.last.IsZero() && s.At.Sub(f.last) < fts3Interval {
		d.Reason = "FTS3 decides once a minute"
		return d
	}
	f.last = s.At
	cur := f.measure(s.At)
	if f.prev == nil {
		cur.ema = cur.throughput
		f.prev, f.stored = &cur, s.At
		d.EMA, d.ErrorRate = cur.ema, 1-cur.successRate/100
		d.Reason = "first feedback stored"
		return d
	}
	prev := *f.prev
	cur.ema = prev.ema
	if cur.throughput > 0 {
		cur.ema = fts3EMAAlpha*cur.throughput + (1-fts3EMAAlpha)*prev.ema
	}
	if cur.successRate == prev.successRate && cur.ema == prev.ema && s.At.Sub(f.stored) < fts3SteadyInterval {
		d.Reason = "FTS3: same success rate and throughput EMA, not enough time passed since the last update: skip"
		return d
	}
	f.stored = s.At
	prevValue := s.Limit
	var decision int
	var why string
	switch {
	case cur.successRate < fts3LowSuccessRate:
		if cur.successRate > prev.successRate && cur.successRate >= fts3BaseSuccess && cur.retries <= prev.retries {
			decision, why = prevValue, "bad link efficiency but progressively improving"
		} else {
			decision, why = prevValue-2, "bad link efficiency"
		}
	case cur.successRate < prev.successRate:
		decision, why = prevValue-1, "worse link efficiency"
	case cur.ema == 0:
		decision, why = prevValue, "steady, not enough throughput information"
	default:
		// Good success rate (and the rule's fallback, which does the same).
		switch {
		case cur.ema < prev.ema:
			decision, why = prevValue-1, "good link efficiency, throughput deterioration"
		case cur.ema > prev.ema && f.Aggressive:
			decision, why = prevValue+2, "good link efficiency, average throughput larger than the preceding"
		case cur.ema > prev.ema:
			decision, why = prevValue+1, "good link efficiency, average throughput larger than the preceding"
		default:
			decision, why = prevValue+1, "good link efficiency, increment"
		}
	}
	if decision < f.cfg.Min {
		decision, why = f.cfg.Min, why+"; hit lower range limit"
	} else if decision > f.cfg.Max {
		decision, why = f.cfg.Max, why+"; hit upper range limit"
	}
	if decision > prevValue && !s.Waiting {
		decision, why = prevValue, why+"; not enough files in the queue"
	}
	f.prev = &cur
	d.Limit, d.Reason, d.EMA, d.ErrorRate = decision, "FTS3: "+why, cur.ema, 1-cur.successRate/100
	return d
}

// measure reads the link's state as FTS3 would at now.
func (f *FTS3Optimizer) measure(now time.Time) fts3State {
	var st fts3State
	var bytes int64
	var span time.Duration
	var ended int
	var running float64
	for _, s := range f.samples {
		if now.Sub(s.At) < fts3Interval {
			bytes += s.Bytes
			span += s.Interval
		}
		if now.Sub(s.At) < 30*time.Minute {
			ended += s.Ended
			running += s.Running * s.Interval.Seconds()
		}
	}
	if span > 0 {
		st.throughput = float64(bytes) / span.Seconds()
	}
	// Little's law: the mean time a transfer takes.
	frame := 30 * time.Minute
	if ended > 0 {
		avg := running / float64(ended)
		switch {
		case avg > 0 && avg < 30:
			frame = 5 * time.Minute
		case avg > 30 && avg < 900:
			frame = 15 * time.Minute
		}
	}
	good, bad := 0, 0
	for _, s := range f.samples {
		if now.Sub(s.At) < frame {
			good += s.Ended - s.Failed
			bad += s.Failed
		}
	}
	st.successRate = fts3MaxSuccessRate
	if good+bad > 0 {
		st.successRate = 100 * float64(good) / float64(good+bad)
	}
	st.retries = bad
	return st
}

// String names the rule.
func (f *FTS3Optimizer) String() string {
	return fmt.Sprintf("fts3 (mode %d)", map[bool]int{false: 1, true: 2}[f.Aggressive])
}
