package e2e

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// serveRoles runs roles in one process, as `sluice all` does, with its
// HTTP server on a free port; stop ends them and returns their error.
func serveRoles(t *testing.T, cfg app.Config, roles ...string) (base string, exited <-chan error, stop func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.HTTP = ln
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	go func() { done <- app.Run(ctx, cfg, roles, log) }()
	var once bool
	var last error
	stop = func() error {
		if !once {
			once = true
			cancel()
			last = <-done
		}
		return last
	}
	t.Cleanup(func() { _ = stop() })
	return "http://" + ln.Addr().String(), done, stop
}

// healthOf reads /healthz until cond holds, for up to timeout.
func healthOf(t *testing.T, base string, timeout time.Duration, cond func(int, app.Health) bool) app.Health {
	t.Helper()
	var h app.Health
	var code int
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		h = app.Health{}
		code = getJSON(t, base+"/healthz", &h)
		if cond(code, h) {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz %d %+v after %s", code, h, timeout)
		}
	}
}

// TestAFullStoreStopsNoRoleAndEveryAcceptedDTRFinishesOnceSpaceReturns:
// on a NATS server whose JetStream store holds 4 MiB, a job is accepted
// while the scheduler is down, and then a filler stream takes the rest of
// the store. A second job is refused with 503 store full and leaves no
// record; a plain publish to dtr.submit gets JetStream's own refusal. The
// scheduler starts on the full store (where it crash-looped), does not
// exit, answers queries, and its /healthz and sluice_store_full say the
// store is full and why. Once the filler is deleted every DTR of the
// accepted job ends DONE exactly once, health is OK again, and the
// refused job, submitted again, runs.
func TestAFullStoreStopsNoRoleAndEveryAcceptedDTRFinishesOnceSpaceReturns(t *testing.T) {
	dir := t.TempDir()
	ns, err := bus.EmbeddedWith(filepath.Join(dir, "jetstream"), 0, func(o *server.Options) { o.JetStreamMaxStore = 4 << 20 })
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	s := startOn(t, ns, dir, cfg, "generator")
	cfg.NATSURL = ns.ClientURL()
	ctx := context.Background()

	// The scheduler sets the streams up, then is down while a job comes.
	base, _, stop := serveRoles(t, cfg, "scheduler")
	healthOf(t, base, 10*time.Second, func(code int, h app.Health) bool { return code == http.StatusOK && h.OK })
	if err := stop(); err != nil {
		t.Fatalf("roles stopped with %v", err)
	}
	const files = 30
	mkjob := func(name string) *job.Job {
		j := &job.Job{}
		for i := range files {
			src := filepath.Join(dir, name, "in", fmt.Sprint(i))
			writeFile(t, src, 2000+i, i)
			j.Inputs = append(j.Inputs, job.File{Source: fileURL(src), Destination: fileURL(filepath.Join(dir, name, "out", fmt.Sprint(i)))})
		}
		return j
	}
	accepted := s.submit(mkjob("a"))

	// A filler takes the rest of the store.
	filler, err := s.js.CreateStream(ctx, jetstream.StreamConfig{Name: "FILLER", Subjects: []string{"filler"}})
	if err != nil {
		t.Fatal(err)
	}
	var refusal error
	for i := 0; refusal == nil; i++ {
		if i > 1000 {
			t.Fatal("the 4 MiB store took 1000 messages of 16 KiB")
		}
		_, refusal = s.js.Publish(ctx, "filler", make([]byte, 16<<10))
	}
	if !bus.StoreFull(refusal) {
		t.Fatalf("the filler was refused with %v, not for want of space", refusal)
	}

	// A new job is refused whole, with a clear answer.
	refused := mkjob("b")
	refused.ID = "refused-for-want-of-space"
	b, err := codec.EncodeJSON(refused)
	if err != nil {
		t.Fatal(err)
	}
	var reply any
	err = s.request(api.SubjectJobSubmit, b, nil, &reply)
	if err == nil || !strings.Contains(err.Error(), "store full: JetStream has no space for new work (insufficient resources); try again later") {
		t.Fatalf("a job submitted to a full store: %v", err)
	}
	if err := s.request(api.SubjectJobStatus, []byte(refused.ID), nil, &reply); err == nil || !strings.Contains(err.Error(), "unknown job") {
		t.Fatalf("the refused job left something behind: status %v", err)
	}
	// A plain publisher gets JetStream's own refusal.
	if _, err := s.js.Publish(ctx, api.SubjectSubmit, []byte(`{}`)); !bus.StoreFull(err) {
		t.Fatalf("a plain publish to dtr.submit on a full store: %v", err)
	}

	// The scheduler starts on the full store: it stays up and says why
	// it is not healthy.
	base, exited, _ := serveRoles(t, cfg, "scheduler", "processor", "delivery")
	h := healthOf(t, base, 20*time.Second, func(code int, h app.Health) bool {
		return code == http.StatusServiceUnavailable && strings.Contains(h.Roles["scheduler"].Detail, "store full")
	})
	if d := h.Roles["scheduler"].Detail; !strings.Contains(d, "insufficient resources") {
		t.Fatalf("scheduler's health detail %q does not say why", d)
	}
	if m := scrape(t, base+"/metrics"); m[`sluice_store_full{role="scheduler"}`] != 1 || m[`sluice_store_full{role="delivery"}`] != 0 {
		t.Fatalf("sluice_store_full: scheduler %v, delivery %v; want 1 and 0",
			m[`sluice_store_full{role="scheduler"}`], m[`sluice_store_full{role="delivery"}`])
	}
	// Held a while longer, several tries: no role exits, queries are
	// answered.
	select {
	case err := <-exited:
		t.Fatalf("the roles exited on a full store: %v", err)
	case <-time.After(3 * time.Second):
	}
	s.shares()

	freed := time.Now()
	if err := s.js.DeleteStream(ctx, filler.CachedInfo().Config.Name); err != nil {
		t.Fatal(err)
	}
	ev := s.wait(accepted.JobID, time.Minute)
	finished := time.Since(freed)
	if ev.Done != files || ev.Failed+ev.Cancelled != 0 {
		t.Fatalf("accepted job ended with %d done, %d failed, %d cancelled; want %d done", ev.Done, ev.Failed, ev.Cancelled, files)
	}
	for i := range files {
		want, _ := os.ReadFile(filepath.Join(dir, "a", "in", fmt.Sprint(i)))
		got, err := os.ReadFile(filepath.Join(dir, "a", "out", fmt.Sprint(i)))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("file %d: %v, %d bytes of %d", i, err, len(got), len(want))
		}
	}
	healthOf(t, base, 20*time.Second, func(code int, h app.Health) bool { return code == http.StatusOK && h.OK })
	healthy := time.Since(freed)
	// Each DTR ended once: the scheduler counted 30 finals, no more.
	time.Sleep(1100 * time.Millisecond) // its figures are sampled every second
	m := scrape(t, base+"/metrics")
	if n := m[`sluice_scheduler_finished_total{outcome="done"}`]; n != files {
		t.Fatalf("the scheduler finished %v DTRs, want each of the %d once", n, files)
	}
	if m[`sluice_store_full{role="scheduler"}`] != 0 {
		t.Fatal("sluice_store_full still 1 for the scheduler")
	}
	t.Logf("space returned: job done after %s, healthy after %s", finished.Round(time.Millisecond), healthy.Round(time.Millisecond))

	// The refused job, submitted again, runs.
	again := s.submit(refused)
	if ev := s.wait(again.JobID, time.Minute); ev.Done != files {
		t.Fatalf("the job submitted again: %d of %d done", ev.Done, files)
	}
	select {
	case err := <-exited:
		t.Fatalf("the roles exited: %v", err)
	default:
	}
}
