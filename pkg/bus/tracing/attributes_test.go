package tracing

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestAHostIsAllThatIsKeptOfAURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://user:secret@store.example.org:8443/data/f?X-Amz-Signature=abc": "store.example.org",
		"s3://bucket.s3.example.org/key?token=t":                                "bucket.s3.example.org",
		"root://[2001:db8::1]:1094//store/f":                                    "2001:db8::1",
		"davs://dav.example.org/f":                                              "dav.example.org",
		"file:///data/f":                                                        "",
		"file://localhost/data/f":                                               "",
		"/data/f":                                                               "",
		"https://%zz/f":                                                         "",
	} {
		if got := Host(in); got != want {
			t.Errorf("Host(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestARecordedSpanNamesItsDTRJobShareStageHostsBytesAndErrorKind(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
	d := &dtr.DTR{ID: uuid.MustParse("0af76519-16cd-43dd-8448-eb211c80319c"), JobID: "job-1", Share: "atlas-download",
		Source: "https://user:pw@in.example.org/f?sig=s", Destination: "file:///data/f"}
	_, span := tracer.Start(context.Background(), "process sluice.grant.delivery")
	SetDTR(span, d, dtr.StageDelivery)
	SetResult(span, 1234, &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "503 from https://user:pw@in.example.org/f?sig=s"})
	span.End()
	got := map[attribute.Key]string{}
	for _, kv := range rec.Ended()[0].Attributes() {
		got[kv.Key] = kv.Value.Emit()
	}
	want := map[attribute.Key]string{
		"sluice.dtr.id": d.ID.String(), "sluice.job.id": "job-1", "sluice.share": "atlas-download", "sluice.stage": "delivery",
		"sluice.source.address": "in.example.org",
		"sluice.bytes":          "1234", "error.type": string(dtr.ErrTemporaryRemote),
	}
	if len(got) != len(want) {
		t.Errorf("attributes %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

func TestASpanNotRecordedCostsNoAllocation(t *testing.T) {
	_, span := noop.NewTracerProvider().Tracer("test").Start(context.Background(), "x")
	d := &dtr.DTR{ID: uuid.New(), JobID: "j", Share: "s", Source: "https://a.example.org/f", Destination: "https://b.example.org/f"}
	if n := testing.AllocsPerRun(100, func() {
		SetDTR(span, d, dtr.StagePre)
		SetResult(span, 10, &dtr.Failure{Kind: dtr.ErrTemporaryRemote})
	}); n != 0 {
		t.Errorf("%v allocations per span not recorded, want 0", n)
	}
}
