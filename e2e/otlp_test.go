package e2e

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	bustracing "github.com/sluice-dtr/sluice/pkg/bus/tracing"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// exportedSpan is a span as an OTLP receiver got it.
type exportedSpan struct {
	service string
	trace   trace.TraceID
	name    string
}

// collector is a real OTLP receiver of traces on loopback, over HTTP or
// gRPC.
type collector struct {
	url   string
	mu    sync.Mutex
	spans []exportedSpan
	// auth is the last authorization header (gRPC: metadata) received.
	auth string
}

func newCollector(t *testing.T) *collector {
	c := &collector{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		if err := c.receive(r); err != nil {
			t.Errorf("OTLP request: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		b, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(b)
	})
	c.url = httpServer(t, mux)
	return c
}

// newGRPCCollector is a collector that takes OTLP over gRPC.
func newGRPCCollector(t *testing.T) *collector {
	c := &collector{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(srv, grpcReceiver{c: c})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	c.url = "http://" + ln.Addr().String()
	return c
}

// grpcReceiver is the collector's OTLP trace service.
type grpcReceiver struct {
	collectorpb.UnimplementedTraceServiceServer
	c *collector
}

func (g grpcReceiver) Export(ctx context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	auth := ""
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get("authorization")) > 0 {
		auth = md.Get("authorization")[0]
	}
	g.c.store(req, auth)
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

func (c *collector) receive(r *http.Request) error {
	if ct := r.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		return fmt.Errorf("content type %q, want application/x-protobuf", ct)
	}
	body := r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return fmt.Errorf("gzip: %w", err)
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	var req collectorpb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		return fmt.Errorf("decode ExportTraceServiceRequest: %w", err)
	}
	c.store(&req, r.Header.Get("Authorization"))
	return nil
}

// store keeps the spans of an export request.
func (c *collector) store(req *collectorpb.ExportTraceServiceRequest, auth string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.auth = auth
	for _, rs := range req.ResourceSpans {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				c.spans = append(c.spans, exportedSpan{service: service, trace: trace.TraceID(sp.TraceId), name: sp.Name})
			}
		}
	}
}

func (c *collector) authorization() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.auth
}

func (c *collector) received() []exportedSpan {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]exportedSpan(nil), c.spans...)
}

// otelVariables are the variables that say where traces go, unset for a
// test.
var otelVariables = []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME",
	"OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
	"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"}

// tracing runs app.Tracing for role for the rest of the test, and
// returns its shutdown.
func tracing(t *testing.T, role string) func(context.Context) error {
	old := otel.GetTracerProvider()
	shutdown, err := app.Tracing(context.Background(), role)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = shutdown(context.Background())
		otel.SetTracerProvider(old)
	})
	return shutdown
}

func TestTracingExportsOverOTLPUnderTheRolesServiceName(t *testing.T) {
	tests := []struct {
		name    string
		role    string
		grpc    bool              // the receiver takes OTLP over gRPC, else over HTTP
		env     map[string]string // "{url}" is the receiver's address
		service string            // empty: nothing is exported
	}{
		{"one role", "delivery", false, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "{url}"}, "sluice-delivery"},
		{"every role", "all", false, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "{url}"}, "sluice"},
		{"the demo", "demo", false, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "{url}"}, "sluice"},
		{"OTEL_SERVICE_NAME wins", "scheduler", false,
			map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "{url}", "OTEL_SERVICE_NAME": "site-a-scheduler"}, "site-a-scheduler"},
		{"the traces endpoint alone", "generator", false,
			map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "{url}/v1/traces"}, "sluice-generator"},
		{"no endpoint: ids only", "processor", false, nil, ""},
		{"gRPC", "delivery", true,
			map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "{url}", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "sluice-delivery"},
		{"gRPC for traces alone", "all", true,
			map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "{url}", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, "sluice"},
		{"OTEL_TRACES_EXPORTER=otlp with the endpoint", "scheduler", false,
			map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "{url}"}, "sluice-scheduler"},
		{"OTEL_TRACES_EXPORTER=none: ids only", "scheduler", false,
			map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "{url}"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCollector(t)
			if tt.grpc {
				c = newGRPCCollector(t)
			}
			for _, k := range otelVariables {
				t.Setenv(k, "")
			}
			t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20e2e")
			for k, v := range tt.env {
				t.Setenv(k, strings.ReplaceAll(v, "{url}", c.url))
			}
			shutdown := tracing(t, tt.role)
			_, span := otel.Tracer("test").Start(context.Background(), "work")
			span.End()
			id := span.SpanContext().TraceID()
			if !id.IsValid() {
				t.Fatal("the span has no trace id")
			}
			// The batch holds the span for seconds; shutting down sends it.
			if err := shutdown(context.Background()); err != nil {
				t.Fatalf("shutdown: %v", err)
			}
			got := c.received()
			if tt.service == "" {
				if len(got) != 0 {
					t.Fatalf("exported %v with no endpoint set", got)
				}
				return
			}
			if len(got) != 1 || got[0] != (exportedSpan{service: tt.service, trace: id, name: "work"}) {
				t.Fatalf("received %v, want the span %s of trace %s from %s", got, "work", id, tt.service)
			}
			if auth := c.authorization(); auth != "Bearer e2e" {
				t.Errorf("the receiver got authorization %q, want OTEL_EXPORTER_OTLP_HEADERS's", auth)
			}
		})
	}
}

func TestEachDTRsTraceArrivesAtAnOTLPReceiver(t *testing.T) {
	c := newCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", c.url)
	t.Setenv("OTEL_SERVICE_NAME", "")
	shutdown := tracing(t, "all")
	s := start(t, testConfig())

	// The final events carry each DTR's traceparent.
	traces := make(chan trace.TraceID, 10)
	sub, err := s.nc.Subscribe(api.SubjectDTRFinal, func(m *nats.Msg) {
		fs, _ := codec.DecodeFinals(context.Background(), m)
		for _, f := range fs {
			traces <- trace.SpanContextFromContext(bustracing.Context(context.Background(), f.TraceParent)).TraceID()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	var files []job.File
	for i := range 2 {
		src := filepath.Join(s.dir, "in", fmt.Sprint(i))
		writeFile(t, src, 2000, i)
		files = append(files, job.File{Source: fileURL(src), Destination: fileURL(filepath.Join(s.dir, "out", fmt.Sprint(i)))})
	}
	if ev := s.wait(s.submit(&job.Job{Inputs: files}).JobID, time.Minute); ev.State != api.JobFinished {
		t.Fatalf("job %s: %v", ev.State, ev.Failures)
	}
	want := map[trace.TraceID]bool{}
	for range files {
		select {
		case id := <-traces:
			want[id] = true
		case <-time.After(10 * time.Second):
			t.Fatal("no final event")
		}
	}
	time.Sleep(200 * time.Millisecond) // the last spans end after the results are stored
	if err := shutdown(context.Background()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}

	names := map[trace.TraceID]map[string]bool{}
	for _, sp := range c.received() {
		if sp.service != "sluice" {
			t.Errorf("span %q from service %q, want sluice", sp.name, sp.service)
		}
		if !want[sp.trace] {
			t.Errorf("span %q in trace %s, which is no DTR's", sp.name, sp.trace)
		}
		if names[sp.trace] == nil {
			names[sp.trace] = map[string]bool{}
		}
		names[sp.trace][sp.name] = true
	}
	for id := range want {
		for _, n := range []string{"send dtr.submit", "schedule dtr.submit", "process sluice.grant.pre",
			"process sluice.grant.delivery", "process sluice.grant.post", "send sluice.event.dtr.final"} {
			if !names[id][n] {
				t.Errorf("trace %s: no span %q arrived; got %v", id, n, names[id])
			}
		}
	}
}
