// Package worker runs the grants of one stage: it takes grant messages
// from the stage's durable consumer (shared by every replica) when it has
// a free worker, acknowledges each before it starts anything in it, runs
// every grant in a handler, keeps the grants' leases alive with the
// scheduler while they wait or run, stops one when the scheduler says so,
// and publishes the results, several in one message when they are ready
// together. It shows itself as a NATS micro service and sends heartbeats
// with the grants it holds (presence.go). A process that stops gives back
// the grants it holds; one that dies leaves them to the scheduler's lease
// expiry.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/bus/tracing"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// Handler does the work of one grant. It reports progress (bytes moved so
// far, total size if known) through report, returns promptly when ctx is
// cancelled, and returns the outcome: a nil Failure for success.
type Handler func(ctx context.Context, g api.Grant, report func(bytes, size int64)) api.Result

// Pool runs one stage's grants with a fixed number of workers.
type Pool struct {
	Stage   dtr.Stage
	Workers int
	Handler Handler
	// Renew is how often the lease of a grant held is renewed; default
	// 10s, and at most a third of the grant's lease.
	Renew time.Duration
	// Heartbeat is how often the pool says it is alive and what it holds
	// (presence.go); default DefaultHeartbeat.
	Heartbeat time.Duration
	Log       *slog.Logger

	metrics *instruments
	warned  atomic.Int64 // when taking grants last failed with a warning (Unix ns)
	nc      *nats.Conn
	js      jetstream.JetStream
	mu      sync.Mutex
	held    map[string]*held // the grants taken and not yet answered
	results *resultSender
	// id is the process's micro service instance id; host and started
	// say where and since when it runs; shown says they are set (Show,
	// presence.go).
	id, host string
	started  time.Time
	shown    bool
	// grantSubject and resultSubject are the stage's, made once (they
	// name the spans of every grant).
	grantSubject, resultSubject string
	// term is the highest scheduler term seen in a grant or a stop
	// (api.Grant.Term): a deposed scheduler's are dropped (admitTerm).
	term atomic.Uint64
}

// admitTerm reports whether a grant or stop of scheduler term t may be
// acted on: one of an older term than a grant or stop seen before comes
// from a scheduler that has been deposed since, and is not. A newer term
// is remembered; 0 (not said) is always admitted.
func (p *Pool) admitTerm(t uint64) bool {
	if t == 0 {
		return true
	}
	for {
		seen := p.term.Load()
		if t < seen {
			return false
		}
		if t == seen || p.term.CompareAndSwap(seen, t) {
			return true
		}
	}
}

// held is a grant this process has taken: waiting for a worker or running.
type held struct {
	g api.Grant
	// issued is when the scheduler made the grant; renewed when a renewal
	// of its lease was last sent, and acked when the last renewal that
	// JetStream acknowledged was sent (issued until one is): the lease
	// surely holds until acked + lease - fenceMargin (fence).
	issued, renewed, acked time.Time
	renewing               bool  // a renewal is on its way
	lost                   error // the fence's refusal, for good once made
	// parent is the traceparent of the span that sent the grant.
	parent string
	cancel context.CancelCauseFunc // set while it runs
	// stopped says the scheduler stopped the grant before it ran.
	stopped bool
	moved   atomic.Int64
	size    atomic.Int64
}

// NewPool prepares a pool on nc; its metrics go to meter (nil: the global
// meter provider's).
func NewPool(nc *nats.Conn, stage dtr.Stage, workers int, h Handler, log *slog.Logger, meter metric.Meter) (*Pool, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	in, err := newInstruments(meter, stage)
	if err != nil {
		return nil, err
	}
	if workers <= 0 {
		workers = 1
	}
	return &Pool{Stage: stage, Workers: workers, Handler: h, Renew: 10 * time.Second, Log: log.With("stage", stage),
		metrics: in, nc: nc, js: js, held: map[string]*held{},
		grantSubject: api.GrantSubject(stage), resultSubject: api.ResultSubject(stage)}, nil
}

// Run takes grants until ctx ends, then gives back the grants in hand.
func (p *Pool) Run(ctx context.Context) error {
	if err := bus.Await(ctx, p.js, p.Log, bus.Use{Stream: bus.StreamGrants, Consumer: string(p.Stage)},
		bus.Use{Stream: bus.StreamResults}); err != nil {
		return fmt.Errorf("%s workers: %w", p.Stage, err)
	}
	cons, err := p.js.Consumer(ctx, bus.StreamGrants, string(p.Stage))
	if err != nil {
		return fmt.Errorf("%s workers: %w", p.Stage, err)
	}
	stop, err := p.nc.Subscribe(api.SubjectStopPrefix+">", p.onStop)
	if err != nil {
		return fmt.Errorf("%s workers: %w", p.Stage, err)
	}
	defer func() { _ = stop.Unsubscribe() }()
	p.mu.Lock()
	shown := p.shown
	p.mu.Unlock()
	if !shown {
		pr, err := Show(p.nc, p)
		if err != nil {
			return fmt.Errorf("%s workers: %w", p.Stage, err)
		}
		defer pr.Stop()
	}
	// The result sender and the lease renewals outlive the workers: the
	// grants given back as the pool stops are sent through them.
	// The source names the worker process, whose results they are (the
	// scheduler's history of each DTR says who ran each grant).
	p.results = newResultSender(p.nc, p.js, p.resultSubject, "sluice/"+string(p.Stage)+"/"+p.ID())
	sctx, stopSender := context.WithCancel(context.WithoutCancel(ctx))
	var background sync.WaitGroup
	background.Go(func() { p.results.run(sctx) })
	background.Go(func() { p.renewLeases(sctx) })
	background.Go(func() { p.heartbeats(sctx) })
	defer func() { stopSender(); background.Wait() }()

	queue := make(chan *held, maxMessagesPerPull*maxGrantsPerMessage)
	var idle atomic.Int64
	// taking counts the grants of the messages being acknowledged: they
	// are spoken for, as those in queue are.
	var taking atomic.Int64
	ready := make(chan struct{}, 1)
	signal := func() {
		select {
		case ready <- struct{}{}:
		default:
		}
	}
	var wg sync.WaitGroup
	for range p.Workers {
		wg.Go(func() {
			for {
				idle.Add(1)
				signal()
				var h *held
				select {
				case h = <-queue:
				case <-ctx.Done():
				}
				idle.Add(-1)
				if h == nil {
					return
				}
				if ctx.Err() != nil {
					p.giveBack(h)
					continue
				}
				p.run(ctx, h)
			}
		})
	}
	// Take messages only for the workers that are free with nothing
	// waiting for them: what is not taken stays in the stream for the
	// other replicas. A message's acknowledgement is awaited beside the
	// loop, which meanwhile asks for the next messages: a grant that
	// comes while another is being acknowledged is not held up by it.
	var takes sync.WaitGroup
	perMessage := float64(maxGrantsPerBurst)
	for ctx.Err() == nil {
		free := int(idle.Load()) - len(queue) - int(taking.Load())
		if free <= 0 {
			select {
			case <-ready:
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
			}
			continue
		}
		// As many messages as free workers would take, by the grants per
		// message seen so far (a message taken is run here whole).
		n := max(1, min(int(float64(free)/perMessage), maxMessagesPerPull))
		msgs, err := p.fetch(ctx, cons, n)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
				// Every pool meets it while NATS fails over: say it once in
				// a while, not on every try.
				if last := p.warned.Load(); time.Since(time.Unix(0, last)) > 10*time.Second && p.warned.CompareAndSwap(last, time.Now().UnixNano()) {
					p.Log.Warn("cannot take grants; trying again", "err", err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			continue
		}
		// The messages are acknowledged at once, together, and their
		// grants queued for the workers as each acknowledgement is
		// confirmed.
		grants := 0
		for _, m := range msgs {
			d, ok := p.decode(ctx, m)
			if !ok {
				continue
			}
			k := int64(len(d.grants))
			grants += len(d.grants)
			taking.Add(k)
			takes.Go(func() {
				for _, h := range p.take(ctx, m, d) {
					select {
					case queue <- h:
					case <-ctx.Done(): // the workers have left
						p.giveBack(h)
					}
				}
				taking.Add(-k)
				signal() // grants dropped free their workers
			})
		}
		perMessage = max(1, (perMessage+float64(grants)/float64(len(msgs)))/2)
	}
	takes.Wait()
	wg.Wait()
	// Grants taken as the workers stopped go back too.
	for {
		select {
		case h := <-queue:
			p.giveBack(h)
		default:
			return nil
		}
	}
}

// A pool takes at most maxMessagesPerPull messages at once, each of at
// most maxGrantsPerMessage grants.
const (
	maxMessagesPerPull  = 16
	maxGrantsPerMessage = 64
	// maxGrantsPerBurst is what a pool expects of a message before it has
	// seen one: about what the scheduler puts in each message of a burst.
	maxGrantsPerBurst = 8
)

// fetch takes up to n grant messages: the first to come within 5 s, and,
// if the consumer holds more, up to n-1 of those at once. The first is
// asked for alone: a pull that finds nothing costs a request and a "no
// messages" reply, two of the fifteen messages a DTR takes with ARC's
// ten slots, and the first message says how many more wait.
func (p *Pool) fetch(ctx context.Context, cons jetstream.Consumer, n int) ([]jetstream.Msg, error) {
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := cons.Next(jetstream.FetchContext(fctx))
	if err != nil {
		return nil, err
	}
	msgs := []jetstream.Msg{m}
	if n <= 1 {
		return msgs, nil
	}
	md, err := m.Metadata()
	if err != nil || md.NumPending == 0 {
		return msgs, nil
	}
	// Another replica may take them first: whatever comes, or none.
	batch, err := cons.FetchNoWait(int(min(uint64(n-1), md.NumPending)))
	if err != nil {
		return msgs, nil
	}
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	return msgs, nil
}

// decoded is a grant message's grants, the traceparents of the spans
// that sent them, and when they were issued.
type decoded struct {
	grants  []api.Grant
	parents []string
	issued  time.Time
}

// decode reads a grant message. One that is not a grant or a Grants event
// is dropped (terminated) with the reason: only the scheduler may publish
// grants, and such a message is not retried.
func (p *Pool) decode(ctx context.Context, jm jetstream.Msg) (decoded, bool) {
	m := bus.Msg(jm)
	grants, parents, issued, err := decodeGrants(ctx, m)
	if err != nil {
		p.Log.Error("malformed grant dropped", "subject", m.Subject, "err", err)
		_ = jm.Term()
		return decoded{}, false
	}
	return decoded{grants, parents, issued}, true
}

// take acknowledges a decoded grant message and returns the grants in it
// that are still valid. Nothing in a message runs before its
// acknowledgement is confirmed, so a message redelivered (its taker died
// or could not acknowledge it) was run by nobody before.
func (p *Pool) take(ctx context.Context, jm jetstream.Msg, d decoded) []*held {
	grants, parents, issued := d.grants, d.parents, d.issued
	if err := ackConfirmed(ctx, jm); err != nil {
		p.Log.Warn("grant message not acknowledged; it is left to be redelivered", "err", err)
		return nil
	}
	now := time.Now()
	// The lease started when the scheduler made the grant, by its clock;
	// a clock here that is behind it counts from now instead (the fence
	// margin covers the rest of a difference between clocks).
	since := issued
	if since.After(now) {
		since = now
	}
	var out []*held
	for i, g := range grants {
		if !p.admitTerm(g.Term) {
			p.mu.Lock()
			_, running := p.held[g.ID]
			p.mu.Unlock()
			if running {
				continue // a copy of a grant this process runs: it runs once
			}
			// Given back unrun: the scheduler that leads now knows the
			// grant (its records were journaled before its term began)
			// and queues the DTR again at once, rather than when the
			// lease runs out.
			p.Log.Warn("grant of a deposed scheduler given back unrun", "dtr", g.DTR.ID, "grant", g.ID, "term", g.Term, "current_term", p.term.Load())
			go p.returnUnrun(g, parents[i])
			continue
		}
		h := &held{g: g, issued: since, renewed: since, acked: since, parent: parents[i]}
		// A grant that cannot be started within its lease has surely been
		// (or is about to be) given up by the scheduler.
		if err := h.fence(now); err != nil {
			p.Log.Warn("expired grant dropped", "dtr", g.DTR.ID, "grant", g.ID, "waited", now.Sub(issued))
			continue
		}
		p.mu.Lock()
		_, dup := p.held[g.ID]
		if !dup {
			p.held[g.ID] = h
		}
		p.mu.Unlock()
		if dup {
			continue // sent twice: it runs once
		}
		out = append(out, h)
	}
	return out
}

// ackConfirmed acknowledges a message and waits for the server to confirm
// it, asking again while NATS fails over (an acknowledgement sent again is
// harmless): a grant whose acknowledgement is not confirmed is not run,
// and waits for its lease to run out.
func ackConfirmed(ctx context.Context, jm jetstream.Msg) error {
	var err error
	for try := range 5 {
		if try > 0 {
			select {
			case <-ctx.Done():
				return err
			case <-time.After(time.Duration(try) * 500 * time.Millisecond):
			}
		}
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = jm.DoubleAck(actx)
		cancel()
		if err == nil || errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			return nil
		}
	}
	return err
}

// decodeGrants reads the grants of a message: one (org.sluice.grant.v1,
// its trace in the message's traceparent) or several (org.sluice.grants.v1,
// each with its own), and when they were issued.
func decodeGrants(ctx context.Context, m *nats.Msg) ([]api.Grant, []string, time.Time, error) {
	ev, err := codec.Decode(ctx, m)
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	switch ev.Type() {
	case api.TypeGrant:
		var g api.Grant
		if err := codec.DecodeJSON(ev.Data(), &g); err != nil {
			return nil, nil, time.Time{}, fmt.Errorf("%s data: %w", api.TypeGrant, err)
		}
		return withDTRs([]api.Grant{g}), []string{m.Header.Get("traceparent")}, ev.Time(), nil
	case api.TypeGrants:
		var gs api.Grants
		if err := codec.DecodeJSON(ev.Data(), &gs); err != nil {
			return nil, nil, time.Time{}, fmt.Errorf("%s data: %w", api.TypeGrants, err)
		}
		if len(gs.Grants) > maxGrantsPerMessage {
			return nil, nil, time.Time{}, fmt.Errorf("%d grants in one message, more than %d", len(gs.Grants), maxGrantsPerMessage)
		}
		parents := make([]string, len(gs.Grants))
		for i, g := range gs.Grants {
			parents[i] = g.TraceParent
		}
		return withDTRs(gs.Grants), parents, ev.Time(), nil
	}
	return nil, nil, time.Time{}, fmt.Errorf("event type %q, want %q or %q", ev.Type(), api.TypeGrant, api.TypeGrants)
}

// withDTRs gives each grant that came without a DTR an empty one, so that
// a handler may read its grant's DTR.
func withDTRs(gs []api.Grant) []api.Grant {
	for i := range gs {
		if gs[i].DTR == nil {
			gs[i].DTR = new(dtr.DTR)
		}
	}
	return gs
}

func (p *Pool) onStop(m *nats.Msg) {
	grant := strings.TrimPrefix(m.Subject, api.SubjectStopPrefix)
	var stop api.Stop
	if _, err := codec.DecodeData(context.Background(), m, api.TypeStop, &stop); err == nil && !p.admitTerm(stop.Term) {
		p.Log.Warn("stop from a deposed scheduler ignored", "grant", grant, "term", stop.Term, "current_term", p.term.Load())
		return
	}
	var cancel context.CancelCauseFunc
	p.mu.Lock()
	if h := p.held[grant]; h != nil {
		cancel = h.cancel
		h.stopped = cancel == nil // still waiting for a worker: stopped as it starts
	}
	p.mu.Unlock()
	if cancel != nil {
		p.Log.Info("stopping grant on the scheduler's word", "grant", grant)
		cancel(errStopped)
	}
}

// run carries out one grant held.
func (p *Pool) run(ctx context.Context, h *held) {
	g := h.g
	defer func() {
		p.mu.Lock()
		delete(p.held, g.ID)
		p.mu.Unlock()
	}()
	// A grant that waited here past its fence may no longer be the DTR's.
	p.mu.Lock()
	fenced := h.fence(time.Now())
	p.mu.Unlock()
	if fenced != nil {
		p.Log.Warn("expired grant dropped", "dtr", g.DTR.ID, "grant", g.ID, "waited", time.Since(h.issued), "why", fenced)
		return
	}
	sctx, span := tracing.StartConsumerOf(ctx, h.parent, p.grantSubject, g.ID, "process")
	defer span.End()
	tracing.SetDTR(span, g.DTR, p.Stage)
	// The grant's logger, made only when something is logged (With costs
	// more than the rest of a 1 KiB file's grant).
	log := func() *slog.Logger {
		return p.Log.With("dtr", g.DTR.ID, "grant", g.ID, "state", g.State,
			"trace_id", trace.SpanContextFromContext(sctx).TraceID())
	}

	// Every step on storage asks the fence first: once the lease may
	// have run out at the scheduler, nothing more is done for the grant.
	wctx, cancel := context.WithCancelCause(transfer.WithFence(sctx, func() error {
		p.mu.Lock()
		defer p.mu.Unlock()
		return h.fence(time.Now())
	}))
	defer cancel(nil)
	p.mu.Lock()
	h.cancel = cancel
	if h.stopped {
		cancel(errStopped)
	}
	p.mu.Unlock()
	// renewLeases keeps the lease alive, as it did while the grant waited.
	start := time.Now()
	p.metrics.started()
	res := p.Handler(p.withStorageTokens(wctx, g, start), g, func(b, s int64) {
		p.metrics.moved(ctx, b-h.moved.Swap(b))
		h.size.Store(s)
	})
	p.metrics.moved(ctx, res.Bytes-h.moved.Load())
	p.metrics.ended(ctx, res, time.Since(start))
	res.DTR, res.Grant, res.State = g.DTR.ID, g.ID, g.State
	if ctx.Err() != nil && res.Error != nil {
		// Stopped half way: the grant goes back to the scheduler, to be
		// granted again to another replica without spending an attempt.
		// (One that was done as the pool stopped reports its result.)
		p.giveBack(h)
		return
	}
	if cause := context.Cause(wctx); errors.Is(cause, transfer.ErrLeaseLost) && res.Error != nil {
		// Stopped by the fence, whatever the handler made of it: the
		// scheduler takes the result only if the grant is still current
		// (its lease clock stopped while it could not hear from here),
		// and then cleans up before a retry.
		res.Error = &dtr.Failure{Kind: dtr.ErrInternalProcess, Text: cause.Error(), Location: res.Error.Location}
	}
	tracing.SetResult(span, res.Bytes, res.Error)
	if res.Error != nil {
		// A library's error may quote a URL with its credentials.
		span.SetStatus(codes.Error, dtr.RedactText(fmt.Sprintf("%s: %s", res.Error.Kind, res.Error.Text)))
		log().Info("grant failed", "kind", res.Error.Kind, "err", res.Error.Text, "took", time.Since(start))
	} else if p.Log.Enabled(ctx, slog.LevelDebug) {
		log().Debug("grant done", "took", time.Since(start))
	}
	if err := p.sendResult(sctx, g.DTR, res); err != nil {
		// The scheduler grants the DTR again when the lease runs out.
		log().Error("result not published; the grant's lease will run out", "err", err)
	}
}

// giveBack tells the scheduler that a grant held will not be finished
// here.
func (p *Pool) giveBack(h *held) {
	defer func() {
		p.mu.Lock()
		delete(p.held, h.g.ID)
		p.mu.Unlock()
	}()
	p.sendBack(h.g, h.parent, h.moved.Load(), "given back: the worker is stopping")
}

// returnUnrun gives back a grant that was never held here.
func (p *Pool) returnUnrun(g api.Grant, parent string) {
	p.sendBack(g, parent, 0, "given back unrun: the scheduler that granted it was deposed since")
}

// sendBack sends a grant's Returned result.
func (p *Pool) sendBack(g api.Grant, parent string, moved int64, why string) {
	h := &held{g: g, parent: parent}
	res := api.Result{DTR: h.g.DTR.ID, Grant: h.g.ID, State: h.g.State, Returned: true, Bytes: moved}
	ctx, span := tracing.StartConsumerOf(context.Background(), h.parent, p.grantSubject, h.g.ID, "process")
	defer span.End()
	tracing.SetDTR(span, h.g.DTR, p.Stage)
	tracing.SetResult(span, res.Bytes, nil)
	span.SetStatus(codes.Error, why)
	if err := p.sendResult(ctx, h.g.DTR, res); err != nil {
		p.Log.Warn("grant not given back; its lease will run out", "dtr", h.g.DTR.ID, "grant", h.g.ID, "err", err)
		return
	}
	p.Log.Info("grant given back", "dtr", h.g.DTR.ID, "grant", h.g.ID)
}

// renewEvery is how often a grant's lease is renewed.
func (p *Pool) renewEvery(g api.Grant) time.Duration {
	renew := p.Renew
	if l := g.Lease(); l > 0 && l/3 < renew {
		renew = l / 3
	}
	return renew
}

// renewLeases renews the lease of every grant held, waiting or running,
// once per renewEvery, and stops a running grant whose fence has passed,
// until ctx ends.
func (p *Pool) renewLeases(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	var renewals sync.WaitGroup
	defer renewals.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			var due []*held
			var lost []context.CancelCauseFunc
			var why []error
			p.mu.Lock()
			for _, h := range p.held {
				if err := h.fence(now); err != nil {
					// Not renewed any more: a renewal the scheduler heard
					// after it gave the grant up would move nothing there.
					if h.cancel != nil {
						lost, why = append(lost, h.cancel), append(why, err)
					}
					continue
				}
				if !h.renewing && now.Sub(h.renewed) >= p.renewEvery(h.g) {
					h.renewing, h.renewed = true, now
					due = append(due, h)
				}
			}
			p.mu.Unlock()
			for i, cancel := range lost {
				cancel(why[i])
			}
			// Each renewal on its own: one that waits for an answer
			// (NATS away) holds up no other.
			for _, h := range due {
				renewals.Go(func() { p.renew(ctx, h, now) })
			}
		}
	}
}

// renew sends a grant's progress, which renews its lease, and moves the
// grant's fence on when JetStream acknowledges it: the scheduler heard of
// the grant no earlier than sent. A renewal still waiting for its answer
// when ctx ends (the pool has stopped) is given up.
func (p *Pool) renew(ctx context.Context, h *held, sent time.Time) {
	ctx = tracing.Context(ctx, h.parent)
	err := p.publish(ctx, api.ProgressSubject(p.Stage), "", api.TypeProgress, h.g.DTR,
		api.Progress{DTR: h.g.DTR.ID, Grant: h.g.ID, Bytes: h.moved.Load(), Size: h.size.Load(), Worker: p.ID()})
	p.mu.Lock()
	defer p.mu.Unlock()
	h.renewing = false
	if err == nil && sent.After(h.acked) {
		h.acked = sent
	}
}

// errStopped is the cause of a grant stopped on the scheduler's word.
var errStopped = errors.New("stopped by the scheduler")

// fenceMargin is how long before its lease would run out at the
// scheduler a worker stops acting for a grant: room for the clocks of the
// two to differ and for the last step on storage to finish.
func fenceMargin(lease time.Duration) time.Duration {
	return min(lease/4, 30*time.Second)
}

// fence returns nil while the grant's lease surely holds at the
// scheduler, and an error wrapping transfer.ErrLeaseLost once it may not:
// when the last renewal that JetStream acknowledged was sent longer ago
// than the lease less fenceMargin. The scheduler takes a lease to run from
// when it hears of a renewal, which is no earlier than it was sent, so a
// worker stops before the scheduler can grant the DTR again. Once it has
// refused, it refuses for good. Call it with p.mu held.
func (h *held) fence(now time.Time) error {
	l := h.g.Lease()
	if h.lost != nil || l <= 0 {
		return h.lost
	}
	if since := now.Sub(h.acked); since >= l-fenceMargin(l) {
		h.lost = fmt.Errorf("%w: no renewal of its %s lease acknowledged for %s", transfer.ErrLeaseLost, l, since.Round(time.Millisecond))
	}
	return h.lost
}

// sendResult stores the result of a grant of d, with others of this
// pool's that are ready at the same time, in one Results event. Its span
// is the result's sender in the DTR's trace.
func (p *Pool) sendResult(ctx context.Context, d *dtr.DTR, res api.Result) error {
	ctx, span := tracing.StartProducer(ctx, p.resultSubject, tracing.ItemID(res.Grant, ".result"))
	defer span.End()
	tracing.SetDTR(span, d, p.Stage)
	tracing.SetResult(span, res.Bytes, res.Error)
	res.TraceParent = tracing.TraceParent(ctx)
	// Sent even when the pool is stopping: the sender outlives the workers
	// and answers within its publish timeout.
	return p.results.send(context.WithoutCancel(ctx), res)
}

// publish sends a CloudEvent about d to JetStream and waits for it to be
// stored.
func (p *Pool) publish(ctx context.Context, subject, msgID, typ string, d *dtr.DTR, data any) error {
	ev, err := codec.NewEvent(typ, "sluice/"+string(p.Stage), "", data)
	if err != nil {
		return err
	}
	if msgID == "" {
		msgID = ev.ID()
	}
	ctx, span := tracing.StartProducer(ctx, subject, msgID)
	defer span.End()
	tracing.SetDTR(span, d, p.Stage)
	m, err := codec.Encode(ctx, subject, msgID, ev)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = p.js.PublishMsg(pctx, m)
	return err
}
