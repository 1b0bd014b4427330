package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// jaegerModule is the Jaeger release the collector test runs: Jaeger v2,
// an OpenTelemetry Collector with Jaeger's storage and query service.
const jaegerModule = "github.com/jaegertracing/jaeger"
const jaegerVersion = "v1.76.0"

// jaegerBuildTime bounds the time a test spends building Jaeger: what the
// build cache does not hold yet takes longer (some twenty minutes cold, on
// two cores), and a later run goes on from what this one cached.
const jaegerBuildTime = 3 * time.Minute

// jaegerBinary returns a Jaeger v2 program: SLUICE_JAEGER's, else a
// Jaeger v2 on PATH, else one built from jaegerModule in a scratch module
// under the user's cache directory, where later runs find it. .ci/run
// builds it once and sets SLUICE_JAEGER. The test is skipped, saying why,
// only when Jaeger cannot be built, or not within jaegerBuildTime.
func jaegerBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SLUICE_JAEGER"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("SLUICE_JAEGER: %v", err)
		}
		return p
	}
	if p, err := exec.LookPath("jaeger"); err == nil {
		if out, _ := exec.Command(p, "--help").CombinedOutput(); strings.Contains(string(out), "Jaeger backend v2") {
			return p
		}
	}
	how := "set SLUICE_JAEGER to a jaeger binary (go build " + jaegerModule + "/cmd/jaeger, " + jaegerVersion + ", in a scratch module: see .ci/run)"
	dir := t.TempDir()
	if cache, err := os.UserCacheDir(); err == nil {
		dir = filepath.Join(cache, "sluice-e2e", "jaeger-"+jaegerVersion)
	}
	bin := filepath.Join(dir, "jaeger")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	if testing.Short() {
		t.Skip("-short: building Jaeger takes minutes; " + how)
	}
	budget := jaegerBuildTime
	if deadline, ok := t.Deadline(); ok {
		budget = min(budget, time.Until(deadline)-2*time.Minute)
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Skipf("cannot build Jaeger: %v; %s", err, how)
	}
	start := time.Now()
	tmp := fmt.Sprintf("%s.%d", bin, os.Getpid())
	steps := [][]string{
		{"get", "-tool", jaegerModule + "/cmd/jaeger@" + jaegerVersion},
		{"build", "-o", tmp, jaegerModule + "/cmd/jaeger"},
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		steps = append([][]string{{"mod", "init", "jaegerbuild"}}, steps...)
	}
	for _, args := range steps {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			if ctx.Err() != nil {
				t.Skipf("Jaeger was not built within %s (the next run goes on from what the build cache holds now); %s", budget.Round(time.Second), how)
			}
			t.Skipf("cannot build Jaeger (go %s: %v): %s\n%s", strings.Join(args, " "), err, lastLines(string(out), 10), how)
		}
	}
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	t.Logf("built Jaeger %s in %s", jaegerVersion, time.Since(start).Round(time.Second))
	return bin
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// freePorts returns n loopback ports free a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return ports
}

// jaegerConfig is a Jaeger v2 configuration: OTLP over gRPC in, traces
// kept in memory, the query service's HTTP API out; nothing else listens.
const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:%d
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`

// jaeger runs a Jaeger v2 for the test and returns its OTLP/gRPC endpoint
// and the base URL of its query API.
func jaeger(t *testing.T) (otlp, query string) {
	t.Helper()
	bin := jaegerBinary(t)
	ports := freePorts(t, 3)
	cfg := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, jaegerConfig, ports[0], ports[1], ports[2]), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	cmd := exec.Command(bin, "--config", "file:"+cfg)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	t.Cleanup(stop)
	query = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get(query + "/api/services")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("Jaeger's query API did not answer within 30 s: %v\n%s", err, logs.String())
		}
	}
	return fmt.Sprintf("http://127.0.0.1:%d", ports[2]), query
}

// jaegerTrace is a trace as Jaeger's query API answers it.
type jaegerTrace struct {
	TraceID string `json:"traceID"`
	Spans   []struct {
		OperationName string `json:"operationName"`
		ProcessID     string `json:"processID"`
		Tags          []struct {
			Key   string `json:"key"`
			Value any    `json:"value"`
		} `json:"tags"`
	} `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

// jaegerTraces asks Jaeger's query API for the traces of service whose
// spans have the given tags.
func jaegerTraces(t *testing.T, query, service string, tags map[string]string) []jaegerTrace {
	t.Helper()
	b, _ := json.Marshal(tags)
	u := query + "/api/traces?" + url.Values{"service": {service}, "tags": {string(b)}, "lookback": {"1h"}, "limit": {"20"}}.Encode()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Data   []jaegerTrace `json:"data"`
		Errors []any         `json:"errors"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%s: %v", u, err)
	}
	if resp.StatusCode != http.StatusOK || len(out.Errors) > 0 {
		t.Fatalf("%s: %s %v", u, resp.Status, out.Errors)
	}
	return out.Data
}

// A real Jaeger, taking OTLP over gRPC, finds a DTR's trace by its DTR id,
// with the spans of the scheduler, the processor and the deliverer.
func TestJaegerFindsADTRsTraceByItsIDWithEveryServicesSpans(t *testing.T) {
	otlp, query := jaeger(t)
	for _, k := range otelVariables {
		t.Setenv(k, "")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	shutdown := tracing(t, "all")
	s := start(t, testConfig())

	var files []job.File
	for i := range 2 {
		src := filepath.Join(s.dir, "in", fmt.Sprint(i))
		writeFile(t, src, 3000, i)
		files = append(files, job.File{Source: fileURL(src), Destination: fileURL(filepath.Join(s.dir, "out", fmt.Sprint(i)))})
	}
	ev := s.wait(s.submit(&job.Job{Inputs: files}).JobID, time.Minute)
	if ev.State != api.JobFinished || len(ev.Files) != len(files) {
		t.Fatalf("job %s with %d files: %v", ev.State, len(ev.Files), ev.Failures)
	}
	time.Sleep(200 * time.Millisecond) // the last spans end after the results are stored
	if err := shutdown(context.Background()); err != nil {
		t.Fatalf("flushing the spans to Jaeger: %v", err)
	}

	f := ev.Files[0]
	// Each stage's work, as its service names it.
	want := map[string]string{
		"schedule dtr.submit":           "scheduler",
		"send sluice.grant.delivery":    "scheduler",
		"process sluice.grant.pre":      "processor",
		"process sluice.grant.post":     "processor",
		"process sluice.grant.delivery": "delivery",
	}
	var found []jaegerTrace
	var missing []string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		found = jaegerTraces(t, query, "sluice", map[string]string{"sluice.dtr.id": f.DTR.String()})
		missing = nil
		if len(found) == 1 {
			have := map[string]bool{}
			for _, sp := range found[0].Spans {
				for _, tag := range sp.Tags {
					if tag.Key == "sluice.dtr.id" && tag.Value == f.DTR.String() {
						have[sp.OperationName] = true
					}
				}
			}
			for op, role := range want {
				if !have[op] {
					missing = append(missing, fmt.Sprintf("%s (%s)", op, role))
				}
			}
		}
		if len(found) == 1 && len(missing) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(found) != 1 {
		t.Fatalf("Jaeger has %d traces with sluice.dtr.id=%s, want 1", len(found), f.DTR)
	}
	tr := found[0]
	if tr.TraceID != f.TraceID {
		t.Errorf("Jaeger's trace %s, the job's status names %s", tr.TraceID, f.TraceID)
	}
	if len(missing) > 0 {
		var ops []string
		for _, sp := range tr.Spans {
			ops = append(ops, sp.OperationName)
		}
		t.Errorf("the trace of DTR %s in Jaeger lacks the spans, with sluice.dtr.id, of %s; it has %v", f.DTR, strings.Join(missing, ", "), ops)
	}
	for _, sp := range tr.Spans {
		if p := tr.Processes[sp.ProcessID]; p.ServiceName != "sluice" {
			t.Errorf("span %q from service %q, want sluice", sp.OperationName, p.ServiceName)
		}
	}
	// The job's id finds both its DTRs' traces.
	if n := len(jaegerTraces(t, query, "sluice", map[string]string{"sluice.job.id": ev.Job.ID})); n != len(files) {
		t.Errorf("Jaeger has %d traces with sluice.job.id=%s, want %d", n, ev.Job.ID, len(files))
	}
}
