package stack

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

func TestWithoutAnExporterSpansHaveIdsButRecordOnlyWhatCameInSampled(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_TRACES_SAMPLER", "")
	shutdown, err := Tracing(context.Background(), "scheduler")
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(context.Background())
	tr := otel.Tracer("test")

	_, root := tr.Start(context.Background(), "root")
	sc := root.SpanContext()
	if !sc.IsValid() {
		t.Fatal("a trace started here has no ids for the logs")
	}
	if root.IsRecording() || sc.IsSampled() {
		t.Errorf("a trace started here is recorded (%v) or sampled (%v) with nowhere to send it", root.IsRecording(), sc.IsSampled())
	}
	_, child := tr.Start(trace.ContextWithSpan(context.Background(), root), "child")
	if child.SpanContext().TraceID() != sc.TraceID() || child.SpanContext().SpanID() == sc.SpanID() {
		t.Errorf("child %v of %v: want the same trace, a span of its own", child.SpanContext(), sc)
	}

	sampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2},
		TraceFlags: trace.FlagsSampled, Remote: true})
	_, in := tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), sampled), "from a sampled publisher")
	if !in.IsRecording() || !in.SpanContext().IsSampled() {
		t.Errorf("a span of a trace that came in sampled is recorded %v, sampled %v; want both", in.IsRecording(), in.SpanContext().IsSampled())
	}
}
