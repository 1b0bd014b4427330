package app

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dtr/sluice/pkg/bus/tracing"
)

func TestWithoutAnExporterSpansHaveIdsButRecordOnlyWhatCameInSampled(t *testing.T) {
	tracingWithoutAnExporter(t, "scheduler")
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

func TestAChildOfAnUnsampledTraceIsNotStartedButCarriesTheTraceOn(t *testing.T) {
	tracingWithoutAnExporter(t, "processor")
	for _, tt := range []struct {
		name        string
		traceparent string
		wantNew     bool
	}{
		{"unsampled: the parent goes on", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", false},
		{"sampled: a span of its own, recorded", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, span := tracing.StartConsumerOf(context.Background(), tt.traceparent, "sluice.grant.pre", "g.1", "process")
			defer span.End()
			sc := span.SpanContext()
			if sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
				t.Fatalf("trace %s: the trace did not go on", sc.TraceID())
			}
			if isNew := sc.SpanID().String() != "00f067aa0ba902b7"; isNew != tt.wantNew || span.IsRecording() != tt.wantNew {
				t.Errorf("span %s recording %v; want a new, recorded span: %v", sc.SpanID(), span.IsRecording(), tt.wantNew)
			}
			if got := tracing.TraceParent(ctx); got[:36] != tt.traceparent[:36] {
				t.Errorf("passed on %s, want trace %s", got, tt.traceparent[:36])
			}
		})
	}
}

// tracingWithoutAnExporter runs Tracing for role, with no OTLP endpoint and
// the default sampler, for the rest of the test.
func tracingWithoutAnExporter(t *testing.T, role string) {
	t.Helper()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_TRACES_SAMPLER", "")
	shutdown, err := Tracing(context.Background(), role)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = shutdown(context.Background()) })
}

func TestAnExporterTheVariablesCannotMakeStopsTheStartNamingThem(t *testing.T) {
	for k, v := range map[string]string{"OTEL_TRACES_EXPORTER": "", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://user:secret@collector:4318",
		"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": ""} {
		t.Setenv(k, v)
	}
	_, err := Tracing(context.Background(), "scheduler")
	if err == nil || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_") || strings.Contains(err.Error(), "secret") {
		t.Fatalf("Tracing with an unknown protocol: %v; want an error that names the variables and no secret", err)
	}
}

func TestOTELTracesExporterNoneExportsNothingEvenWithAnEndpoint(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_TRACES_SAMPLER", "")
	shutdown, err := Tracing(context.Background(), "delivery")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = shutdown(context.Background()) })
	_, span := otel.Tracer("test").Start(context.Background(), "root")
	defer span.End()
	if span.IsRecording() || span.SpanContext().IsSampled() || !span.SpanContext().IsValid() {
		t.Errorf("with OTEL_TRACES_EXPORTER=none a trace started here is recording %v, sampled %v, valid %v; want ids only",
			span.IsRecording(), span.SpanContext().IsSampled(), span.SpanContext().IsValid())
	}
}

func TestOTELTracesExporterConsoleWritesTheSpansToStandardOutput(t *testing.T) {
	if os.Getenv("SLUICE_TEST_CONSOLE_EXPORTER") == "1" {
		// The child: its standard output is the console exporter's (whose
		// writer is the os.Stdout of when its package started).
		shutdown, err := Tracing(context.Background(), "generator")
		if err != nil {
			t.Fatal(err)
		}
		_, span := otel.Tracer("test").Start(context.Background(), "console-work")
		span.End()
		fmt.Fprintf(os.Stderr, "trace %s\n", span.SpanContext().TraceID())
		if err := shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestOTELTracesExporterConsoleWritesTheSpansToStandardOutput$")
	cmd.Env = append(os.Environ(), "SLUICE_TEST_CONSOLE_EXPORTER=1", "OTEL_TRACES_EXPORTER=console", "OTEL_EXPORTER_OTLP_ENDPOINT=",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=", "OTEL_TRACES_SAMPLER=", "OTEL_SERVICE_NAME=")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %s%s", err, stdout.String(), stderr.String())
	}
	_, id, _ := strings.Cut(stderr.String(), "trace ")
	id = strings.TrimSpace(id)
	for _, want := range []string{`"Name":"console-work"`, `"TraceID":"` + id + `"`, `"sluice-generator"`} {
		if id == "" || !strings.Contains(stdout.String(), want) {
			t.Errorf("standard output lacks %s: %s", want, stdout.String())
		}
	}
}
