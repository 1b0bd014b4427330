package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus/bustest"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/worker"
)

func TestAWorkerIsSilentOnceThreeOfItsHeartbeatsAreMissed(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 1, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		every  time.Duration // the worker's own interval (0: unsaid)
		after  time.Duration // since its last heartbeat
		silent bool
	}{
		{"heard a moment ago", time.Second, 100 * time.Millisecond, false},
		{"two heartbeats missed", time.Second, 2500 * time.Millisecond, false},
		{"three heartbeats missed", time.Second, 3100 * time.Millisecond, true},
		{"its own interval, longer than the scheduler's", 10 * time.Second, 20 * time.Second, false},
		{"the scheduler's interval when it says none", 0, 16 * time.Second, true},
		{"the scheduler's interval, not yet three missed", 0, 14 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorkerTracker(5*time.Second, time.Minute)
			w.heard(api.Heartbeat{Worker: "w1", Role: "delivery", Stage: dtr.StageDelivery, Host: "h", PID: 7,
				IntervalSeconds: tt.every.Seconds(), Grants: []api.HeldGrant{{DTR: uuid.New(), Grant: "g1"}}}, t0)
			ws := w.list(t0.Add(tt.after))
			if len(ws) != 1 || ws[0].Silent != tt.silent {
				t.Fatalf("workers %+v, want one, silent %v", ws, tt.silent)
			}
			if h := w.holders(t0.Add(tt.after))["g1"].holder; h.Worker != "w1" || h.Silent != tt.silent || !h.LastHeartbeat.Equal(t0) {
				t.Fatalf("holder of g1 %+v", h)
			}
			if h, ok := w.holderOf("g1", t0.Add(tt.after)); !ok || h != w.holders(t0.Add(tt.after))["g1"].holder {
				t.Fatalf("holderOf g1 %+v (%v)", h, ok)
			}
			if _, ok := w.holderOf("g2", t0.Add(tt.after)); ok {
				t.Fatal("a holder for a grant nobody claims")
			}
		})
	}
}

func TestNoWorkerIsSilentForHeartbeatsTheSchedulerCouldNotHear(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 1, 0, 0, 0, time.UTC)
	w := newWorkerTracker(time.Second, time.Minute)
	w.heard(api.Heartbeat{Worker: "a", Stage: dtr.StageDelivery, IntervalSeconds: 1}, t0)
	// The scheduler's connection is down from 1 s to 10 s.
	for d := time.Second; d <= 10*time.Second; d += time.Second {
		w.deafAt(t0.Add(d))
	}
	if ws := w.list(t0.Add(12 * time.Second)); ws[0].Silent {
		t.Fatal("silent 2 s after the scheduler could hear again")
	}
	if ws := w.list(t0.Add(13500 * time.Millisecond)); !ws[0].Silent {
		t.Fatal("not silent 3.5 s after the scheduler could hear again")
	}
}

func TestTheTrackerForgetsAStoppingWorkerAndLearnsGrantsFromRenewals(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 1, 0, 0, 0, time.UTC)
	w := newWorkerTracker(time.Second, time.Minute)
	d1, d2 := uuid.New(), uuid.New()
	// A processor's two pools share its id.
	w.heard(api.Heartbeat{Worker: "a", Role: "processor", Stage: dtr.StagePre, IntervalSeconds: 1, Grants: []api.HeldGrant{{DTR: d1, Grant: "g1"}}}, t0)
	w.heard(api.Heartbeat{Worker: "a", Role: "processor", Stage: dtr.StagePost, IntervalSeconds: 1}, t0)
	w.heard(api.Heartbeat{Worker: "b", Role: "delivery", Stage: dtr.StageDelivery, IntervalSeconds: 1}, t0)
	if ws := w.list(t0); len(ws) != 3 {
		t.Fatalf("workers %+v, want a's two pools and b", ws)
	}
	// A renewal names a grant that a's last heartbeat did not; one that
	// names an unknown worker is no news.
	w.renewed(dtr.StagePre, api.Progress{DTR: d2, Grant: "g2", Worker: "a"})
	w.renewed(dtr.StagePre, api.Progress{DTR: uuid.New(), Grant: "g3", Worker: "nobody"})
	hs := w.holders(t0)
	if hs["g2"].holder.Worker != "a" || hs["g2"].holder.Stage != dtr.StagePre || hs["g2"].dtr != d2 || hs["g1"].holder.Worker != "a" || len(hs) != 2 {
		t.Fatalf("holders %+v", hs)
	}
	// The next heartbeat says all again; a stopping pool is forgotten.
	w.heard(api.Heartbeat{Worker: "a", Role: "processor", Stage: dtr.StagePre, IntervalSeconds: 1, Grants: []api.HeldGrant{{DTR: d2, Grant: "g2"}}}, t0.Add(time.Second))
	w.heard(api.Heartbeat{Worker: "a", Stage: dtr.StagePost, Stopping: true}, t0.Add(time.Second))
	w.heard(api.Heartbeat{Worker: "b", Stage: dtr.StageDelivery, Stopping: true}, t0.Add(time.Second))
	if hs := w.holders(t0.Add(time.Second)); len(hs) != 1 || hs["g2"].holder.Worker != "a" {
		t.Fatalf("holders %+v", hs)
	}
	if ws := w.list(t0.Add(time.Second)); len(ws) != 1 || ws[0].ID != "a" || ws[0].Stage != dtr.StagePre {
		t.Fatalf("workers %+v", ws)
	}
	// A worker silent for longer than any lease is forgotten, also when
	// no other worker is heard from.
	if ws := w.list(t0.Add(11 * time.Minute)); len(ws) != 0 {
		t.Fatalf("workers %+v 11 minutes after the last heartbeat, want none", ws)
	}
	w.heard(api.Heartbeat{Worker: "c", IntervalSeconds: 1}, t0.Add(11*time.Minute))
	if ws := w.list(t0.Add(11 * time.Minute)); len(ws) != 1 || ws[0].ID != "c" {
		t.Fatalf("workers %+v", ws)
	}
}

// The host in a heartbeat is written into dtr.state and shown to
// operators: one that is not a plain host name or address is taken as
// unknown, and reported once per worker.
func TestAHeartbeatsHostThatIsNotAPlainHostNameIsTakenAsUnknown(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 1, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		host, want string
	}{
		{"dt1.example.org", "dt1.example.org"},
		{"10.0.0.7", "10.0.0.7"},
		{"fe80::1", "fe80::1"},
		{"node_3-a", "node_3-a"},
		{strings.Repeat("a", 253), strings.Repeat("a", 253)},
		{"", ""},
		{strings.Repeat("a", 254), ""},
		{"dt1.example.org\nc3e12bfa-ba9a-4a45-be73-0b3b2a206e1c TRANSFER 100 x", ""},
		{"dt1 example", ""},
		{"dt1.example.org\r", ""},
		{"dt1\u2028", ""},
		{"höst", ""},
		{"host;rm", ""},
		{"host/x", ""},
	} {
		t.Run(fmt.Sprintf("%q", tt.host), func(t *testing.T) {
			w := newWorkerTracker(time.Second, time.Minute)
			hb := api.Heartbeat{Worker: "d", Role: "delivery", Stage: dtr.StageDelivery, Host: tt.host, IntervalSeconds: 1,
				Grants: []api.HeldGrant{{DTR: uuid.New(), Grant: "g1"}}}
			reported := w.heard(hb, t0)
			if ws := w.list(t0); len(ws) != 1 || ws[0].Host != tt.want {
				t.Fatalf("workers %+v, want one with host %q", ws, tt.want)
			}
			if h := w.holders(t0)["g1"].holder.Host; h != tt.want {
				t.Fatalf("the grant's holder has host %q, want %q", h, tt.want)
			}
			bad := tt.host != "" && tt.want == ""
			if (reported != "") != bad || (bad && reported != tt.host) {
				t.Fatalf("heard reported %q, want %q", reported, map[bool]string{true: tt.host}[bad])
			}
			if again := w.heard(hb, t0.Add(time.Second)); again != "" {
				t.Fatalf("the same worker's next heartbeat reported %q again, want it reported once", again)
			}
		})
	}
}

// ask sends a request to the scheduler and decodes its answer.
func ask(t *testing.T, nc *nats.Conn, subject string, data []byte, v any) {
	t.Helper()
	if err := tryAsk(nc, subject, data, v); err != nil {
		t.Fatal(err)
	}
}

func tryAsk(nc *nats.Conn, subject string, data []byte, v any) error {
	m, err := nc.Request(subject, data, 5*time.Second)
	if err != nil {
		return fmt.Errorf("%s: %w", subject, err)
	}
	if e := m.Header.Get(micro.ErrorHeader); e != "" {
		return fmt.Errorf("%s: %s %s", subject, m.Header.Get(micro.ErrorCodeHeader), e)
	}
	return json.Unmarshal(m.Data, v)
}

// eventually retries check every 50 ms for 20 s, and fails with its last
// complaint.
func eventually(t *testing.T, check func() string) {
	t.Helper()
	var why string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if why = check(); why == "" {
			return
		}
	}
	t.Fatal(why)
}

func TestADeliveryPoolThatStopsHeartbeatingIsSilentAndItsGrantsAreMarked(t *testing.T) {
	nc, js := bustest.Server(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	const beat = 100 * time.Millisecond
	s, err := New(Config{MaxProcessor: 10, MaxDelivery: 10, MaxEmergency: 1, MaxTransferTries: 3, RetryBase: time.Second,
		Lease: time.Minute, Tick: 20 * time.Millisecond, CheckpointEvery: 50 * time.Millisecond, Heartbeat: beat}, nc, quiet())
	if err != nil {
		t.Fatal(err)
	}
	schedDone := make(chan struct{})
	go func() { defer close(schedDone); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-schedDone })

	// A processor that does every step at once, and a deliverer, on its
	// own connection, whose transfers never end.
	pool := func(conn *nats.Conn, stage dtr.Stage, h worker.Handler) *worker.Pool {
		p, err := worker.NewPool(conn, stage, 5, h, quiet(), nil)
		if err != nil {
			t.Fatal(err)
		}
		p.Heartbeat, p.Renew = beat, 200*time.Millisecond
		go func() { _ = p.Run(ctx) }()
		return p
	}
	pre := pool(nc, dtr.StagePre, func(context.Context, api.Grant, func(int64, int64)) api.Result { return api.Result{} })
	pool(nc, dtr.StagePost, func(context.Context, api.Grant, func(int64, int64)) api.Result { return api.Result{} })
	dnc, err := nats.Connect(nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dnc.Close)
	deliverer := pool(dnc, dtr.StageDelivery, func(ctx context.Context, _ api.Grant, _ func(int64, int64)) api.Result {
		<-ctx.Done()
		return api.Result{Error: &dtr.Failure{Kind: dtr.ErrInternalProcess, Text: "stopped"}}
	})

	ids := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	for _, id := range ids {
		d := fmt.Sprintf(`{"id":%q,"source":"http://src.example/%s","destination":"file:///data/out/%s"}`, id, id, id)
		if _, err := js.Publish(ctx, api.SubjectSubmit, []byte(d)); err != nil {
			t.Fatal(err)
		}
	}
	host, _ := os.Hostname()
	holder := fmt.Sprintf("delivery@%s (pid %d)", host, os.Getpid())

	// The deliverer holds the three transfers, and is heard from.
	var workers api.WorkersReply
	find := func(id string) *api.Worker {
		for i := range workers.Workers {
			if workers.Workers[i].ID == id {
				return &workers.Workers[i]
			}
		}
		return nil
	}
	eventually(t, func() string {
		workers = api.WorkersReply{}
		if err := tryAsk(nc, api.SubjectWorkers, nil, &workers); err != nil {
			return err.Error()
		}
		w := find(deliverer.ID())
		if w == nil || len(w.Grants) != 3 || w.Silent || len(workers.Workers) != 3 {
			return fmt.Sprintf("workers %+v: want 3, the deliverer holding 3 grants", workers)
		}
		return ""
	})
	var why api.DTRReply
	ask(t, nc, api.SubjectDTR, []byte(ids[0].String()), &why)
	if why.Holder == nil || why.Holder.Worker != deliverer.ID() || why.Holder.Silent || why.Why == nil ||
		!strings.Contains(why.Why.Reason, "held by "+holder) || strings.Contains(why.Why.Reason, "heartbeating") {
		t.Fatalf("why: %+v, holder %+v", why.Why, why.Holder)
	}

	// Its connection gone (the process killed), its heartbeats and its
	// renewals stop: it is silent, with its grants and their leases' end.
	stopped := time.Now()
	dnc.Close()
	eventually(t, func() string {
		workers = api.WorkersReply{}
		ask(t, nc, api.SubjectWorkers, nil, &workers)
		if w := find(deliverer.ID()); w == nil || !w.Silent || len(w.Grants) != 3 {
			return fmt.Sprintf("the deliverer %+v, want silent with 3 grants", w)
		}
		return ""
	})
	w := find(deliverer.ID())
	if w.LastHeartbeat.After(stopped) || w.Role != "delivery" || w.Stage != dtr.StageDelivery || w.Host != host || w.PID != os.Getpid() {
		t.Errorf("the deliverer %+v", w)
	}
	for _, g := range w.Grants {
		if g.State != dtr.Transferring || g.LeaseEnds.Before(stopped) || g.LeaseEnds.After(stopped.Add(time.Minute)) || g.LeaseEnds.After(w.LeaseEnds) {
			t.Errorf("grant %+v of the silent deliverer (its leases end by %s)", g, w.LeaseEnds)
		}
	}
	if p := find(pre.ID()); p == nil || p.Silent || p.Role != "processor" {
		t.Errorf("the processor %+v, want heard from", p)
	}

	why = api.DTRReply{}
	ask(t, nc, api.SubjectDTR, []byte(ids[0].String()), &why)
	if why.Holder == nil || !why.Holder.Silent || why.Holder.LeaseEnds.IsZero() || why.Why == nil ||
		!strings.Contains(why.Why.Reason, "running in TRANSFERRING") ||
		!strings.Contains(why.Why.Reason, "held by "+holder+"; its worker stopped heartbeating at ") ||
		!strings.Contains(why.Why.Reason, "; the lease ends at "+why.Holder.LeaseEnds.UTC().Format(time.RFC3339)) {
		t.Fatalf("why: %+v, holder %+v", why.Why, why.Holder)
	}
	t.Logf("why: %s", why.Why.Reason)
	var shares api.SharesReply
	ask(t, nc, api.SubjectShares, nil, &shares)
	if len(shares.Silent) != 3 {
		t.Fatalf("shares mark %d grants as held by a silent worker, want 3: %+v", len(shares.Silent), shares.Silent)
	}
	for _, g := range shares.Silent {
		if g.Holder.Worker != deliverer.ID() || g.State != dtr.Transferring || g.LeaseEnds.IsZero() {
			t.Errorf("silent grant %+v", g)
		}
	}
	// A user sees the share table, but no other owner's grants.
	shares = api.SharesReply{}
	ask(t, nc, api.UserSubject(api.SubjectShares, "alice"), nil, &shares)
	if len(shares.Shares) == 0 || len(shares.Silent) != 0 {
		t.Fatalf("alice's shares: %d rows, %d silent grants; want the table and none of the operator's grants", len(shares.Shares), len(shares.Silent))
	}
}

func TestOnlyOperatorsAndAdministratorsListTheWorkers(t *testing.T) {
	nc, _ := bustest.Server(t)
	ctx, cancel := context.WithCancel(context.Background())
	s, err := New(Config{Tick: 20 * time.Millisecond}, nc, quiet())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	var m *nats.Msg
	eventually(t, func() string {
		m, err = nc.Request(api.UserSubject(api.SubjectWorkers, "alice"), nil, time.Second)
		if err != nil {
			return err.Error()
		}
		return ""
	})
	if code := m.Header.Get(micro.ErrorCodeHeader); code != "403" {
		t.Fatalf("a user asked for the workers: %q %q", code, m.Header.Get(micro.ErrorHeader))
	}
	var workers api.WorkersReply
	ask(t, nc, api.SubjectWorkers, nil, &workers)
	if workers.Workers == nil || len(workers.Workers) != 0 || workers.HeartbeatSeconds != 5 {
		t.Fatalf("the operator asked for the workers: %+v", workers)
	}
}

// TestAStagesPoolsAreItsWorkerProcessesHeardAndNotSilent: a stage's
// grants of a step are spread over as many messages as this counts.
func TestAStagesPoolsAreItsWorkerProcessesHeardAndNotSilent(t *testing.T) {
	now := time.Now()
	w := newWorkerTracker(time.Second, time.Minute)
	hb := func(worker string, stage dtr.Stage, at time.Time) {
		w.heard(api.Heartbeat{Worker: worker, Role: "processor", Stage: stage, Host: "h", PID: 7}, at)
	}
	if n := w.pools(dtr.StagePre, now); n != 0 {
		t.Fatalf("%d pre pools before any heartbeat", n)
	}
	hb("p1", dtr.StagePre, now)
	hb("p1", dtr.StagePost, now)
	hb("p2", dtr.StagePre, now)
	hb("p3", dtr.StagePre, now.Add(-time.Minute)) // silent
	for _, tt := range []struct {
		stage dtr.Stage
		want  int
	}{{dtr.StagePre, 2}, {dtr.StagePost, 1}, {dtr.StageDelivery, 0}} {
		if n := w.pools(tt.stage, now); n != tt.want {
			t.Errorf("%s: %d pools, want %d", tt.stage, n, tt.want)
		}
	}
}
