// Package worker runs the grants of one stage: it takes them from the
// stage's durable consumer (shared by every replica), runs each in a handler,
// keeps its lease alive while the handler works, stops it when the scheduler
// says so, and publishes the result before acknowledging the grant.
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

	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// Handler does the work of one grant. It reports progress (bytes moved so
// far, total size if known) through report, returns promptly when ctx is
// cancelled, and returns the outcome: a nil Failure for success.
type Handler func(ctx context.Context, g bus.Grant, report func(bytes, size int64)) bus.Result

// Pool runs one stage's grants with a fixed number of workers.
type Pool struct {
	Stage   dtr.Stage
	Workers int
	Handler Handler
	// Renew is how often a running grant's lease is renewed; default 10s,
	// kept below the consumer's AckWait.
	Renew time.Duration
	Log   *slog.Logger

	metrics *instruments
	warned  atomic.Int64 // when taking grants last failed with a warning (Unix ns)
	nc      *nats.Conn
	js      jetstream.JetStream
	mu      sync.Mutex
	running map[string]context.CancelFunc
	ackWait time.Duration // of the stage's consumer
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
		metrics: in, nc: nc, js: js, running: map[string]context.CancelFunc{}}, nil
}

// Run takes grants until ctx ends, then waits for the grants in hand.
func (p *Pool) Run(ctx context.Context) error {
	if err := bus.Await(ctx, p.js, p.Log, bus.Use{Stream: bus.StreamGrants, Consumer: string(p.Stage)},
		bus.Use{Stream: bus.StreamResults}); err != nil {
		return fmt.Errorf("%s workers: %w", p.Stage, err)
	}
	cons, err := p.js.Consumer(ctx, bus.StreamGrants, string(p.Stage))
	if err != nil {
		return fmt.Errorf("%s workers: %w", p.Stage, err)
	}
	p.ackWait = cons.CachedInfo().Config.AckWait
	stop, err := p.nc.Subscribe(bus.SubjectStopPrefix+">", p.onStop)
	if err != nil {
		return fmt.Errorf("%s workers: %w", p.Stage, err)
	}
	defer func() { _ = stop.Unsubscribe() }()

	// Each worker asks for one grant when it is free, so that no grant
	// waits in this process's buffer while its lease runs out.
	var wg sync.WaitGroup
	for range p.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				m, err := cons.Next(jetstream.FetchContext(fctx))
				cancel()
				if err != nil {
					if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
						// Every worker meets it while NATS fails over: say
						// it once in a while, not once per worker and try.
						if last := p.warned.Load(); time.Since(time.Unix(0, last)) > 10*time.Second && p.warned.CompareAndSwap(last, time.Now().UnixNano()) {
							p.Log.Warn("cannot take grants; trying again", "err", err)
						}
						time.Sleep(100 * time.Millisecond)
					}
					continue
				}
				p.run(ctx, m)
			}
		}()
	}
	wg.Wait()
	return nil
}

func (p *Pool) onStop(m *nats.Msg) {
	grant := strings.TrimPrefix(m.Subject, bus.SubjectStopPrefix)
	p.mu.Lock()
	cancel := p.running[grant]
	p.mu.Unlock()
	if cancel != nil {
		p.Log.Info("stopping grant on the scheduler's word", "grant", grant)
		cancel()
	}
}

// run handles one grant message.
func (p *Pool) run(ctx context.Context, jm jetstream.Msg) {
	m := bus.Msg(jm)
	var g bus.Grant
	ev, err := bus.DecodeData(ctx, m, bus.TypeGrant, &g)
	if err != nil {
		// Only the scheduler may publish grants; a message that is not one
		// is dropped with the reason, not retried.
		p.Log.Error("malformed grant dropped", "subject", m.Subject, "err", err)
		_ = jm.Term()
		return
	}
	waited := time.Since(ev.Time())
	redelivered := false
	if meta, err := jm.Metadata(); err == nil {
		redelivered = meta.NumDelivered > 1
	}
	// A grant is dropped when the scheduler has surely given it up and
	// granted the DTR again: one that nobody started within its lease, or a
	// redelivered one whose holder fell silent an AckWait ago, longer than
	// the lease. A redelivered grant with a longer lease is taken over.
	if l := g.Lease(); l > 0 && (!redelivered && waited > l || redelivered && l <= p.ackWait) {
		p.Log.Warn("expired grant dropped", "dtr", g.DTR.ID, "grant", g.Grant, "waited", waited)
		_ = jm.Term()
		return
	}
	p.mu.Lock()
	_, dup := p.running[g.Grant]
	p.mu.Unlock()
	if dup {
		return // redelivered while this process works on it: the renewals go on
	}
	sctx, span := bus.StartConsumer(ctx, m, "process")
	defer span.End()
	log := p.Log.With("dtr", g.DTR.ID, "grant", g.Grant, "state", g.State,
		"trace_id", trace.SpanContextFromContext(sctx).TraceID())

	wctx, cancel := context.WithCancel(sctx)
	defer cancel()
	p.mu.Lock()
	p.running[g.Grant] = cancel
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.running, g.Grant)
		p.mu.Unlock()
	}()

	// Keep the lease alive while the handler works. A grant that waited
	// for a free worker renews its lease as soon as it starts.
	var moved, size atomic.Int64
	done := make(chan struct{})
	renew := p.Renew
	if l := g.Lease(); l > 0 && l/3 < renew {
		renew = l / 3
	}
	if waited > renew {
		p.publish(sctx, bus.ProgressSubject(p.Stage), "", bus.TypeProgress, bus.Progress{DTR: g.DTR.ID, Grant: g.Grant})
	}
	go func() {
		t := time.NewTicker(renew)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = jm.InProgress()
				p.publish(sctx, bus.ProgressSubject(p.Stage), "", bus.TypeProgress,
					bus.Progress{DTR: g.DTR.ID, Grant: g.Grant, Bytes: moved.Load(), Size: size.Load()})
			}
		}
	}()
	start := time.Now()
	ended := p.metrics.started(ctx)
	res := p.Handler(wctx, g, func(b, s int64) {
		p.metrics.moved(ctx, b-moved.Swap(b))
		size.Store(s)
	})
	close(done)
	p.metrics.moved(ctx, res.Bytes-moved.Load())
	ended(res, time.Since(start))
	res.DTR, res.Grant, res.State = g.DTR.ID, g.Grant, g.State
	if res.Error != nil {
		span.SetStatus(codes.Error, fmt.Sprintf("%s: %s", res.Error.Kind, res.Error.Text))
		log.Info("grant failed", "kind", res.Error.Kind, "err", res.Error.Text, "took", time.Since(start))
	} else {
		log.Debug("grant done", "took", time.Since(start))
	}
	if ctx.Err() != nil {
		// Shutting down: leave the grant unacknowledged so that another
		// replica takes it.
		_ = jm.Nak()
		return
	}
	if err := p.publish(sctx, bus.ResultSubject(p.Stage), g.Grant+".result", bus.TypeResult, res); err != nil {
		log.Error("result not published; the grant will be redelivered", "err", err)
		_ = jm.NakWithDelay(time.Second)
		return
	}
	if err := jm.DoubleAck(ctx); err != nil {
		log.Warn("grant ack", "err", err)
	}
}

// publish sends a CloudEvent to JetStream and waits for it to be stored.
func (p *Pool) publish(ctx context.Context, subject, msgID, typ string, data any) error {
	ev, err := bus.NewEvent(typ, "sluice/"+string(p.Stage), "", data)
	if err != nil {
		return err
	}
	if msgID == "" {
		msgID = ev.ID()
	}
	ctx, span := bus.StartProducer(ctx, subject, msgID)
	defer span.End()
	m, err := bus.Encode(ctx, subject, msgID, ev)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = p.js.PublishMsg(pctx, m)
	return err
}
