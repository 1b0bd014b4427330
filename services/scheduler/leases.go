package scheduler

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// leaseClock stops the core's lease clock while the scheduler cannot hear
// the workers, and starts it again once it has heard what they said
// meanwhile. A lease runs out only if the scheduler could have heard of
// the grant for the whole lease:
//   - while its connection to NATS is down (its own, whatever the workers'),
//   - after a step that came more than stallAfter after the one before (the
//     process frozen, a pause of the machine, a commit that waited long),
//   - and after a restart,
//
// the clock stands still, and it starts again only once the results and
// renewals stored in SLUICE_RESULTS by then have been taken: those up to
// the stream's last message when the connection was back, or all of them
// when the consumer has nothing pending or unacknowledged. Every lease held
// gets the time back (core.ResumeLeases), so work that workers finished
// during an outage is taken as theirs and not done again.
type leaseClock struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	core *core.Core
	log  *slog.Logger
	// stallAfter is the longest gap between steps that is not a stall.
	stallAfter time.Duration
	// last is when the last step began with the connection up.
	last time.Time
	// stopped is when the clock stopped, for the log.
	stopped time.Time
	// upTo is the stream sequence that a result taken must reach before
	// the clock starts again (known says it has been read); taken is the
	// highest sequence taken since the clock stopped.
	upTo, taken uint64
	known       bool
	nextLook    time.Time
}

func newLeaseClock(nc *nats.Conn, js jetstream.JetStream, c *core.Core, log *slog.Logger, tick time.Duration) *leaseClock {
	return &leaseClock{nc: nc, js: js, core: c, log: log, stallAfter: max(2*time.Second, 40*tick)}
}

// stop stops the clock at since (if it runs) and forgets what it was
// waiting for: more may have been said since.
func (l *leaseClock) stop(since time.Time, why string) {
	if !l.core.LeasesPaused() {
		l.core.PauseLeases(since)
		l.stopped, l.taken = since, 0
		l.log.Warn("lease clock stopped: no lease runs out until the results stored meanwhile are taken", "why", why)
	}
	l.known = false
}

// step is called as each step begins, with its time.
func (l *leaseClock) step(now time.Time) {
	up := l.nc.Status() == nats.CONNECTED
	switch {
	case !up:
		l.stop(l.lastOr(now), "no connection to NATS")
	case !l.last.IsZero() && now.Sub(l.last) > l.stallAfter:
		l.stop(l.last, "the scheduler did not come round for "+now.Sub(l.last).Round(time.Millisecond).String())
	}
	if up {
		l.last = now
	}
}

func (l *leaseClock) lastOr(now time.Time) time.Time {
	if l.last.IsZero() {
		return now
	}
	return l.last
}

// took records a result or renewal taken from SLUICE_RESULTS.
func (l *leaseClock) took(jm jetstream.Msg) {
	if !l.core.LeasesPaused() {
		return
	}
	if md, err := jm.Metadata(); err == nil && md.Sequence.Stream > l.taken {
		l.taken = md.Sequence.Stream
	}
}

// resume starts the clock again, before the step's leases are looked at,
// if what was stored while it stood still has been taken.
func (l *leaseClock) resume(ctx context.Context, now time.Time) {
	if !l.core.LeasesPaused() || l.nc.Status() != nats.CONNECTED {
		return
	}
	caughtUp := l.known && l.taken >= l.upTo
	if !caughtUp && !now.Before(l.nextLook) {
		l.nextLook = now.Add(250 * time.Millisecond)
		caughtUp = l.look(ctx)
	}
	if caughtUp {
		l.core.ResumeLeases(now)
		l.log.Info("lease clock started again; every lease held got the time back", "stopped_for", now.Sub(l.stopped).Round(time.Millisecond))
	}
}

// look reads how far the results go, and whether all are taken.
func (l *leaseClock) look(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if !l.known {
		st, err := l.js.Stream(ctx, bus.StreamResults)
		if err != nil {
			return false
		}
		info, err := st.Info(ctx)
		if err != nil {
			return false
		}
		if info.State.Msgs == 0 {
			return true
		}
		l.upTo, l.known = info.State.LastSeq, true
		if l.taken >= l.upTo {
			return true
		}
	}
	// Nothing left to deliver and nothing delivered unacknowledged: all
	// was taken (the workers may have no more to say).
	cons, err := l.js.Consumer(ctx, bus.StreamResults, bus.ConsumerSched)
	if err != nil {
		return false
	}
	info, err := cons.Info(ctx)
	return err == nil && info.NumPending == 0 && info.NumAckPending == 0
}
