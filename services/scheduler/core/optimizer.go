package core

// Sluice's link controller: a throughput-gradient hill-climb. Every
// interval it compares what one transfer of the link moves with the best
// any transfer of the link has moved (its uncongested rate). While DTRs
// wait and each added transfer pays off, the limit grows (by a tenth, by
// half after two increases in a row, halfway to a knee found before);
// once the rate per transfer falls well below the uncongested one the link
// is past its knee and the limit goes back at once; an increase that did
// not pay off is undone; a steady link probes for added capacity every
// few intervals. Failures that point at the link halve the limit.

import (
	"fmt"
	"math"
	"time"
)

// The controller's thresholds.
const (
	// Below shrinkEfficiency of the uncongested rate per transfer, the
	// link is past its knee.
	shrinkEfficiency = 0.75
	// An increase is kept if the link's throughput grew by payOff of the
	// proportional gain, or if its transfers still each move at least
	// keepEfficiency of the uncongested rate (throughput measured over
	// one interval is noisy; the rate per transfer less so).
	keepEfficiency = 0.85
	// maxErrorRate is the failure rate above which the limit halves,
	// given at least minFailures failures. The rate is judged over the
	// last errorWindow, widened while it holds fewer than errorEnded
	// ended transfers up to errorMaxWindow: a slow link, whose few
	// transfers end seldom, is judged by its last errorEnded results.
	maxErrorRate   = 0.03
	errorWindow    = time.Minute
	errorMaxWindow = 30 * time.Minute
	errorEnded     = 50
	minFailures    = 3
	// errorCeilingFor is how long the concurrency at which failures rose
	// stays a ceiling for growth.
	errorCeilingFor = 2 * time.Minute
	payOff          = 0.5
	// probeEvery is how many decisions a steady link waits before trying
	// a tenth more transfers (twice as many after a probe that did not
	// pay off).
	probeEvery = 2
)

// LinkOptimizer is Sluice's LinkController for one link.
type LinkOptimizer struct {
	cfg OptimizerConfig
	// settle skips the interval after a change: transfers started or
	// ended in it.
	settle bool
	// ema smooths the throughput (α 0.5), for display.
	ema float64
	// best is the highest throughput per transfer seen since the link's
	// rate per transfer last changed: its uncongested rate.
	best float64
	// fromLimit and fromThroughput are the limit and throughput before
	// the last increase, while its effect is judged (0: no increase).
	fromLimit      int
	fromThroughput float64
	// streak counts increases in a row that paid off.
	streak int
	// steady counts decisions since the limit last changed, for probing.
	steady int
	// lowered is the rate per transfer when the limit was last cut for
	// congestion, until the cut is judged (0: none), and cutRatio the
	// transfers running then over the new limit.
	lowered, cutRatio float64
	// failedProbes counts probes in a row that did not pay off: the next
	// waits longer.
	failedProbes int
	// knee is the lowest limit found past the link's knee since (0: none):
	// growth by half stops below it, and only a probe past it that pays
	// off forgets it.
	knee int
	// errs holds the (ended, failed) counts of the last errorMaxWindow.
	errs []errorCount
	// byCount is set while the link is judged by the transfers it ends
	// per second (no bytes reported), not by its throughput.
	byCount bool
	// ceiling is the concurrency at which failures rose, until ceilingEnds.
	ceiling     int
	ceilingEnds time.Time
}

type errorCount struct {
	at            time.Time
	ended, failed int
}

// NewLinkOptimizer returns Sluice's controller for a new link.
func NewLinkOptimizer(cfg OptimizerConfig) *LinkOptimizer {
	return &LinkOptimizer{cfg: cfg, streak: 2, steady: probeEvery}
}

// Decide implements LinkController.
func (o *LinkOptimizer) Decide(s LinkSample) LinkDecision {
	d := o.decide(s)
	o.settle = d.Limit != s.Limit
	return d
}

func (o *LinkOptimizer) decide(s LinkSample) LinkDecision {
	thr := s.Throughput()
	if o.ema == 0 {
		o.ema = thr
	}
	o.ema += 0.5 * (thr - o.ema)
	d := LinkDecision{Limit: s.Limit, EMA: o.ema}

	// Failures first: over the last minute of results, or the last
	// errorEnded of them if the minute holds fewer.
	o.errs = append(o.errs, errorCount{s.At, s.Ended, s.Failed})
	for len(o.errs) > 0 && s.At.Sub(o.errs[0].at) >= errorMaxWindow {
		o.errs = o.errs[1:]
	}
	ended, failed := 0, 0
	window := time.Duration(0)
	for i := len(o.errs) - 1; i >= 0; i-- {
		c := o.errs[i]
		if s.At.Sub(c.at) >= errorWindow && ended >= errorEnded {
			break
		}
		ended, failed = ended+c.ended, failed+c.failed
		window = s.At.Sub(c.at) + s.Interval
	}
	if ended > 0 {
		d.ErrorRate = float64(failed) / float64(ended)
	}
	inUse := min(s.Limit, int(math.Ceil(s.Running-0.05)))
	if failed >= minFailures && d.ErrorRate > maxErrorRate {
		d.Limit = max(1, inUse/2)
		d.Reason = fmt.Sprintf("%d of %d transfers failed in the last %s (%.1f%% > %.0f%%): halved from %d running",
			failed, ended, window.Round(time.Second), 100*d.ErrorRate, 100*maxErrorRate, inUse)
		o.errs = o.errs[:0]
		o.ceiling, o.ceilingEnds = max(inUse, 2), s.At.Add(errorCeilingFor)
		o.fromLimit, o.streak, o.steady, o.lowered, o.failedProbes = 0, 0, 0, 0, 0
		return d
	}
	if s.Running < 0.5 {
		d.Reason = "no transfer ran: nothing to judge by"
		return d
	}
	if thr == 0 && s.Ended == 0 {
		d.Reason = "no bytes moved and no transfer ended: nothing to judge by"
		return d
	}
	if byCount := thr == 0; byCount != o.byCount {
		// From bytes to transfers per second or back: an increase being
		// judged was measured in the other unit. (The uncongested rate
		// stays: it is in bytes, and only bytes change it.)
		o.byCount, o.fromLimit = byCount, 0
	}
	if thr == 0 {
		return o.byCompletions(s, d)
	}
	if s.Absorbed {
		// A restored transfer's first report: bytes from before the
		// interval are in it.
		d.Reason = "a transfer restored after a restart reported for the first time: bytes from before the interval, not judged"
		return d
	}
	per := thr / s.Running
	if o.settle {
		o.settle = false
		d.Reason = fmt.Sprintf("settling after the change to %d", s.Limit)
		return d
	}
	if o.lowered > 0 && s.Running > float64(s.Limit)+0.5 {
		d.Reason = fmt.Sprintf("waiting for the transfers above the limit to end (%.1f running)", s.Running)
		return d
	}
	if o.fromLimit > 0 && s.Running < float64(s.Limit)-0.5 && s.Waiting {
		d.Reason = fmt.Sprintf("waiting for the link to run up to its limit (%.1f running)", s.Running)
		return d
	}
	if lowered := o.lowered; lowered > 0 {
		o.lowered = 0
		// A cut from n to m transfers should make each up to n/m times
		// faster; under a third of that gain is no recovery. (A rate that
		// fell further is a link that lost capacity meanwhile: judged
		// below against the uncongested rate.)
		if per >= 0.9*lowered && per < lowered*(1+(o.cutRatio-1)/3) {
			// Fewer transfers did not make each faster: the link's rate
			// per transfer itself has fallen. Judge by the rate it has now.
			o.best, o.steady = per, 0
			d.Reason = fmt.Sprintf("the rate per transfer did not recover (%s): it is the link's own now", rate(per))
			return d
		}
	}
	o.best = max(o.best, per)
	eff := per / o.best
	from, fromThr := o.fromLimit, o.fromThroughput
	o.fromLimit = 0
	o.steady++
	switch {
	case eff < shrinkEfficiency && from > 0 && from < s.Limit:
		// The last increase went past the knee: back to where it began
		// (the throughput measured past the knee, less than the link can
		// carry, would put the knee too low).
		// The knee is between from and the limit: probe again soon.
		d.Limit = from
		o.streak, o.steady = 0, probeEvery-1
		o.knee = s.Limit
		d.Reason = fmt.Sprintf("past the knee: %s per transfer is %.0f%% of the uncongested %s; back to %d",
			rate(per), 100*eff, rate(o.best), from)
		return d
	case eff < shrinkEfficiency:
		// A tenth above what the throughput measured past the knee needs:
		// congestion lowers that throughput, so the knee is higher.
		knee := int(math.Ceil(1.1 * thr / o.best))
		d.Limit = max(1, min(knee, s.Limit-1))
		o.lowered, o.cutRatio, o.streak, o.steady = per, s.Running/float64(d.Limit), 0, 0
		o.knee = s.Limit
		d.Reason = fmt.Sprintf("past the knee: %s per transfer is %.0f%% of the uncongested %s; %s needs %d",
			rate(per), 100*eff, rate(o.best), rate(thr), knee)
		return d
	case from > 0 && fromThr > 0:
		gain := thr/fromThr - 1
		expected := float64(s.Limit-from) / float64(from)
		if gain < payOff*expected && eff < keepEfficiency {
			d.Limit = from
			o.streak, o.steady = 0, 0
			o.failedProbes++
			o.knee = s.Limit
			d.Reason = fmt.Sprintf("%d more transfers brought %+.0f%% (%s), not the %.0f%% they should: back to %d",
				s.Limit-from, 100*gain, rate(thr), 100*payOff*expected, from)
			return d
		}
		o.streak++
		o.failedProbes = 0
		if o.knee > 0 && s.Limit >= o.knee {
			o.knee = 0 // past where the knee was: the link carries more now
		}
		if !s.Waiting {
			d.Reason = fmt.Sprintf("%d more transfers brought %+.0f%% (%s); no DTR waits for more", s.Limit-from, 100*gain, rate(thr))
			return d
		}
		return o.grow(s, thr, d, fmt.Sprintf("%d more transfers brought %+.0f%% (%s)", s.Limit-from, 100*gain, rate(thr)))
	case !s.Waiting || s.Running < 0.8*float64(s.Limit):
		d.Reason = fmt.Sprintf("below the limit: %.1f of %d running, no DTR waited for the link", s.Running, s.Limit)
		return d
	case o.steady < probeEvery<<min(o.failedProbes, 1):
		d.Reason = fmt.Sprintf("steady at %s: probing for more in %s", rate(thr), time.Duration(probeEvery<<min(o.failedProbes, 1)-o.steady)*o.cfg.Interval)
		return d
	default:
		return o.grow(s, thr, d, fmt.Sprintf("probing: %s at %d", rate(thr), s.Limit))
	}
}

// byCompletions judges a link whose transfers report no bytes (empty
// files, or workers that do not report) by the transfers it ends per
// second: an increase that did not make them end faster in proportion
// goes back, and while DTRs wait and the link runs at its limit it grows.
func (o *LinkOptimizer) byCompletions(s LinkSample, d LinkDecision) LinkDecision {
	done := float64(s.Ended) / s.Interval.Seconds()
	if o.settle {
		o.settle = false
		d.Reason = fmt.Sprintf("settling after the change to %d", s.Limit)
		return d
	}
	from, fromDone := o.fromLimit, o.fromThroughput
	o.fromLimit = 0
	o.steady++
	if from > 0 && fromDone > 0 && from < s.Limit {
		gain := done/fromDone - 1
		expected := float64(s.Limit-from) / float64(from)
		if gain < payOff*expected {
			d.Limit = from
			o.streak, o.steady = 0, 0
			o.knee = s.Limit
			d.Reason = fmt.Sprintf("no bytes moved; %d more transfers ended %+.0f%% more per second (%.2f/s), not the %.0f%% they should: back to %d",
				s.Limit-from, 100*gain, done, 100*payOff*expected, from)
			return d
		}
		o.streak++
	}
	if !s.Waiting || s.Running < 0.8*float64(s.Limit) {
		d.Reason = fmt.Sprintf("no bytes moved; below the limit: %.1f of %d running, no DTR waited for the link", s.Running, s.Limit)
		return d
	}
	return o.grow(s, done, d, fmt.Sprintf("no bytes moved; %.2f transfers ended per second at %d", done, s.Limit))
}

// grow raises the limit: by a tenth while probing, by half once two
// increases in a row paid off, to below the concurrency at which failures
// rose while that is recent.
func (o *LinkOptimizer) grow(s LinkSample, thr float64, d LinkDecision, why string) LinkDecision {
	step := max(1, int(math.Ceil(0.1*float64(s.Limit))))
	how := "+10%"
	if o.streak >= 2 {
		step, how = max(1, int(math.Ceil(0.5*float64(s.Limit)))), "+50%"
	}
	if tenth := max(1, int(math.Ceil(0.1*float64(s.Limit)))); o.knee > s.Limit {
		// Below where the knee was found: halfway there, or a tenth.
		step = max(tenth, (o.knee-s.Limit)/2)
		how = fmt.Sprintf("+%d, below the knee found at %d", step, o.knee)
	} else if o.knee > 0 {
		step, how = tenth, fmt.Sprintf("+10%%, past the knee found at %d", o.knee)
	}
	d.Limit = min(s.Limit+step, o.cfg.Max)
	if o.ceiling > 0 && s.At.Before(o.ceilingEnds) && d.Limit >= o.ceiling {
		d.Limit = max(s.Limit, o.ceiling-1)
		how += fmt.Sprintf(", kept below %d where failures rose", o.ceiling)
	}
	d.Reason = fmt.Sprintf("%s: %s", why, how)
	if d.Limit == s.Limit {
		d.Reason = fmt.Sprintf("steady at %s: kept below %d, where failures rose", rate(thr), o.ceiling)
	}
	if d.Limit > s.Limit {
		o.fromLimit, o.fromThroughput, o.steady = s.Limit, thr, 0
	}
	return d
}

// rate formats bytes per second.
func rate(b float64) string {
	switch {
	case b >= 1e9:
		return fmt.Sprintf("%.2f GB/s", b/1e9)
	case b >= 1e6:
		return fmt.Sprintf("%.1f MB/s", b/1e6)
	default:
		return fmt.Sprintf("%.0f kB/s", b/1e3)
	}
}
