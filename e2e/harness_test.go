// Package e2e runs Sluice end to end: every service on a real embedded NATS
// JetStream server, real files, real HTTP servers.
package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/httpstore"
	"github.com/sluice-dtr/sluice/pkg/job"
	"github.com/sluice-dtr/sluice/services/delivery"
	"github.com/sluice-dtr/sluice/services/generator"
	"github.com/sluice-dtr/sluice/services/processor"
	"github.com/sluice-dtr/sluice/services/scheduler"
)

// testConfig is the services' configuration for tests: ARC's defaults with
// short retry delays, and checkpoints soon after every change, so that a
// state that holds still holds still in the sluice_dtrs bucket too. The
// tests' storage servers are on loopback, which transfers reach only when
// allowed.
func testConfig() app.Config {
	return app.Config{
		AllowNetworks: []string{"127.0.0.0/8"},
		Config: scheduler.Config{
			MaxProcessor: 10, MaxDelivery: 10, MaxEmergency: 1, MaxTransferTries: 10,
			RetryBase: 100 * time.Millisecond, Lease: time.Minute, Tick: 20 * time.Millisecond,
			CheckpointEvery: 20 * time.Millisecond, ChainPreClean: true, // SLUICE_CHAIN_PRECLEAN's default
			RestoreHeads: scheduler.DefaultRestoreHeads,
		},
		Generator: generator.Config{MaxFiles: 10000},
		Processor: processor.Config{PreWorkers: 10, PostWorkers: 10},
		Delivery:  delivery.Config{Workers: 10},
	}
}

// system is a running Sluice for one test.
type system struct {
	t  testing.TB
	ns *server.Server
	nc *nats.Conn
	// user, if set, is the NATS user whose own subjects requests go to.
	user string
	js   jetstream.JetStream
	cfg  app.Config
	dir  string
	stop map[string]func() // stops a role and waits until it has
	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error
}

// start runs an embedded NATS server and the given roles (all of them if
// none is named).
func start(t testing.TB, cfg app.Config, roles ...string) *system {
	t.Helper()
	return startMode(t, cfg, false, roles...)
}

// startMode is start with the services connected in process or not.
func startMode(t testing.TB, cfg app.Config, inProcess bool, roles ...string) *system {
	t.Helper()
	dir := t.TempDir()
	ns, err := bus.Embedded(filepath.Join(dir, "jetstream"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if inProcess {
		cfg.InProcess = ns
	}
	return startOn(t, ns, dir, cfg, roles...)
}

// startOn runs the given roles (all of them if none is named) on a running
// NATS server, which it shuts down when the test ends.
func startOn(t testing.TB, ns *server.Server, dir string, cfg app.Config, roles ...string) *system {
	t.Helper()
	cfg.NATSURL = ns.ClientURL()
	s := &system{t: t, ns: ns, cfg: cfg, dir: dir, stop: map[string]func(){}}
	var err error
	s.nc, err = app.Connect(cfg.NATSURL, "e2e-test")
	if err != nil {
		t.Fatal(err)
	}
	s.js, _ = jetstream.New(s.nc)
	if len(roles) == 0 {
		roles = app.Roles
	}
	for _, r := range roles {
		s.startRole(r)
	}
	t.Cleanup(func() {
		for _, cancel := range s.stop {
			cancel()
		}
		s.wg.Wait()
		s.nc.Close()
		ns.Shutdown()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, err := range s.errs {
			t.Errorf("service failed: %v", err)
		}
	})
	return s
}

// startRole runs one role under its own context.
func (s *system) startRole(role string) {
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	s.stop[role] = func() { cancel(); <-stopped }
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(stopped)
		if err := app.Run(ctx, s.cfg, []string{role}, log); err != nil && ctx.Err() == nil {
			s.mu.Lock()
			s.errs = append(s.errs, err)
			s.mu.Unlock()
		}
	}()
}

// stopRole stops one role and waits until it has.
func (s *system) stopRole(role string) {
	s.stop[role]()
	delete(s.stop, role)
}

// request calls a Sluice API endpoint, retrying while its service starts.
func (s *system) request(subject string, data []byte, h nats.Header, v any) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := nats.NewMsg(api.UserSubject(subject, s.user))
		m.Data = data
		for k, vs := range h {
			m.Header[k] = vs
		}
		reply, err := s.nc.RequestMsg(m, 10*time.Second)
		if errors.Is(err, nats.ErrNoResponders) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err != nil {
			return err
		}
		if e := reply.Header.Get(micro.ErrorHeader); e != "" {
			return errors.New(e)
		}
		return json.Unmarshal(reply.Data, v)
	}
}

// submit sends a job to the generator.
func (s *system) submit(j *job.Job) api.SubmitReply {
	s.t.Helper()
	b, err := json.Marshal(j)
	if err != nil {
		s.t.Fatal(err)
	}
	var r api.SubmitReply
	if err := s.request(api.SubjectJobSubmit, b, nil, &r); err != nil {
		s.t.Fatalf("submit: %v", err)
	}
	return r
}

// wait polls a job until it has ended.
func (s *system) wait(jobID string, timeout time.Duration) api.JobEvent {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var ev api.JobEvent
		if err := s.request(api.SubjectJobStatus, []byte(jobID), nil, &ev); err != nil {
			s.t.Fatalf("status of %s: %v", jobID, err)
		}
		if ev.Announced {
			return ev
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("job %s not finished after %s: %d of %d final", jobID, timeout, ev.Final(), ev.Total)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// shares asks the scheduler for its share table.
func (s *system) shares() api.SharesReply {
	s.t.Helper()
	var r api.SharesReply
	if err := s.request(api.SubjectShares, nil, nil, &r); err != nil {
		s.t.Fatal(err)
	}
	return r
}

// httpServer serves h on a loopback port for the test.
func httpServer(t testing.TB, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

func fileURL(p string) string { return "file://" + filepath.ToSlash(p) }

// writeFile writes n bytes of a pattern that differs per file.
func writeFile(t testing.TB, p string, n int, seed int) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((i*31 + seed*7 + i/251) % 256)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustContain(t *testing.T, what, s string, subs ...string) {
	t.Helper()
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			t.Fatalf("%s %q does not mention %q", what, s, sub)
		}
	}
}

// countingStore serves the files under dir over HTTP and counts the GETs
// of each path.
func countingStore(t testing.TB, dir string) (base string, gets func(path string) int) {
	var mu sync.Mutex
	n := map[string]int{}
	store := httpstore.Handler(dir)
	base = httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			mu.Lock()
			n[r.URL.Path]++
			mu.Unlock()
		}
		store.ServeHTTP(w, r)
	}))
	return base, func(path string) int {
		mu.Lock()
		defer mu.Unlock()
		return n[path]
	}
}

// heldStore serves the files under dir over HTTP, holding every GET until
// release is called (at the latest when the test ends): transfers that
// stay running while the test looks.
func heldStore(t testing.TB, dir string) (base string, release func()) {
	held := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(held) }) }
	t.Cleanup(release)
	store := httpstore.Handler(dir)
	base = httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			select {
			case <-held:
			case <-r.Context().Done():
				return
			}
		}
		store.ServeHTTP(w, r)
	}))
	return base, release
}
