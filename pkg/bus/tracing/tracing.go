// Package tracing carries OpenTelemetry traces across the bus: the W3C
// traceparent of a NATS message's headers or of one item of a batched
// event, and the producer and consumer spans of the messaging conventions.
package tracing

import (
	"context"
	"reflect"
	"strings"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// headerCarrier lets OpenTelemetry read and write the traceparent header of
// a NATS message. nats.Header is case-sensitive, so keys are matched here
// without regard to case.
type headerCarrier nats.Header

func (c headerCarrier) Get(key string) string {
	for k, v := range c {
		if strings.EqualFold(k, key) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}
func (c headerCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }
func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Propagator is how Sluice carries a trace in message headers (W3C trace
// context and baggage); the composition root makes it OpenTelemetry's
// global one too.
func Propagator() propagation.TextMapPropagator { return propagator }

// Inject writes ctx's span context into h as a W3C traceparent header.
func Inject(ctx context.Context, h nats.Header) { propagator.Inject(ctx, headerCarrier(h)) }

// Extract returns ctx carrying the span context found in h, if any.
func Extract(ctx context.Context, h nats.Header) context.Context {
	return propagator.Extract(ctx, headerCarrier(h))
}

// ValidTraceParent reports whether s is a W3C traceparent value that names
// a trace and a span (neither all zeros).
func ValidTraceParent(s string) bool {
	if s == "" {
		return false
	}
	ctx := Extract(context.Background(), nats.Header{"traceparent": []string{s}})
	return trace.SpanContextFromContext(ctx).IsValid()
}

const tracerName = "github.com/sluice-dtr/sluice"

// StartProducer starts a producer span for a message to subject whose
// message id (Nats-Msg-Id) is msgID, following the OpenTelemetry messaging
// conventions. Encode the message with the returned context, so that its
// traceparent names this span.
func StartProducer(ctx context.Context, subject, msgID string) (context.Context, trace.Span) {
	return startSpan(ctx, "send", trace.SpanKindProducer, semconv.MessagingOperationTypeSend, subject, msgID)
}

// StartConsumer starts a consumer span for a received message, as a child
// of the span whose context the message's traceparent header carries.
func StartConsumer(ctx context.Context, m *nats.Msg, operation string) (context.Context, trace.Span) {
	msgID := ""
	if m.Header != nil {
		ctx = Extract(ctx, m.Header)
		msgID = headerCarrier(m.Header).Get(nats.MsgIdHdr)
	}
	return startSpan(ctx, operation, trace.SpanKindConsumer, semconv.MessagingOperationTypeProcess, m.Subject, msgID)
}

// StartConsumerOf starts a consumer span for one item of a message that
// carries several (a Results event), as a child of the span named by the
// item's own traceparent.
func StartConsumerOf(ctx context.Context, traceparent, subject, msgID, operation string) (context.Context, trace.Span) {
	return startSpan(Context(ctx, traceparent), operation, trace.SpanKindConsumer, semconv.MessagingOperationTypeProcess, subject, msgID)
}

// ItemID is the message id of one item of a message (a grant's result, a
// final DTR) as its span names it: id and suffix, made only when a tracer
// provider is installed (otherwise no span records it, and it is "").
func ItemID(id, suffix string) string {
	if !Installed() {
		return ""
	}
	return id + suffix
}

// Installed says whether a tracer provider is installed, whose spans may
// be recorded: without one, a span's start and end cost next to nothing,
// and what only a recorded span would hold need not be made.
func Installed() bool { return installedTracer() != nil }

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

// notStarted is the span that stands for one not started in ctx: the
// span ctx holds when it records nothing (the remote parent of a
// traceparent, or none), which costs no allocation; else one that
// carries its context.
func notStarted(ctx context.Context) trace.Span {
	if span := trace.SpanFromContext(ctx); !span.IsRecording() {
		return span
	}
	return unsampled{sc: trace.SpanContextFromContext(ctx)}
}

// startSpan starts the span "<operation> <subject>". Its messaging attributes
// are set only on a span that is recorded (they are not there for a
// sampler to see): with tracing off, spans cost next to nothing.
func startSpan(ctx context.Context, operation string, kind trace.SpanKind, op attribute.KeyValue, subject, msgID string) (context.Context, trace.Span) {
	if skipUnsampled.Load() {
		if parent := trace.SpanContextFromContext(ctx); parent.IsValid() && !parent.IsSampled() {
			// Its sampler would drop it: the parent's context goes on
			// unchanged, and so does the trace id the logs name.
			return ctx, notStarted(ctx)
		}
	}
	tr := installedTracer()
	if tr == nil {
		// No tracer provider: the span would record nothing and carry
		// its parent's context, as this one does without allocating.
		return ctx, notStarted(ctx)
	}
	ctx, span := tr.Start(ctx, operation+" "+subject, spanKinds[kind])
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

// TraceID returns the trace id, 32 hex digits, of a W3C traceparent
// value; "" if it names none.
func TraceID(traceparent string) string {
	sc := trace.SpanContextFromContext(Context(context.Background(), traceparent))
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
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

// spanKinds are the span start options of each kind, made once.
var spanKinds = map[trace.SpanKind]trace.SpanStartOption{
	trace.SpanKindProducer: trace.WithSpanKind(trace.SpanKindProducer),
	trace.SpanKindConsumer: trace.WithSpanKind(trace.SpanKindConsumer),
}

// defaultProvider is OpenTelemetry's global tracer provider before one is
// installed: until then (and while it does not delegate to one installed
// since) its spans record nothing.
var defaultProvider = otel.GetTracerProvider()

// cachedTracer is the tracer of the provider installed last, found once:
// asking the global provider for it at every span costs a lock and a map
// lookup.
type cachedTracer struct {
	provider trace.TracerProvider
	tracer   trace.Tracer
}

var (
	lastTracer atomic.Pointer[cachedTracer]
	// delegates says the default provider has been given a provider to
	// pass its spans to (OpenTelemetry does so once, for good); unchecked
	// counts the spans started since that was last looked at.
	delegates atomic.Bool
	unchecked atomic.Uint32
)

// installedTracer returns Sluice's tracer of the tracer provider
// installed, or nil when there is none (or a no-op one): then a span
// would record nothing.
func installedTracer() trace.Tracer {
	tp := otel.GetTracerProvider()
	if _, ok := tp.(noop.TracerProvider); ok {
		return nil
	}
	if tp == defaultProvider && !defaultDelegates() {
		return nil
	}
	if c := lastTracer.Load(); c != nil && sameProvider(c.provider, tp) {
		return c.tracer
	}
	tr := tp.Tracer(tracerName)
	lastTracer.Store(&cachedTracer{provider: tp, tracer: tr})
	return tr
}

// defaultDelegates says whether the default provider passes its spans on
// to a provider installed (and since replaced by the default again, as
// tests do): a span it starts then has real ids. It looks at the first
// span and then once every checkDelegateEvery; once it does, it does for
// good.
func defaultDelegates() bool {
	if delegates.Load() {
		return true
	}
	if unchecked.Add(1)%checkDelegateEvery != 1 {
		return false
	}
	_, span := defaultProvider.Tracer(tracerName).Start(context.Background(), "probe")
	if span.SpanContext().IsValid() {
		delegates.Store(true)
		return true
	}
	return false
}

// checkDelegateEvery is how many spans defaultDelegates lets pass between
// two looks.
const checkDelegateEvery = 1024

// sameProvider compares two providers without panicking on a provider
// type that cannot be compared.
func sameProvider(a, b trace.TracerProvider) bool {
	ta := reflect.TypeOf(a)
	return ta == reflect.TypeOf(b) && ta.Comparable() && a == b
}
