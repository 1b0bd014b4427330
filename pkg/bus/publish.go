package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// batchWindow bounds the acknowledgements one Batch leaves outstanding:
// nats.go refuses asynchronous publishes once 4,000 are pending on a
// connection (ErrTooManyStalledMsgs), which a slow server reaches quickly
// when several batches share one connection.
const batchWindow = 256

// Batch publishes messages to JetStream without waiting for each one, then
// waits for all of their acknowledgements at once. At most batchWindow of
// its messages are unacknowledged at any time: Add waits for the oldest
// before it publishes more.
type Batch struct {
	// Refused, if set, hears each message the server refuses, by its
	// index among those added since the last Wait, and decides whether
	// the refusal is an error (a create of a key that exists, say, may
	// not be).
	Refused func(i int, err error) error
	// Last is the highest stream sequence the server has acknowledged
	// (useful when every message goes to one stream).
	Last uint64
	// Full, if set, makes a message that JetStream refuses for want of
	// space (StoreFull) be published again, after a pause growing from
	// MinBackoff to MaxBackoff, until it is stored or the context ends;
	// each such refusal is recorded in Full. Unset, the refusal is an
	// error like any other.
	Full *Space

	ctx     context.Context
	js      jetstream.JetStream
	futures []jetstream.PubAckFuture
	acked   int // futures[:acked] are known to be stored
	err     error
}

// NewBatch starts an empty batch; ctx bounds the waits inside Add.
func NewBatch(ctx context.Context, js jetstream.JetStream) *Batch { return &Batch{ctx: ctx, js: js} }

// Add publishes m; its acknowledgement is awaited by Wait.
func (b *Batch) Add(m *nats.Msg) {
	if b.err != nil {
		return
	}
	for len(b.futures)-b.acked >= batchWindow {
		if b.err = b.awaitAt(b.ctx, b.acked); b.err != nil {
			return
		}
		b.acked++
	}
	for {
		f, err := b.js.PublishMsgAsync(m)
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			// Other publishers on this connection fill the client's
			// window: wait for it to drain, then try again.
			select {
			case <-b.js.PublishAsyncComplete():
			case <-time.After(100 * time.Millisecond):
			case <-b.ctx.Done():
				b.err = fmt.Errorf("publish to %s: %w", m.Subject, b.ctx.Err())
				return
			}
			continue
		}
		if err != nil {
			b.err = fmt.Errorf("publish to %s: %w", m.Subject, err)
			return
		}
		b.futures = append(b.futures, f)
		return
	}
}

// Len returns the number of messages published so far.
func (b *Batch) Len() int { return len(b.futures) }

// Wait returns once every message is stored, or the first error.
func (b *Batch) Wait(ctx context.Context) error {
	defer func() { b.futures, b.acked = b.futures[:0], 0 }()
	if b.err != nil {
		return b.err
	}
	for i := b.acked; i < len(b.futures); i++ {
		if err := b.awaitAt(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

// awaitAt waits for the i-th message, handing a refusal to Refused.
func (b *Batch) awaitAt(ctx context.Context, i int) error {
	err := b.await(ctx, b.futures[i])
	var api *jetstream.APIError
	if err != nil && b.Refused != nil && errors.As(err, &api) {
		return b.Refused(i, err)
	}
	return err
}

// Acknowledgements that do not come: a JetStream server that fails over
// may lose an asynchronous publish without an answer. The message is then
// published again, synchronously (a message with a Nats-Msg-Id is stored
// once however often it is sent; a key-value put sets the same value), up
// to ackTries times before Wait gives up with an error.
var ackTimeout = 5 * time.Second // a variable for tests

const ackTries = 6

// retryPause is the pause before the second try, doubled at each next one
// up to 2 s: 0.25+0.5+1+2+2 s in all.
var retryPause = 250 * time.Millisecond // a variable for tests

func (b *Batch) await(ctx context.Context, f jetstream.PubAckFuture) error {
	subject := f.Msg().Subject
	var last error
	select {
	case ack := <-f.Ok():
		b.Last = max(b.Last, ack.Sequence)
		return nil
	case err := <-f.Err():
		last = err
	case <-time.After(ackTimeout):
		last = fmt.Errorf("no acknowledgement within %s", ackTimeout)
	case <-ctx.Done():
		return fmt.Errorf("waiting for publish acknowledgements: %w", ctx.Err())
	}
	for try := 2; try <= ackTries; try++ {
		if b.Full != nil && StoreFull(last) {
			return b.untilStored(ctx, f.Msg(), last)
		}
		var api *jetstream.APIError
		if errors.As(last, &api) {
			// The server refused it: sending it again changes nothing.
			return fmt.Errorf("publish to %s: %w", subject, last)
		}
		slog.Warn("publishing again", "subject", subject, "try", try, "err", last)
		// A stream electing a leader answers "no response" at once:
		// the tries are spread over a few seconds, as an election takes.
		select {
		case <-time.After(min(retryPause<<(try-2), 2*time.Second)):
		case <-ctx.Done():
			return fmt.Errorf("waiting for publish acknowledgements: %w", ctx.Err())
		}
		pctx, cancel := context.WithTimeout(ctx, ackTimeout)
		var ack *jetstream.PubAck
		ack, last = b.js.PublishMsg(pctx, f.Msg())
		cancel()
		if last == nil {
			b.Last = max(b.Last, ack.Sequence)
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for publish acknowledgements: %w", ctx.Err())
		}
	}
	return fmt.Errorf("publish to %s: no acknowledgement after %d tries: %w", subject, ackTries, last)
}

const tracerName = "github.com/sluice-dtr/sluice"

// StartProducer starts a producer span for a message to subject whose
// message id (Nats-Msg-Id) is msgID, following the OpenTelemetry messaging
// conventions. Encode the message with the returned context, so that its
// traceparent names this span.
func StartProducer(ctx context.Context, subject, msgID string) (context.Context, trace.Span) {
	return startSpan(ctx, "send ", trace.SpanKindProducer, semconv.MessagingOperationTypeSend, subject, msgID)
}

// StartConsumer starts a consumer span for a received message, as a child
// of the span whose context the message's traceparent header carries.
func StartConsumer(ctx context.Context, m *nats.Msg, operation string) (context.Context, trace.Span) {
	msgID := ""
	if m.Header != nil {
		ctx = Extract(ctx, m.Header)
		msgID = headerCarrier(m.Header).Get(nats.MsgIdHdr)
	}
	return startSpan(ctx, operation+" ", trace.SpanKindConsumer, semconv.MessagingOperationTypeProcess, m.Subject, msgID)
}

// StartConsumerOf starts a consumer span for one item of a message that
// carries several (a Results event), as a child of the span named by the
// item's own traceparent.
func StartConsumerOf(ctx context.Context, traceparent, subject, msgID, operation string) (context.Context, trace.Span) {
	return startSpan(Context(ctx, traceparent), operation+" ", trace.SpanKindConsumer, semconv.MessagingOperationTypeProcess, subject, msgID)
}

// skipUnsampled is set by SkipUnsampledSpans.
var skipUnsampled atomic.Bool

// SkipUnsampledSpans says whether the tracer provider's sampler drops every
// span whose parent is not sampled, as the OpenTelemetry SDK's parent-based
// samplers do: then such a span is not started at all (starting one, to
// drop it, was a tenth of a worker's CPU).
func SkipUnsampledSpans(skip bool) { skipUnsampled.Store(skip) }

// unsampled stands for a span not started: it records nothing and carries
// its parent's context.
type unsampled struct {
	noop.Span
	sc trace.SpanContext
}

func (u unsampled) SpanContext() trace.SpanContext { return u.sc }

// startSpan starts the span "<prefix><subject>". Its messaging attributes
// are set only on a span that is recorded (they are not there for a
// sampler to see): with tracing off, spans cost next to nothing.
func startSpan(ctx context.Context, prefix string, kind trace.SpanKind, op attribute.KeyValue, subject, msgID string) (context.Context, trace.Span) {
	if skipUnsampled.Load() {
		if parent := trace.SpanContextFromContext(ctx); parent.IsValid() && !parent.IsSampled() {
			// Its sampler would drop it: the parent's context goes on
			// unchanged, and so does the trace id the logs name.
			return ctx, unsampled{sc: parent}
		}
	}
	ctx, span := otel.Tracer(tracerName).Start(ctx, prefix+subject, trace.WithSpanKind(kind))
	if span.IsRecording() {
		span.SetAttributes(messaging(op, subject, msgID)...)
	}
	return ctx, span
}

// messaging returns the messaging attributes of a span; a message without
// an id has no messaging.message.id.
func messaging(op attribute.KeyValue, subject, msgID string) []attribute.KeyValue {
	attrs := []attribute.KeyValue{semconv.MessagingSystemKey.String("nats"), op, semconv.MessagingDestinationName(subject)}
	if msgID != "" {
		attrs = append(attrs, semconv.MessagingMessageID(msgID))
	}
	return attrs
}

// Context returns ctx carrying the span context of a W3C traceparent value.
func Context(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, &traceParentCarrier{value: traceparent})
}

// TraceParent returns the W3C traceparent value of ctx's span.
func TraceParent(ctx context.Context) string {
	var c traceParentCarrier
	propagation.TraceContext{}.Inject(ctx, &c)
	return c.value
}

// traceParentCarrier carries a lone traceparent value, without the map a
// header costs (these two run for every DTR of a batched event).
type traceParentCarrier struct{ value string }

func (c *traceParentCarrier) Get(key string) string {
	if key == "traceparent" {
		return c.value
	}
	return ""
}

func (c *traceParentCarrier) Set(key, value string) {
	if key == "traceparent" {
		c.value = value
	}
}

func (c *traceParentCarrier) Keys() []string { return []string{"traceparent"} }

// Msg returns a received JetStream message as a *nats.Msg for Decode.
func Msg(m jetstream.Msg) *nats.Msg {
	return &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}
}

// Each hands every message of a consumer to f, one at a time, until ctx
// ends. At most max messages wait in the client's buffer.
func Each(ctx context.Context, cons jetstream.Consumer, max int, f func(jetstream.Msg)) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(max))
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	go func() {
		<-ctx.Done()
		it.Stop()
	}()
	for {
		m, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			if ctx.Err() != nil {
				return nil
			}
			slog.Warn("consume", "consumer", cons.CachedInfo().Name, "err", err)
			continue
		}
		f(m)
	}
}

// EachBatch hands the messages of a consumer to f in batches, until ctx
// ends: a batch is the messages that have come in since f last returned,
// at most max, and at least one.
func EachBatch(ctx context.Context, cons jetstream.Consumer, max int, f func([]jetstream.Msg)) error {
	in := make(chan jetstream.Msg, max)
	errc := make(chan error, 1)
	go func() {
		defer close(in) // Each has returned: nothing more is sent
		errc <- Each(ctx, cons, max, func(m jetstream.Msg) {
			select {
			case in <- m:
			case <-ctx.Done():
			}
		})
	}()
	batch := make([]jetstream.Msg, 0, max)
	for m := range in {
		batch = append(batch[:0], m)
	drain:
		for len(batch) < max {
			select {
			case m, ok := <-in:
				if !ok {
					break drain
				}
				batch = append(batch, m)
			default:
				break drain
			}
		}
		f(batch)
	}
	return <-errc
}
