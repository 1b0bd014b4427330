package tracing

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func TestTraceParent(t *testing.T) {
	t.Run("a traceparent carried by a context comes back the same", func(t *testing.T) {
		if got := TraceParent(Context(context.Background(), tp)); got != tp {
			t.Fatalf("TraceParent gives %q, want %q", got, tp)
		}
	})
	t.Run("a context without a span has none", func(t *testing.T) {
		if got := TraceParent(Context(context.Background(), "")); got != "" {
			t.Fatalf("TraceParent gives %q, want none", got)
		}
	})
	t.Run("a header written by Inject is read by Extract, its name in any case", func(t *testing.T) {
		h := nats.Header{}
		Inject(Context(context.Background(), tp), h)
		moved := nats.Header{"TraceParent": h.Values("traceparent")}
		if got := TraceParent(Extract(context.Background(), moved)); got != tp {
			t.Fatalf("read back %q from %v, want %q", got, moved, tp)
		}
	})
	t.Run("only a well-formed traceparent is valid", func(t *testing.T) {
		for s, want := range map[string]bool{tp: true, "": false, "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01": false, "garbage": false} {
			if got := ValidTraceParent(s); got != want {
				t.Errorf("ValidTraceParent(%q) = %v, want %v", s, got, want)
			}
		}
	})
}

func TestTheTraceIDOfATraceParentIsItsSecondField(t *testing.T) {
	for in, want := range map[string]string{tp: "0af7651916cd43dd8448eb211c80319c", "": "", "garbage": "",
		"00-00000000000000000000000000000000-b7ad6b7169203331-01": ""} {
		if got := TraceID(in); got != want {
			t.Errorf("TraceID(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestSpansWithoutATracerProviderCostNothingAndThoseOfOneInstalledAreRecorded
// runs in order: first with no provider installed, then with one.
func TestSpansWithoutATracerProviderCostNothingAndThoseOfOneInstalledAreRecorded(t *testing.T) {
	parent := Context(context.Background(), tp)
	t.Run("no provider: the parent's context goes on, nothing is allocated", func(t *testing.T) {
		if otel.GetTracerProvider() != defaultProvider {
			t.Skip("a tracer provider is installed")
		}
		ctx, span := StartConsumerOf(context.Background(), tp, "sluice.grant.delivery", "g1", "process")
		if span.IsRecording() || TraceParent(ctx) != tp {
			t.Fatalf("recording %v, traceparent %q, want not recording and %q", span.IsRecording(), TraceParent(ctx), tp)
		}
		if n := testing.AllocsPerRun(100, func() {
			_, span := StartProducer(parent, "sluice.result.delivery", "g1.result")
			span.End()
		}); n != 0 {
			t.Errorf("%v allocations per span, want 0", n)
		}
	})
	t.Run("a provider installed: its spans are recorded, as children", func(t *testing.T) {
		rec := tracetest.NewSpanRecorder()
		old := otel.GetTracerProvider()
		otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
		t.Cleanup(func() { otel.SetTracerProvider(old) })
		sampled := Context(context.Background(), tp)
		_, span := StartProducer(sampled, "sluice.result.delivery", "g1.result")
		span.End()
		ended := rec.Ended()
		if len(ended) != 1 || ended[0].Name() != "send sluice.result.delivery" || ended[0].Parent().TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
			t.Fatalf("spans recorded: %v, want one child of the traceparent's", ended)
		}
	})
	t.Run("the default provider again, passing spans to the one installed before: still recorded", func(t *testing.T) {
		// OpenTelemetry's default provider passes its spans to the first
		// provider installed, also once the default is put back.
		if otel.GetTracerProvider() != defaultProvider {
			t.Skip("the default provider is not back")
		}
		unchecked.Store(0)
		_, span := StartProducer(context.Background(), "sluice.result.delivery", "g2.result")
		span.End()
		if !span.SpanContext().IsValid() {
			t.Fatal("a span of the default provider that delegates has no ids")
		}
	})
}

func TestAnItemsMessageIDIsMadeOnlyForATracerProviderInstalled(t *testing.T) {
	if otel.GetTracerProvider() == defaultProvider && !delegates.Load() {
		if got := ItemID("g1", ".result"); got != "" {
			t.Errorf("with no provider: %q, want none", got)
		}
	}
	old := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider())
	t.Cleanup(func() { otel.SetTracerProvider(old) })
	if got := ItemID("g1", ".result"); got != "g1.result" {
		t.Errorf("with a provider: %q, want g1.result", got)
	}
}
