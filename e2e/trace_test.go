package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/httpstore"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// recordSpans makes the global tracer provider record every span for the
// rest of the test.
func recordSpans(t *testing.T) *tracetest.SpanRecorder {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	old := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(old) })
	return rec
}

func spanAttr(sp sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range sp.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// traceOf returns the trace id of a DTR: that of the span that sent it to
// dtr.submit with the DTR's id as message id.
func traceOf(spans []sdktrace.ReadOnlySpan, dtrID string) trace.TraceID {
	for _, sp := range spans {
		if sp.Name() == "send dtr.submit" && spanAttr(sp, "messaging.message.id") == dtrID {
			return sp.SpanContext().TraceID()
		}
	}
	return trace.TraceID{}
}

func TestEveryDTRIsOneUnbrokenTraceThroughEveryStageAndRetry(t *testing.T) {
	rec := recordSpans(t)
	s := start(t, testConfig())
	remote := filepath.Join(s.dir, "remote")
	writeFile(t, filepath.Join(remote, "busy"), 100000, 1)
	writeFile(t, filepath.Join(s.dir, "in", "local"), 1000, 2)
	var gets atomic.Int32
	store := httpstore.Handler(remote)
	base := httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && gets.Add(1) == 1 {
			http.Error(w, "busy, come back later", http.StatusServiceUnavailable)
			return
		}
		store.ServeHTTP(w, r)
	}))
	ev := s.wait(s.submit(&job.Job{Inputs: []job.File{
		{Source: fileURL(filepath.Join(s.dir, "in", "local")), Destination: fileURL(filepath.Join(s.dir, "out", "local"))},
		{Source: base + "/busy", Destination: fileURL(filepath.Join(s.dir, "out", "busy"))},
	}}).JobID, time.Minute)
	if ev.State != api.JobFinished || len(ev.Files) != 2 {
		t.Fatalf("job %s with %d files: %v", ev.State, len(ev.Files), ev.Failures)
	}

	// Spans end after the messages they send are stored: wait until the
	// generator has taken every DTR's final event.
	var spans []sdktrace.ReadOnlySpan
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		spans = rec.Ended()
		n := 0
		for _, sp := range spans {
			if sp.Name() == "process sluice.event.dtr.final" {
				n++
			}
		}
		if n == len(ev.Files) || time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(200 * time.Millisecond) // and the acknowledgements of the last grants
	spans = rec.Ended()

	byTrace := map[trace.TraceID][]sdktrace.ReadOnlySpan{}
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, sp := range spans {
		byTrace[sp.SpanContext().TraceID()] = append(byTrace[sp.SpanContext().TraceID()], sp)
		byID[sp.SpanContext().SpanID()] = sp
	}
	if len(byTrace) != len(ev.Files) {
		var got []string
		for id, sps := range byTrace {
			var names []string
			for _, sp := range sps {
				names = append(names, sp.Name())
			}
			got = append(got, fmt.Sprintf("%s: %s", id.String()[:8], strings.Join(names, ", ")))
		}
		t.Fatalf("%d traces, want one per DTR (%d):\n%s", len(byTrace), len(ev.Files), strings.Join(got, "\n"))
	}

	t.Run("each DTR's trace holds every stage of every attempt", func(t *testing.T) {
		attempts := map[string]int{"local": 1, "busy": 2}
		for _, f := range ev.Files {
			name := filepath.Base(f.Destination)
			if f.Attempts != attempts[name] {
				t.Fatalf("%s after %d attempts, want %d", name, f.Attempts, attempts[name])
			}
			id := traceOf(spans, f.DTR.String())
			if !id.IsValid() {
				t.Fatalf("no span sent DTR %s (%s)", f.DTR, name)
			}
			count := map[string]int{}
			var deliveries []sdktrace.ReadOnlySpan
			for _, sp := range byTrace[id] {
				count[sp.Name()]++
				if sp.Name() == "process sluice.grant.delivery" {
					deliveries = append(deliveries, sp)
				}
			}
			// Pre- and post-processing may take more than one grant per
			// attempt; delivery takes exactly one.
			tests := []struct {
				span     string
				min, max int
			}{
				{"send dtr.submit", 1, 1},
				{"schedule dtr.submit", 1, 1},
				{"send sluice.grant.pre", f.Attempts, 100},
				{"process sluice.grant.pre", f.Attempts, 100},
				{"result sluice.result.pre", f.Attempts, 100},
				{"send sluice.grant.delivery", f.Attempts, f.Attempts},
				{"process sluice.grant.delivery", f.Attempts, f.Attempts},
				{"send sluice.result.delivery", f.Attempts, f.Attempts},
				{"result sluice.result.delivery", f.Attempts, f.Attempts},
				{"send sluice.grant.post", f.Attempts, 100},
				{"process sluice.grant.post", f.Attempts, 100},
				{"result sluice.result.post", f.Attempts, 100},
				{"send sluice.event.dtr.final", 1, 1},
				{"process sluice.event.dtr.final", 1, 1},
			}
			for _, tt := range tests {
				if n := count[tt.span]; n < tt.min || n > tt.max {
					t.Errorf("%s: %d spans %q, want %d to %d; all: %v", name, n, tt.span, tt.min, tt.max, count)
				}
			}
			// Every failed attempt says so; the last one succeeded.
			failed := 0
			for _, sp := range deliveries {
				if sp.Status().Code == codes.Error {
					failed++
					mustContain(t, "status of a failed delivery", sp.Status().Description, "TEMPORARY_REMOTE", "503")
				}
			}
			if failed != f.Attempts-1 {
				t.Errorf("%s: %d failed delivery spans, want %d", name, failed, f.Attempts-1)
			}
		}
	})

	t.Run("every span names its DTR; workers name their stage, the hosts, the bytes and the error kind", func(t *testing.T) {
		for _, f := range ev.Files {
			name := filepath.Base(f.Destination)
			id := traceOf(spans, f.DTR.String())
			for _, sp := range byTrace[id] {
				if got := spanAttr(sp, "sluice.dtr.id"); got != f.DTR.String() {
					t.Errorf("%s: span %q has sluice.dtr.id %q, want %s", name, sp.Name(), got, f.DTR)
				}
				if got := spanAttr(sp, "sluice.job.id"); got != ev.Job.ID {
					t.Errorf("%s: span %q has sluice.job.id %q, want %s", name, sp.Name(), got, ev.Job.ID)
				}
				if sp.Name() != "send dtr.submit" && spanAttr(sp, "sluice.share") != "_default-download" {
					t.Errorf("%s: span %q has sluice.share %q", name, sp.Name(), spanAttr(sp, "sluice.share"))
				}
				for _, stage := range []string{"pre", "delivery", "post"} {
					if strings.HasSuffix(sp.Name(), "."+stage) && spanAttr(sp, "sluice.stage") != stage {
						t.Errorf("%s: span %q has sluice.stage %q", name, sp.Name(), spanAttr(sp, "sluice.stage"))
					}
				}
				for _, kv := range sp.Attributes() {
					if v := kv.Value.Emit(); strings.Contains(v, "://") || strings.Contains(v, "/busy") {
						t.Errorf("%s: span %q has a URL or a path in %s=%q", name, sp.Name(), kv.Key, v)
					}
				}
				if sp.Name() != "process sluice.grant.delivery" {
					continue
				}
				wantHost := ""
				if name == "busy" {
					wantHost = "127.0.0.1"
				}
				if got := spanAttr(sp, "sluice.source.address"); got != wantHost {
					t.Errorf("%s: delivery span has sluice.source.address %q, want %q", name, got, wantHost)
				}
				if sp.Status().Code == codes.Error {
					if got := spanAttr(sp, "error.type"); got != "TEMPORARY_REMOTE" {
						t.Errorf("%s: failed delivery span has error.type %q, want TEMPORARY_REMOTE", name, got)
					}
				} else if got := spanAttr(sp, "sluice.bytes"); got != fmt.Sprint(f.Size) {
					t.Errorf("%s: delivery span has sluice.bytes %q, want %d", name, got, f.Size)
				}
			}
		}
	})

	t.Run("the job's status and the scheduler's answer about a DTR name its trace", func(t *testing.T) {
		for _, f := range ev.Files {
			want := traceOf(spans, f.DTR.String()).String()
			if f.TraceID != want {
				t.Errorf("%s: the job's status names trace %q, want %s", filepath.Base(f.Destination), f.TraceID, want)
			}
			var reply api.DTRReply
			if err := s.request(api.SubjectDTR, []byte(f.DTR.String()), nil, &reply); err != nil {
				t.Fatal(err)
			}
			if reply.TraceID != want {
				t.Errorf("%s: the scheduler's answer names trace %q, want %s", filepath.Base(f.Destination), reply.TraceID, want)
			}
		}
	})

	t.Run("every parent is recorded in the same trace; one root each", func(t *testing.T) {
		roots := map[trace.TraceID]int{}
		for _, sp := range spans {
			p := sp.Parent()
			if !p.IsValid() {
				roots[sp.SpanContext().TraceID()]++
				if sp.Name() != "send dtr.submit" {
					t.Errorf("root span %q, want send dtr.submit", sp.Name())
				}
				continue
			}
			parent, ok := byID[p.SpanID()]
			if !ok {
				t.Errorf("span %q has a parent %s that was never recorded", sp.Name(), p.SpanID())
			} else if parent.SpanContext().TraceID() != sp.SpanContext().TraceID() {
				t.Errorf("span %q and its parent %q are in different traces", sp.Name(), parent.Name())
			}
		}
		for id, n := range roots {
			if n != 1 {
				t.Errorf("trace %s has %d roots", id, n)
			}
		}
	})

	t.Run("messaging spans follow the semantic conventions", func(t *testing.T) {
		for _, sp := range spans {
			op, subject, _ := strings.Cut(sp.Name(), " ")
			kind, opType := trace.SpanKindConsumer, "process"
			if op == "send" {
				kind, opType = trace.SpanKindProducer, "send"
			}
			if sp.SpanKind() != kind {
				t.Errorf("span %q is a %s span, want %s", sp.Name(), sp.SpanKind(), kind)
			}
			want := []attribute.KeyValue{
				attribute.String("messaging.system", "nats"),
				attribute.String("messaging.operation.type", opType),
				attribute.String("messaging.destination.name", subject),
			}
			for _, kv := range want {
				if got := spanAttr(sp, string(kv.Key)); got != kv.Value.AsString() {
					t.Errorf("span %q: %s=%q, want %q", sp.Name(), kv.Key, got, kv.Value.AsString())
				}
			}
			// Every message Sluice sends has an id (Nats-Msg-Id).
			if spanAttr(sp, "messaging.message.id") == "" {
				t.Errorf("span %q has no messaging.message.id", sp.Name())
			}
		}
	})
}

// A DTR published to dtr.submit by anyone goes on in the publisher's trace,
// whichever way the CloudEvent carries it.
func TestAPublishersTraceGoesOnThroughItsDTR(t *testing.T) {
	rec := recordSpans(t)
	s := start(t, testConfig())
	src := filepath.Join(s.dir, "src")
	writeFile(t, src, 5000, 3)
	binary := func(id string) *nats.Msg {
		m := nats.NewMsg(api.SubjectSubmit)
		m.Header.Set("ce-specversion", "1.0")
		m.Header.Set("ce-id", id)
		m.Header.Set("ce-source", "test")
		m.Header.Set("ce-type", api.TypeSubmit)
		m.Header.Set("content-type", "application/json")
		m.Data = fmt.Appendf(nil, `{"id":%q,"source":%q,"destination":%q}`, id, fileURL(src), fileURL(filepath.Join(s.dir, "dst", id)))
		return m
	}
	tests := []struct {
		name string
		msg  func(id, traceparent string) *nats.Msg
	}{
		{"binary, traceparent header", func(id, tp string) *nats.Msg {
			m := binary(id)
			m.Header.Set("traceparent", tp)
			return m
		}},
		{"binary, ce-traceparent extension", func(id, tp string) *nats.Msg {
			m := binary(id)
			m.Header.Set("ce-traceparent", tp)
			return m
		}},
		{"structured, traceparent extension", func(id, tp string) *nats.Msg {
			m := nats.NewMsg(api.SubjectSubmit)
			m.Header.Set("content-type", "application/cloudevents+json")
			m.Data = fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"test","type":%q,"traceparent":%q,
				"datacontenttype":"application/json","data":{"id":%q,"source":%q,"destination":%q}}`,
				id, api.TypeSubmit, tp, id, fileURL(src), fileURL(filepath.Join(s.dir, "dst", id)))
			return m
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := uuid.NewString()
			tid, sid := trace.TraceID(uuid.New()), trace.SpanID{}
			copy(sid[:], tid[4:])
			tp := fmt.Sprintf("00-%s-%s-01", tid, sid)
			if _, err := s.js.PublishMsg(context.Background(), tt.msg(id, tp)); err != nil {
				t.Fatal(err)
			}
			names := map[string]bool{}
			for deadline := time.Now().Add(30 * time.Second); !names["send sluice.event.dtr.final"]; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the DTR's trace %s has only %v", tid, names)
				}
				for _, sp := range rec.Ended() {
					if sp.SpanContext().TraceID() != tid {
						continue
					}
					names[sp.Name()] = true
					if sp.Name() == "schedule dtr.submit" && sp.Parent().SpanID() != sid {
						t.Fatalf("schedule dtr.submit has parent %s, want the publisher's %s", sp.Parent().SpanID(), sid)
					}
				}
			}
			for _, want := range []string{"schedule dtr.submit", "process sluice.grant.pre", "process sluice.grant.delivery", "process sluice.grant.post"} {
				if !names[want] {
					t.Errorf("no span %q in the publisher's trace: %v", want, names)
				}
			}
		})
	}
}

// A job's status names each DTR's trace while it is pending and once it
// is final, the same one.
func TestAJobsStatusNamesEachDTRsTraceFromTheStart(t *testing.T) {
	// Real trace ids, as every serving process has.
	old := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())))
	t.Cleanup(func() { otel.SetTracerProvider(old) })
	s := start(t, testConfig())
	remote := filepath.Join(s.dir, "remote")
	writeFile(t, filepath.Join(remote, "held"), 2000, 1)
	base, release := heldStore(t, remote)
	id := s.submit(&job.Job{Inputs: []job.File{{Source: base + "/held", Destination: fileURL(filepath.Join(s.dir, "out", "held"))}}}).JobID
	var pending api.JobEvent
	if err := s.request(api.SubjectJobStatus, []byte(id), nil, &pending); err != nil {
		t.Fatal(err)
	}
	if len(pending.Pending) != 1 || len(pending.Pending[0].TraceID) != 32 || strings.Trim(pending.Pending[0].TraceID, "0") == "" {
		t.Fatalf("pending lines %+v: want one with a trace id", pending.Pending)
	}
	release()
	ev := s.wait(id, time.Minute)
	if len(ev.Files) != 1 || ev.Files[0].TraceID != pending.Pending[0].TraceID {
		t.Fatalf("final lines %+v: want the pending line's trace %s", ev.Files, pending.Pending[0].TraceID)
	}
	var reply api.DTRReply
	if err := s.request(api.SubjectDTR, []byte(ev.Files[0].DTR.String()), nil, &reply); err != nil {
		t.Fatal(err)
	}
	if reply.TraceID != ev.Files[0].TraceID {
		t.Errorf("the scheduler's answer names trace %q, the job's status %s", reply.TraceID, ev.Files[0].TraceID)
	}
}
