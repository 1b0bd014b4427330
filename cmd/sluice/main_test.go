package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/kelseyhightower/envconfig"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/checksum"
)

func TestFlagsWinOverEnvironmentWhichWinsOverDefaults(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want int
	}{
		{"the built-in default", nil, nil, 10},
		{"the environment over the default", map[string]string{"SLUICE_MAXDELIVERY": "7"}, nil, 7},
		{"a flag over the environment", map[string]string{"SLUICE_MAXDELIVERY": "7"}, []string{"--maxdelivery", "9"}, 9},
		{"a flag over the default", nil, []string{"--maxdelivery=3"}, 3},
		{"a single-dash long flag, as Go's flag package took it", nil, []string{"-maxdelivery=4"}, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var cfg Config
			if err := envconfig.Process("sluice", &cfg); err != nil {
				t.Fatal(err)
			}
			root := newRoot(&cfg, nil, io.Discard)
			args := longFlags(root, append([]string{"scheduler"}, tt.args...))
			c, _, err := root.Find(args)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.ParseFlags(args[1:]); err != nil {
				t.Fatal(err)
			}
			if cfg.MaxDelivery != tt.want {
				t.Fatalf("maxdelivery = %d, want %d", cfg.MaxDelivery, tt.want)
			}
		})
	}
}

func TestHelpOfOneGroupListsOnlyItsVariables(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"help", "processor"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "Run a processor") || !strings.Contains(out.String(), "Processor [sluice help processor]:") ||
		!strings.Contains(out.String(), "SLUICE_PROCESSOR_PRE_WORKERS") || strings.Contains(out.String(), "SLUICE_MAXDELIVERY") {
		t.Fatalf("sluice help processor printed\n%s", out.String())
	}
	out.Reset()
	if err := run([]string{"help", "policies"}, &out); err != nil || !strings.HasPrefix(out.String(), "Fair-share policies (read by the scheduler) [sluice help policies]:") ||
		strings.Contains(out.String(), "SLUICE_PROCESSOR_PRE_WORKERS") {
		t.Fatalf("sluice help policies: %v\n%s", err, out.String())
	}
	err := run([]string{"help", "nonsense"}, &bytes.Buffer{})
	if err == nil || exitCode(err) != exitUsage {
		t.Fatalf("sluice help nonsense: %v (exit %d), want a usage error", err, exitCode(err))
	}
}

func TestNATSURLComesFromTheUnprefixedVariable(t *testing.T) {
	t.Setenv("NATS_URL", "nats://elsewhere:4222")
	var cfg Config
	if err := envconfig.Process("sluice", &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.NATSURL != "nats://elsewhere:4222" {
		t.Fatalf("NATS URL = %q", cfg.NATSURL)
	}
}

func TestHelpListsCommandsAndVariables(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"help"}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\n  all ", "\n  demo ", "\n  shares ", "\n  cp ", "Scheduler [sluice help scheduler]:", "Delivery [sluice help delivery]:", "SLUICE_MAXDELIVERY", "SLUICE_SHAREPOLICY", "NATS_URL", "SLUICE_DELIVERY_WORKERS", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME",
		"SLUICE_NATS_CREDS", "SLUICE_NATS_NKEY", "SLUICE_NATS_INBOX_PREFIX", "SLUICE_NATS_TLS_CA", "SLUICE_NATS_TLS_CERT", "SLUICE_NATS_TLS_KEY",
		"NATS_CONTEXT", "--context", "SLUICE_HTTP_TLS_CERT", "SLUICE_HTTP_TLS_KEY"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help does not mention %s", want)
		}
	}
}

func TestBadConfigurationIsRefusedWithTheReason(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"SLUICE_SHAREPOLICY": "voms:colour"}, "share policy"},
		{map[string]string{"SLUICE_SHAREPRIORITY": "atlas=200"}, "1–100"},
		{map[string]string{"SLUICE_MAXDELIVERY": "many"}, "MAXDELIVERY"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			t.Setenv("SLUICE_HTTP_ADDR", "127.0.0.1:0")
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			err := run([]string{"scheduler", "-nats", "nats://127.0.0.1:1"}, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}

func TestUnknownCommandIsAnError(t *testing.T) {
	err := run([]string{"fly"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), `unknown command "fly"`) || exitCode(err) != exitUsage {
		t.Fatalf("got %v (exit %d)", err, exitCode(err))
	}
}

func TestSimulateComparesPoliciesOnAWorkloadAndDrawsThem(t *testing.T) {
	dir := t.TempDir()
	work := filepath.Join(dir, "work.csv")
	csv := "at,dn,fqan,bytes\n" + strings.Repeat("0,/CN=a,/atlas,1000000000\n0,/CN=c,/cms,1000000000\n", 30)
	if err := os.WriteFile(work, []byte(csv), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SLUICE_SHAREPOLICY", "voms:vo")
	t.Setenv("SLUICE_SAM_GROUPS", "atlas=1,cms=1")
	svg := filepath.Join(dir, "out.svg")
	var out bytes.Buffer
	if err := run([]string{"simulate", "-policies", "arc,sam", "-slots", "4", "-svg", svg, work}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"policy arc:", "policy sam:", "atlas", "cms", "wrote " + svg} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if b, err := os.ReadFile(svg); err != nil || !bytes.Contains(b, []byte("<svg")) {
		t.Errorf("no SVG written: %v", err)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"simulate"}, "give one workload file, or --example"},
		{[]string{"simulate", "-policies", "fifo", work}, `policy "fifo"`},
		{[]string{"simulate", filepath.Join(dir, "missing.csv")}, "no such file"},
	} {
		if err := run(bad.args, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: error %v, want %q", bad.args, err, bad.want)
		}
	}
}

func TestHealthcheckURLComesFromTheListenAddress(t *testing.T) {
	for _, tt := range []struct{ addr, want, err string }{
		{":8080", "http://127.0.0.1:8080/healthz", ""},
		{"0.0.0.0:9000", "http://127.0.0.1:9000/healthz", ""},
		{"10.0.0.5:8080", "http://10.0.0.5:8080/healthz", ""},
		{"[::1]:8080", "http://[::1]:8080/healthz", ""},
		{"", "", "serves no /healthz"},
		{"8080", "", "SLUICE_HTTP_ADDR"},
	} {
		got, err := healthURL(tt.addr)
		if got != tt.want || (err == nil) != (tt.err == "") || err != nil && !strings.Contains(err.Error(), tt.err) {
			t.Errorf("healthURL(%q) = %q, %v; want %q, an error mentioning %q", tt.addr, got, err, tt.want, tt.err)
		}
	}
}

func TestHealthcheckExitsNonZeroUnlessTheProcessSaysOK(t *testing.T) {
	for _, tt := range []struct {
		name string
		code int
		ok   bool
	}{{"healthy", http.StatusOK, true}, {"a role down", http.StatusServiceUnavailable, false}} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.code)
				fmt.Fprint(w, `{"ok":false}`)
			}))
			defer srv.Close()
			var out bytes.Buffer
			err := run([]string{"healthcheck", "-url", srv.URL + "/healthz"}, &out)
			if (err == nil) != tt.ok {
				t.Fatalf("healthcheck of a %d answer: %v", tt.code, err)
			}
			if !strings.Contains(out.String(), `"ok"`) {
				t.Fatalf("healthcheck printed %q, want the answer", out.String())
			}
		})
	}
	if err := run([]string{"healthcheck", "-url", "http://127.0.0.1:1/healthz", "-timeout", "1s"}, &bytes.Buffer{}); err == nil {
		t.Fatal("healthcheck of a closed port succeeded")
	}
}

func TestOnlySluiceVariablesAndNATSURLUserAndPasswordAreRead(t *testing.T) {
	// Kubernetes sets NATS_PORT=tcp://... for a Service named nats; other
	// software sets WORKERS or LEASE. None of them is Sluice's.
	t.Setenv("NATS_PORT", "tcp://10.96.0.12:4222")
	t.Setenv("WORKERS", "1")
	t.Setenv("LEASE", "1s")
	t.Setenv("NATS_USER", "alice")
	t.Setenv("SLUICE_MAXDELIVERY", "7")
	var out bytes.Buffer
	if err := run([]string{"help"}, &out); err != nil {
		t.Fatalf("sluice help: %v", err)
	}
	var cfg Config
	if err := processEnv(&cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Delivery.Workers == 1 || cfg.Lease == time.Second {
		t.Fatalf("WORKERS and LEASE were read as SLUICE_DELIVERY_WORKERS=%d and SLUICE_LEASE=%s", cfg.Delivery.Workers, cfg.Lease)
	}
	if cfg.NATSUser != "alice" || cfg.MaxDelivery != 7 {
		t.Fatalf("NATS_USER %q, SLUICE_MAXDELIVERY %d; want alice and 7", cfg.NATSUser, cfg.MaxDelivery)
	}
	if v, _ := os.LookupEnv("WORKERS"); v != "1" {
		t.Fatalf("WORKERS is now %q: the environment was not restored", v)
	}
}

func TestCancelSaysWhetherItCancelledAnything(t *testing.T) {
	ns, err := bus.Embedded(filepath.Join(t.TempDir(), "js"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	t.Setenv("SLUICE_NATS_URL", ns.ClientURL())
	var cfg Config
	if err := processEnv(&cfg); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, cfg, []string{"scheduler"}, slog.New(slog.DiscardHandler)) }()
	defer func() { stop(); <-done }()
	// A DTR that stays queued: no workers run.
	id := uuid.New()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	for {
		_, err := js.Publish(ctx, api.SubjectSubmit, fmt.Appendf(nil, `{"id":%q,"source":"file:///a","destination":"file:///b"}`, id))
		if err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond) // the scheduler is still making its streams
	}
	tests := []struct {
		name    string
		id      string
		wantOut string
		wantErr string
	}{
		{"a DTR the scheduler holds", id.String(), "DTR " + id.String() + " cancelled", ""},
		{"an id nobody knows", uuid.NewString(), "", "nothing cancelled"},
		{"a job with nothing left to cancel", "reco-42", "", "nothing cancelled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			var err error
			for range 100 { // the DTR may not be taken in yet
				out.Reset()
				if err = run([]string{"cancel", tt.id}, &out); tt.wantErr != "" || err == nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !strings.Contains(out.String(), tt.wantOut) {
				t.Fatalf("printed %q (%v), want %q", out.String(), err, tt.wantOut)
			}
		})
	}
}

func TestSubmitWaitShowsARetryingDTRThenAChecksumMismatchTwiceFailsNamingBothValues(t *testing.T) {
	ns, err := bus.Embedded(filepath.Join(t.TempDir(), "js"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	t.Setenv("SLUICE_NATS_URL", ns.ClientURL())
	t.Setenv("SLUICE_RETRY_BASE", "6s")      // the retry waits 6 s: --wait asks every 250 ms, far slower on a loaded machine
	t.Setenv("SLUICE_MAXTRANSFERTRIES", "3") // more than the 2 a mismatch may take
	t.Setenv("SLUICE_TICK", "20ms")
	var cfg Config
	if err := processEnv(&cfg); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- app.Run(ctx, cfg, []string{"scheduler", "generator", "processor", "delivery"}, slog.New(slog.DiscardHandler))
	}()
	defer func() { stop(); <-done }()
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "out", "dst")
	if err := os.WriteFile(src, []byte("the bytes of a file whose stated checksum is wrong"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := checksum.File(src, "adler32")
	if err != nil {
		t.Fatal(err)
	}
	const want = "adler32:0a1b2c3d"
	jobFile := filepath.Join(dir, "job.json")
	job := fmt.Sprintf(`{"id":"wrong-sum","inputs":[{"source":"file://%s","destination":"file://%s","checksum":%q}]}`, src, dst, want)
	if err := os.WriteFile(jobFile, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	// The retry watch asks the scheduler's API, which may start after
	// the generator's: one that gets no answer waits 30 s to ask again.
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for range 100 {
		if _, err := nc.Request(api.SubjectRetrying, []byte("wrong-sum"), time.Second); !errors.Is(err, nats.ErrNoResponders) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	var out bytes.Buffer
	for range 100 { // the services may still be starting
		out.Reset()
		err = run([]string{"submit", "--wait", jobFile}, &out)
		// Submitted, it is followed to its end: submitting again would
		// follow the job from wherever it is by then.
		if strings.Contains(out.String(), "submitted") || err == nil || !strings.Contains(err.Error(), "no service answers") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err == nil || !strings.Contains(err.Error(), "job wrong-sum failed") || exitCode(err) != exitJobEnded {
		t.Fatalf("submit --wait returned %v (exit %d), want the job failed, exit 3; printed:\n%s", err, exitCode(err), out.String())
	}
	var retries []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "retrying ") {
			retries = append(retries, l)
		}
	}
	wantRetry := fmt.Sprintf("retrying file://%s: attempt 1 of 3 failed: TRANSFER_SPEED: verify file://%s: checksum mismatch: expected %s, got %s; next try at ",
		dst, dst, want, got)
	if len(retries) != 1 || !strings.HasPrefix(retries[0], wantRetry) {
		t.Fatalf("retry lines %q, want one starting %q; printed:\n%s", retries, wantRetry, out.String())
	}
	twice := fmt.Sprintf("PERMANENT_REMOTE: checksum mismatch: expected %s, got %s (twice: the source or its stated checksum is wrong)", want, got)
	if !strings.Contains(out.String(), twice) {
		t.Fatalf("printed\n%s\nwant the error %q", out.String(), twice)
	}
	var tries string
	for _, l := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[2] == "ERROR" {
			tries = f[4]
		}
	}
	if tries != "2" {
		t.Fatalf("the file's line says %q tries, want 2; printed:\n%s", tries, out.String())
	}
	if _, err := os.Stat(dst); err == nil {
		t.Fatal("the destination exists")
	}
}

func TestABenchReportKeepsTheSectionsOtherCommandsMeasured(t *testing.T) {
	p := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	kept := keptHeading + "\n### The fault gauntlet\n\n6 faults, 0 lost\n"
	cases := map[string]string{"no report yet": "", "a report without them": "# Benchmarks\n| a | b |\n", "a report with them": "# Benchmarks\n" + kept}
	for name, old := range cases {
		if old != "" {
			if err := os.WriteFile(p, []byte(old), 0o644); err != nil {
				t.Fatal(err)
			}
		} else {
			os.Remove(p)
		}
		want := ""
		if strings.Contains(old, keptHeading) {
			want = kept
		}
		if got := keptSections(p); got != want {
			t.Errorf("%s: kept %q, want %q", name, got, want)
		}
	}
}

// runningSluice runs every role on an embedded NATS server until the test
// ends, with the environment env, and points the client commands at it.
func runningSluice(t *testing.T, env map[string]string) {
	t.Helper()
	ns, err := bus.Embedded(filepath.Join(t.TempDir(), "js"), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	t.Setenv("SLUICE_NATS_URL", ns.ClientURL())
	t.Setenv("SLUICE_TICK", "20ms")
	for k, v := range env {
		t.Setenv(k, v)
	}
	var cfg Config
	if err := processEnv(&cfg); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// As sluice all runs: traced (ids on every DTR, nothing exported).
	go func() {
		done <- traced(ctx, "all", func() error { return app.Run(ctx, cfg, app.Roles, slog.New(slog.DiscardHandler)) })
	}()
	t.Cleanup(func() { stop(); <-done })
}

// runAnswered runs a client command until a service answers it (the
// services may still be starting).
func runAnswered(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	var err error
	for range 100 {
		out.Reset()
		err = run(args, &out)
		if err == nil || !strings.Contains(err.Error(), "no service answers") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return out.String(), err
}

// TestMain keeps the client commands of the tests from the nats contexts
// of whoever runs them: an empty XDG_CONFIG_HOME, no NATS_CONTEXT.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-test-config-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("XDG_CONFIG_HOME", dir)
	os.Unsetenv("NATS_CONTEXT")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
