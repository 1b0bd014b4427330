package scheduler

// The stuck-DTR detector: a DTR that has been in its state past the time
// that state should take, and waits for nothing that will come (no full
// share, endpoint, staging limit, retry delay or cache download holds it),
// is stuck. The sweep (sweep) finds them from time to time; each is logged
// once when it becomes stuck and once when it is no longer, and counted in
// the gauge sluice_scheduler_stuck_dtrs.

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// The deadline a DTR may stay in a state before it counts as stuck, if
// nothing legitimately holds it, is the core's ageing deadline for that
// state (core.Config.DeadlineFor: ARC's 2 h for a transfer, 24 h for a
// cacheable DTR on its way to its cache check, 1 h otherwise, as
// SLUICE_AGE_AFTER and SLUICE_AGE_AFTER_STATES set them).

// stuckDetector remembers the DTRs found stuck, for one report per DTR
// and episode.
type stuckDetector struct {
	log *slog.Logger
	// deadline is how long a DTR may stay in a state (core.Config.DeadlineFor).
	deadline func(dtr.State, bool) time.Duration
	// stuck are those found stuck, with the sweep that last found them.
	stuck map[uuid.UUID]stuckEntry
	sweep uint64
	// count is len(stuck), for the metrics.
	count atomic.Int64
}

type stuckEntry struct {
	dtr   api.StuckDTR
	share string
	owner dtr.Identity
	sweep uint64
}

func newStuckDetector(log *slog.Logger, deadline func(dtr.State, bool) time.Duration) *stuckDetector {
	return &stuckDetector{log: log, deadline: deadline, stuck: map[uuid.UUID]stuckEntry{}}
}

// begin starts a sweep.
func (d *stuckDetector) begin() { d.sweep++ }

// observe judges one DTR; get reads its record (only for one stuck).
func (d *stuckDetector) observe(now time.Time, st core.Standing, get func(uuid.UUID) (dtr.DTR, bool)) {
	if waits(now, st) || st.Since.IsZero() {
		return
	}
	deadline := d.deadline(st.State, st.Cacheable)
	if now.Sub(st.Since) <= deadline {
		return
	}
	e, known := d.stuck[st.DTR]
	if known && e.dtr.State == st.State && e.dtr.Since.Equal(st.Since) {
		e.sweep = d.sweep
		e.dtr.Hold = string(st.Hold)
		d.stuck[st.DTR] = e
		return
	}
	rec, _ := get(st.DTR)
	e = stuckEntry{dtr: api.StuckDTR{DTR: st.DTR, State: st.State, Hold: string(st.Hold), Since: st.Since, Deadline: deadline},
		share: rec.Share, owner: rec.Owner, sweep: d.sweep}
	d.stuck[st.DTR] = e
	d.log.Warn("DTR stuck: in its state past its deadline, waiting for nothing that will come",
		"dtr", st.DTR, "job", rec.JobID, "state", st.State, "hold", st.Hold, "since", st.Since, "deadline", deadline)
}

// waits says whether a DTR legitimately waits (core.Hold.Waits); one
// waiting until a time (a retry's delay, a cache download) waits only
// until stuckGrace past it: the next step should have moved it on.
func waits(now time.Time, st core.Standing) bool {
	if !st.Hold.Waits() {
		return false
	}
	return st.Until.IsZero() || now.Before(st.Until.Add(stuckGrace))
}

// stuckGrace is how long past the end of its wait a DTR still counts as
// waiting.
const stuckGrace = time.Minute

// end ends a sweep: those not found stuck in it are no longer.
func (d *stuckDetector) end() {
	for id, e := range d.stuck {
		if e.sweep != d.sweep {
			delete(d.stuck, id)
			d.log.Info("DTR no longer stuck", "dtr", id, "was", e.dtr.State)
		}
	}
	d.count.Store(int64(len(d.stuck)))
}

// ids returns the DTRs found stuck.
func (d *stuckDetector) ids() []uuid.UUID {
	ids := make([]uuid.UUID, 0, len(d.stuck))
	for id := range d.stuck {
		ids = append(ids, id)
	}
	return ids
}

// list returns the stuck DTRs that owns says are the caller's (nil:
// every one).
func (d *stuckDetector) list(owns func(dtr.Identity) bool) []api.StuckDTR {
	var out []api.StuckDTR
	for _, e := range d.stuck {
		if owns == nil || owns(e.owner) {
			out = append(out, e.dtr)
		}
	}
	return out
}

// reset forgets every DTR found stuck (a term lost).
func (d *stuckDetector) reset() {
	d.stuck = map[uuid.UUID]stuckEntry{}
	d.count.Store(0)
}

// sweepEvery is how often a sweep of the DTRs for changes of what holds
// them and for stuck ones begins: every 10 s, every minute with more than
// 100,000 DTRs, since it looks at every one; or, if later, once the last
// one is over (a sweep of 10,000,000 takes a couple of minutes, a slice at
// each sample: sweepSlice).
func sweepEvery(dtrs int) time.Duration {
	if dtrs > 100_000 {
		return time.Minute
	}
	return 10 * time.Second
}

// maxHoldEvents is the most events of a changed hold one sweep records;
// the rest are recorded by the next sweeps.
const maxHoldEvents = 1000

// sweepSlice is the most time one sample spends on a sweep: a sweep over
// millions of DTRs goes on over many samples, between which the scheduler
// goes on deciding (over 10,000,000 it held the loop for about 6 s when
// it was made all at once).
const sweepSlice = 50 * time.Millisecond

// sweepStep is how many DTRs a sweep looks at between two looks at the
// clock.
const sweepStep = 4096

// sweep looks at where every DTR stands, at once.
func (s *Service) sweep(now time.Time) {
	s.stopSweep()
	s.sweepSome(now, 0)
}

// sweepSome goes on with the sweep under way, or begins one, for at most
// limit (0: until it is over). A sweep looks at where every DTR stands: a
// DTR still in its state but held by something else is recorded in its
// history, and stuck DTRs are reported. Only the leader sweeps: a
// standby's copy lags, and its history is not recorded; it reports no
// stuck DTR. Over more than longestWalk DTRs the sweep also finds the
// longest-waiting ones, for the web page.
func (s *Service) sweepSome(now time.Time, limit time.Duration) {
	if s.role.Load() != roleLeader {
		s.stopSweep()
		if s.stuck.count.Load() != 0 {
			s.stuck.reset()
		}
		return
	}
	if s.pass == nil {
		// Several times the longest waits shown are kept: the oldest are
		// the next granted, and a pass over millions takes minutes.
		s.pass, s.passHeld = s.core.BeginPass(4*longestShown), 0
		s.stuck.begin()
	}
	var items []historyItem
	term := s.term.Load()
	observe := func(st core.Standing) {
		if s.passHeld < maxHoldEvents {
			if it, ok := s.history.held(now, st, term); ok {
				items = append(items, it)
				s.passHeld++
			}
		}
		s.stuck.observe(now, st, s.core.Get)
	}
	began := time.Now()
	over := false
	for !over {
		over = s.pass.Step(sweepStep, observe)
		if limit > 0 && time.Since(began) >= limit {
			break
		}
	}
	s.history.send(items)
	if !over {
		return
	}
	// Those found stuck early in a long pass may have moved on since:
	// they are looked at again, as they stand now, and only those still
	// stuck are kept.
	s.stuck.begin()
	s.core.StandingsOf(s.stuck.ids(), func(st core.Standing) { s.stuck.observe(now, st, s.core.Get) })
	s.stuck.end()
	s.history.swept = true
	s.stuck.log.Debug("swept", "dtrs", s.pass.Seen(), "took", time.Since(s.sweptAt).Round(time.Millisecond), "stuck", s.stuck.count.Load())
	if s.core.Len() > longestWalk {
		s.setLongest(now, s.pass.Longest(longestShown))
	}
	s.pass = nil
}

// stopSweep abandons the sweep under way, if any.
func (s *Service) stopSweep() {
	if s.pass != nil {
		s.pass.Stop()
		s.pass = nil
	}
}

// registerHistoryMetrics publishes the stuck DTRs and the history's
// counters.
func (s *Service) registerHistoryMetrics(meter metric.Meter) error {
	stuck, err := meter.Int64ObservableGauge("sluice.scheduler.stuck_dtrs",
		metric.WithDescription("DTRs in their state past its deadline that wait for nothing that will come"))
	if err != nil {
		return err
	}
	written, err := meter.Int64ObservableCounter("sluice.scheduler.history.events",
		metric.WithDescription("events of DTRs' histories stored"))
	if err != nil {
		return err
	}
	dropped, err := meter.Int64ObservableCounter("sluice.scheduler.history.dropped",
		metric.WithDescription("events of DTRs' histories not kept: cause=queue (the writer behind), store (refused), full (the oldest, dropped by a full stream; an estimate)"))
	if err != nil {
		return err
	}
	unawaited, err := meter.Int64ObservableCounter("sluice.scheduler.history.unawaited",
		metric.WithDescription("commits that acknowledged their inputs without waiting for their history: the history store had not answered within the wait"))
	if err != nil {
		return err
	}
	full, err := meter.Int64ObservableGauge("sluice.scheduler.history.full",
		metric.WithDescription("1 while the stream SLUICE_HISTORY is full and drops its oldest events"))
	if err != nil {
		return err
	}
	size, err := meter.Int64ObservableGauge("sluice.scheduler.history.bytes",
		metric.WithDescription("bytes the stream SLUICE_HISTORY holds"), metric.WithUnit("By"))
	if err != nil {
		return err
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		h := s.historyStats
		o.ObserveInt64(stuck, s.stuck.count.Load())
		o.ObserveInt64(written, int64(h.written.Load()))
		for cause, n := range map[string]uint64{"queue": h.droppedQueue.Load(), "store": h.droppedStore.Load(), "full": h.droppedFull.Load()} {
			o.ObserveInt64(dropped, int64(n), metric.WithAttributes(attribute.String("cause", cause)))
		}
		o.ObserveInt64(unawaited, int64(h.unawaited.Load()))
		o.ObserveInt64(full, h.full.Load())
		o.ObserveInt64(size, h.bytes.Load())
		return nil
	}, stuck, written, dropped, unawaited, full, size)
	if err != nil {
		return fmt.Errorf("scheduler history metrics: %w", err)
	}
	return nil
}
