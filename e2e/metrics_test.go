package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/httpstore"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// syncBuffer is a log sink the services write from many goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestMetricsHealthAndJSONLogsTellWhatHappened(t *testing.T) {
	// Real trace ids, as `sluice all` has.
	old := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider())
	defer otel.SetTracerProvider(old)

	s, base, logs := startAllInOne(t)

	// 20 files, one of which fails for good and one that is retried.
	remote := filepath.Join(s.dir, "remote")
	var gets atomic.Int32
	store := httpstore.Handler(remote)
	web := httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/busy" && gets.Add(1) == 1 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		store.ServeHTTP(w, r)
	}))
	j := &job.Job{}
	var bytesWanted int64
	for i := 0; i < 18; i++ {
		src := filepath.Join(s.dir, "in", fmt.Sprint(i))
		writeFile(t, src, 1000*(i+1), i)
		bytesWanted += int64(1000 * (i + 1))
		j.Inputs = append(j.Inputs, job.File{Source: fileURL(src), Destination: fileURL(filepath.Join(s.dir, "out", fmt.Sprint(i)))})
	}
	writeFile(t, filepath.Join(remote, "busy"), 50000, 99)
	bytesWanted += 50000
	j.Inputs = append(j.Inputs,
		job.File{Source: web + "/busy", Destination: fileURL(filepath.Join(s.dir, "out", "busy"))},
		job.File{Source: fileURL(filepath.Join(s.dir, "in", "missing")), Destination: fileURL(filepath.Join(s.dir, "out", "missing")), FailureAllowed: true})
	ev := s.wait(s.submit(j).JobID, time.Minute)
	if ev.Done != 19 || ev.Failed != 1 {
		t.Fatalf("job: %d done, %d failed; want 19 and 1", ev.Done, ev.Failed)
	}

	// The scheduler's figures are sampled every second.
	want := map[string]float64{
		`sluice_scheduler_finished_total{outcome="done"}`:                         19,
		`sluice_scheduler_finished_total{outcome="failed"}`:                       1,
		`sluice_scheduler_retries_total`:                                          1,
		`sluice_scheduler_lease_expiries_total`:                                   0,
		`sluice_scheduler_slots_used{state="TRANSFER"}`:                           0,
		`sluice_scheduler_slots_limit{state="TRANSFER"}`:                          10,
		`sluice_scheduler_slots_emergency{state="TRANSFER"}`:                      0,
		`sluice_scheduler_moved_bytes_total{share="_default-download"}`:           float64(bytesWanted),
		`sluice_worker_bytes_total{stage="delivery"}`:                             float64(bytesWanted),
		`sluice_worker_grants_total{outcome="ok",stage="delivery"}`:               19,
		`sluice_worker_grants_total{outcome="TEMPORARY_REMOTE",stage="delivery"}`: 1,
		`sluice_worker_active{stage="delivery"}`:                                  0,
		`sluice_worker_active{stage="pre"}`:                                       0,
		`sluice_worker_active{stage="post"}`:                                      0,
		`sluice_generator_dtrs_total{event="submitted"}`:                          20,
		`sluice_generator_dtrs_total{event="finished"}`:                           19,
		`sluice_generator_dtrs_total{event="failed"}`:                             1,
		`sluice_generator_jobs_total{event="submitted"}`:                          1,
		`sluice_generator_jobs_total{event="finished"}`:                           1,
		`sluice_scheduler_stuck_dtrs`:                                             0,
		`sluice_scheduler_history_dropped_total{cause="queue"}`:                   0,
		`sluice_scheduler_history_dropped_total{cause="store"}`:                   0,
	}
	var got map[string]float64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got = scrape(t, base+"/metrics")
		ok := true
		for k, v := range want {
			n, found := got[k]
			ok = ok && found && n == v
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			for k, v := range want {
				if n, found := got[k]; !found || n != v {
					t.Errorf("%s = %v (found: %v), want %v", k, n, found, v)
				}
			}
			for k, v := range got {
				if strings.HasPrefix(k, "sluice_") {
					t.Logf("%s %v", k, v)
				}
			}
			t.FailNow()
		}
	}
	if got[`sluice_worker_duration_seconds_count{stage="pre"}`] == 0 {
		t.Errorf("no pre-processing durations recorded")
	}
	// The DTRs' histories are stored within about a second.
	for deadline := time.Now().Add(10 * time.Second); scrape(t, base+"/metrics")[`sluice_scheduler_history_events_total`] < 20; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("history events stored: %v, want at least one a DTR", scrape(t, base+"/metrics")[`sluice_scheduler_history_events_total`])
		}
	}
	info := 0
	for k, v := range got {
		if strings.HasPrefix(k, "sluice_build_info{") && v == 1 && strings.Contains(k, `goversion="go1.`) && strings.Contains(k, `version="`) {
			info++
		}
	}
	if info != 1 {
		t.Errorf("%d sluice_build_info series with a version and the Go release, want 1", info)
	}
	if _, ok := got[`go_goroutines`]; !ok {
		t.Errorf("no Go runtime metrics")
	}

	// Every log line is JSON; those about a DTR name its trace.
	traced := 0
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	hex32 := regexp.MustCompile(`^[0-9a-f]{32}$`)
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line is not JSON: %q", sc.Text())
		}
		if line["msg"] == "dtr final" {
			id, _ := line["trace_id"].(string)
			if !hex32.MatchString(id) || id == strings.Repeat("0", 32) {
				t.Errorf("dtr final line with trace_id %q: %s", id, sc.Text())
			}
			traced++
		}
	}
	if traced != 20 {
		t.Errorf("%d \"dtr final\" log lines with a trace id, want 20", traced)
	}
}

// startAllInOne runs every role in one process serving HTTP, as `sluice
// all` does, logging JSON, and waits until /healthz says it is healthy.
// It returns the system (whose own roles are stopped) and the HTTP base URL.
func startAllInOne(t *testing.T) (*system, string, *syncBuffer) {
	t.Helper()
	s := start(t, testConfig(), "generator")
	s.stopRole("generator")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	all := s.cfg
	all.HTTP = ln
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- app.Run(ctx, all, app.Roles, slog.New(slog.NewJSONHandler(logs, nil)))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("services: %v", err)
		}
	})
	base := "http://" + ln.Addr().String()

	// Healthy once every role runs and the scheduler has recovered.
	var health app.Health
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code := getJSON(t, base+"/healthz", &health)
		if code == http.StatusOK && health.OK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz %d %+v after 10 s", code, health)
		}
	}
	for _, role := range app.Roles {
		if r := health.Roles[role]; !r.OK || r.NATS != "CONNECTED" {
			t.Fatalf("role %s in /healthz: %+v", role, r)
		}
	}
	return s, base, logs
}

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return resp.StatusCode
}

// scrape reads a Prometheus text exposition into "name{labels}" → value.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out
}

// Under `sluice all` the pre, delivery and post pools share one meter;
// each reports its own grants in hand.
func TestWorkerActiveCountsTheRunningTransfersWhenEveryRoleIsOneProcess(t *testing.T) {
	s, base, _ := startAllInOne(t)
	remote := filepath.Join(s.dir, "remote")
	const n = 4
	j := &job.Job{}
	for i := range n {
		writeFile(t, filepath.Join(remote, fmt.Sprint(i)), 1000, i)
	}
	web, release := heldStore(t, remote)
	for i := range n {
		j.Inputs = append(j.Inputs, job.File{Source: fmt.Sprintf("%s/%d", web, i), Destination: fileURL(filepath.Join(s.dir, "out", fmt.Sprint(i)))})
	}
	id := s.submit(j).JobID

	want := map[string]float64{
		`sluice_worker_active{stage="delivery"}`:         n,
		`sluice_worker_active{stage="pre"}`:              0,
		`sluice_worker_active{stage="post"}`:             0,
		`sluice_scheduler_slots_used{state="TRANSFER"}`:  n,
		`sluice_scheduler_slots_limit{state="TRANSFER"}`: 10,
	}
	var got map[string]float64
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got = scrape(t, base+"/metrics")
		ok := true
		for k, v := range want {
			m, found := got[k]
			ok = ok && found && m == v
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			for k, v := range want {
				if m, found := got[k]; !found || m != v {
					t.Errorf("while %d transfers run: %s = %v (found: %v), want %v", n, k, m, found, v)
				}
			}
			t.FailNow()
		}
	}
	release()
	if ev := s.wait(id, time.Minute); ev.State != "finished" {
		t.Fatalf("job %s: %v", ev.State, ev.Failures)
	}
}
