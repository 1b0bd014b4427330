package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/bustest"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// rig is a NATS server with Sluice's streams, and what a pool sends on a
// stage's result and progress subjects.
type rig struct {
	t        *testing.T
	nc       *nats.Conn
	js       jetstream.JetStream
	mu       sync.Mutex
	messages int // result messages
	results  []api.Result
	progress []api.Progress
}

func newRig(t *testing.T) *rig {
	t.Helper()
	nc, js := bustest.Server(t)
	r := &rig{t: t, nc: nc, js: js}
	sub, err := nc.Subscribe(api.SubjectResultPrefix+">", func(m *nats.Msg) {
		rs, err := codec.DecodeResults(context.Background(), m)
		if err != nil {
			t.Errorf("result message: %v", err)
			return
		}
		r.mu.Lock()
		r.messages++
		r.results = append(r.results, rs...)
		r.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	psub, err := nc.Subscribe(api.SubjectProgressPrefix+">", func(m *nats.Msg) {
		var p api.Progress
		if _, err := codec.DecodeData(context.Background(), m, api.TypeProgress, &p); err == nil {
			r.mu.Lock()
			r.progress = append(r.progress, p)
			r.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = psub.Unsubscribe() })
	return r
}

// start runs a pool until the test ends or stop is called.
func (r *rig) start(workers int, h Handler) (stop func()) {
	p, err := NewPool(r.nc, dtr.StagePre, workers, h, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		r.t.Fatal(err)
	}
	p.Renew = 300 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := p.Run(ctx); err != nil {
			r.t.Errorf("pool: %v", err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	r.t.Cleanup(stop)
	return stop
}

// grants publishes n pre-processing grants in one Grants event issued at
// issued, with the given lease.
func (r *rig) grants(n int, issued time.Time, lease time.Duration) []api.Grant {
	var gs api.Grants
	for i := range n {
		id := uuid.New()
		gs.Grants = append(gs.Grants, api.Grant{ID: fmt.Sprintf("%s.%d", id, i+1), Stage: dtr.StagePre, State: dtr.QueryingReplica,
			DTR: &dtr.DTR{ID: id, Source: "file:///in/" + id.String(), Destination: "file:///out/" + id.String()}, LeaseSeconds: lease.Seconds()})
	}
	ev, err := codec.NewEvent(api.TypeGrants, "sluice/scheduler", "", gs)
	if err != nil {
		r.t.Fatal(err)
	}
	ev.SetTime(issued)
	r.publish(ev)
	return gs.Grants
}

func (r *rig) publish(ev event.Event) {
	m, err := codec.Encode(context.Background(), api.GrantSubject(dtr.StagePre), "", ev)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.js.PublishMsg(context.Background(), m); err != nil {
		r.t.Fatal(err)
	}
}

// waitResults waits until n results have come, and returns them by grant.
func (r *rig) waitResults(n int) map[string]api.Result {
	r.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r.mu.Lock()
		got := len(r.results)
		r.mu.Unlock()
		if got >= n {
			break
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%d results after 20 s, want %d", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // any more than n would come now
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]api.Result{}
	for _, res := range r.results {
		if _, dup := out[res.Grant]; dup {
			r.t.Errorf("two results for grant %s", res.Grant)
		}
		out[res.Grant] = res
	}
	if len(r.results) != n {
		r.t.Errorf("%d results, want %d", len(r.results), n)
	}
	return out
}

// streamEmpty waits until the grants stream holds nothing: every message
// taken and acknowledged, or terminated.
func (r *rig) streamEmpty() {
	r.t.Helper()
	for range 200 {
		st, err := r.js.Stream(context.Background(), bus.StreamGrants)
		if err == nil && st.CachedInfo().State.Msgs == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.t.Fatal("the grants stream still holds messages")
}

func TestTheGrantsOfOneMessageRunAtOnceOnFreeWorkersAndEachGetsOneResult(t *testing.T) {
	r := newRig(t)
	const n = 10
	var started sync.WaitGroup
	started.Add(n)
	r.start(n, func(ctx context.Context, g api.Grant, _ func(int64, int64)) api.Result {
		// Every grant waits for all the others to start: they run at once.
		started.Done()
		started.Wait()
		return api.Result{Checksum: "adler32:" + g.ID[:8]}
	})
	sent := r.grants(n, time.Now(), time.Minute)
	got := r.waitResults(n)
	for _, g := range sent {
		res, ok := got[g.ID]
		if !ok {
			t.Errorf("no result for grant %s", g.ID)
			continue
		}
		if res.DTR != g.DTR.ID || res.State != g.State || res.Error != nil || res.Checksum != "adler32:"+g.ID[:8] || res.Returned {
			t.Errorf("result %+v for grant %+v", res, g)
		}
	}
	r.mu.Lock()
	if r.messages > n {
		t.Errorf("%d result messages for %d grants", r.messages, n)
	}
	r.mu.Unlock()
	r.streamEmpty()
}

func TestAStoppingPoolGivesBackEveryGrantItHolds(t *testing.T) {
	r := newRig(t)
	running := make(chan struct{}, 10)
	stop := r.start(1, func(ctx context.Context, g api.Grant, report func(int64, int64)) api.Result {
		report(100, 1000)
		running <- struct{}{}
		<-ctx.Done() // runs until stopped
		return api.Result{Error: &dtr.Failure{Kind: dtr.ErrInternalProcess, Text: "stopped"}, Bytes: 100}
	})
	sent := r.grants(3, time.Now(), time.Minute)
	<-running // one runs, two wait for the only worker
	stop()
	got := r.waitResults(3)
	for _, g := range sent {
		if res := got[g.ID]; !res.Returned || res.Error != nil {
			t.Errorf("grant %s: %+v, want it given back", g.ID, res)
		}
	}
	r.streamEmpty()
}

func TestAGrantPastItsLeaseIsDroppedUnrun(t *testing.T) {
	r := newRig(t)
	var ran atomic.Int64
	r.start(2, func(context.Context, api.Grant, func(int64, int64)) api.Result {
		ran.Add(1)
		return api.Result{}
	})
	r.grants(2, time.Now().Add(-2*time.Second), time.Second) // issued two leases ago
	fresh := r.grants(1, time.Now(), time.Minute)
	got := r.waitResults(1)
	if _, ok := got[fresh[0].ID]; !ok || ran.Load() != 1 {
		t.Errorf("ran %d grants, results %v; want only the fresh grant run", ran.Load(), got)
	}
	r.streamEmpty()
}

func TestAGrantWaitingForAWorkerKeepsItsLeaseAlive(t *testing.T) {
	r := newRig(t)
	// One worker; the first grant takes longer than the lease of the
	// second, which waits: its lease is renewed while it waits, so it runs.
	r.start(1, func(ctx context.Context, g api.Grant, _ func(int64, int64)) api.Result {
		if g.DTR.Source[len(g.DTR.Source)-1] != 'x' {
			time.Sleep(1500 * time.Millisecond)
		}
		return api.Result{}
	})
	sent := r.grants(2, time.Now(), time.Second)
	got := r.waitResults(2)
	for _, g := range sent {
		if res, ok := got[g.ID]; !ok || res.Returned || res.Error != nil {
			t.Errorf("grant %s: %+v, want it run", g.ID, res)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	renewed := map[string]int{}
	for _, p := range r.progress {
		renewed[p.Grant]++
	}
	for _, g := range sent {
		if renewed[g.ID] == 0 {
			t.Errorf("the lease of grant %s was never renewed: %v", g.ID, renewed)
		}
	}
}

func TestAMessageThatIsNotAGrantIsTerminatedAndRunsNothing(t *testing.T) {
	for _, typ := range []string{api.TypeResult, "org.example.other"} {
		t.Run(typ, func(t *testing.T) {
			r := newRig(t)
			var ran atomic.Int64
			r.start(1, func(context.Context, api.Grant, func(int64, int64)) api.Result {
				ran.Add(1)
				return api.Result{}
			})
			ev, err := codec.NewEvent(typ, "someone", "", map[string]any{"grants": []any{map[string]any{"grant": "x.1"}}})
			if err != nil {
				t.Fatal(err)
			}
			r.publish(ev)
			r.streamEmpty()
			time.Sleep(100 * time.Millisecond)
			if ran.Load() != 0 {
				t.Errorf("%d grants ran", ran.Load())
			}
		})
	}
}

func TestResultsTooLargeForOneMessageAreSplit(t *testing.T) {
	r := newRig(t)
	s := newResultSender(r.nc, r.js, api.ResultSubject(dtr.StagePre), "test")
	s.maxBytes = 4096
	var batch []*pendingResult
	for i := range 40 {
		batch = append(batch, &pendingResult{r: api.Result{DTR: uuid.New(), Grant: fmt.Sprint("g", i),
			Error: &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: string(make([]byte, 200))}}, done: make(chan error, 1)})
	}
	s.publish(batch)
	for _, p := range batch {
		if err := <-p.done; err != nil {
			t.Fatal(err)
		}
	}
	got := r.waitResults(40)
	if len(got) != 40 {
		t.Errorf("%d distinct results", len(got))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.messages < 3 || r.messages > 40 {
		t.Errorf("%d messages for 40 results of about 300 bytes at 4096 bytes a message", r.messages)
	}
}

func TestAStopForAGrantWaitingForAWorkerStopsItAsItStarts(t *testing.T) {
	r := newRig(t)
	release := make(chan struct{})
	running := make(chan string, 2)
	cancelledAtStart := make(chan bool, 2)
	r.start(1, func(ctx context.Context, g api.Grant, _ func(int64, int64)) api.Result {
		running <- g.ID
		cancelledAtStart <- ctx.Err() != nil
		select {
		case <-release: // the first grant: busy until released
		case <-ctx.Done():
		}
		return api.Result{}
	})
	sent := r.grants(2, time.Now(), time.Minute)
	first := <-running
	<-cancelledAtStart
	waiting := sent[0].ID
	if waiting == first {
		waiting = sent[1].ID
	}
	// The scheduler cancels the DTR of the grant that waits.
	if err := r.nc.Publish(api.SubjectStopPrefix+waiting, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := r.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the pool takes the stop (same connection, its own subscription)
	close(release)
	if g := <-running; g != waiting {
		t.Fatalf("ran %s, want %s", g, waiting)
	}
	if !<-cancelledAtStart {
		t.Fatal("the stopped grant ran with a live context: its stop was lost while it waited for a worker")
	}
	r.waitResults(2)
}

func TestAGrantWhoseRenewalsAreNotAcknowledgedIsFenced(t *testing.T) {
	r := newRig(t)
	started := make(chan struct{})
	type seen struct {
		fenceHeld bool          // the fence let a step through while renewals were acknowledged
		cause     error         // why the handler's context ended
		after     time.Duration // how long after renewals stopped being stored
	}
	out := make(chan seen, 1)
	var cut atomic.Int64 // when renewals stopped being stored (Unix ns)
	r.start(1, func(ctx context.Context, g api.Grant, _ func(int64, int64)) api.Result {
		s := seen{fenceHeld: transfer.CheckFence(ctx, "test", "file:///x") == nil}
		close(started)
		<-ctx.Done()
		s.cause, s.after = context.Cause(ctx), time.Since(time.Unix(0, cut.Load()))
		if err := transfer.CheckFence(ctx, "test", "file:///x"); !transfer.IsLeaseLost(err) {
			t.Errorf("the fence after the context ended: %v, want it to refuse", err)
		}
		out <- s
		return api.Result{Error: &dtr.Failure{Kind: dtr.ErrInternalProcess, Text: "stopped"}}
	})
	const lease = 2 * time.Second
	sent := r.grants(1, time.Now(), lease)
	<-started
	// Renewals are no longer stored (acknowledged): the results stream
	// takes only results from now on.
	st, err := r.js.Stream(context.Background(), bus.StreamResults)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.Subjects = []string{api.SubjectResultPrefix + ">"}
	cut.Store(time.Now().UnixNano())
	if _, err := r.js.UpdateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	s := <-out
	if !s.fenceHeld {
		t.Error("the fence refused while the lease was fresh")
	}
	if !errors.Is(s.cause, transfer.ErrLeaseLost) {
		t.Fatalf("the handler's context ended with %v, want the lease lost", s.cause)
	}
	// The last acknowledged renewal was sent at most one renewal period
	// before the cut; the fence comes a margin before the lease ends.
	if limit := lease - fenceMargin(lease) + 200*time.Millisecond; s.after > limit {
		t.Errorf("fenced %s after renewals stopped, want within %s", s.after, limit)
	}
	res := r.waitResults(1)[sent[0].ID]
	if res.Error == nil || res.Error.Kind != dtr.ErrInternalProcess || !strings.Contains(res.Error.Text, "lease") {
		t.Fatalf("result %+v, want INTERNAL_PROCESS naming the lease", res.Error)
	}
}

func TestTheFenceRefusesOnceTheLastAcknowledgedRenewalIsALeaseLessTheMarginOld(t *testing.T) {
	const lease = 2 * time.Minute
	acked := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		since time.Duration
		held  bool
	}{
		{0, true},
		{lease - fenceMargin(lease) - time.Millisecond, true},
		{lease - fenceMargin(lease), false},
		{lease, false},
	}
	for _, c := range cases {
		h := &held{g: api.Grant{LeaseSeconds: lease.Seconds()}, acked: acked}
		if err := h.fence(acked.Add(c.since)); (err == nil) != c.held {
			t.Errorf("%s after the last acknowledged renewal: %v, want held %v", c.since, err, c.held)
		}
	}
	h := &held{g: api.Grant{LeaseSeconds: lease.Seconds()}, acked: acked}
	_ = h.fence(acked.Add(lease))
	h.acked = acked.Add(lease) // a renewal acknowledged too late
	if err := h.fence(acked.Add(lease)); err == nil {
		t.Error("a fence that refused let a step through again")
	}
	if fenceMargin(lease) != 30*time.Second || fenceMargin(2*time.Second) != 500*time.Millisecond {
		t.Errorf("margins %s, %s", fenceMargin(lease), fenceMargin(2*time.Second))
	}
}

// termGrant publishes one pre-processing grant of scheduler term term.
func (r *rig) termGrant(term uint64) api.Grant {
	id := uuid.New()
	g := api.Grant{ID: id.String() + ".1", Stage: dtr.StagePre, State: dtr.QueryingReplica, Term: term, LeaseSeconds: 60,
		DTR: &dtr.DTR{ID: id, Source: "file:///in/" + id.String(), Destination: "file:///out/" + id.String()}}
	ev, err := codec.NewEvent(api.TypeGrants, "sluice/scheduler", "", api.Grants{Grants: []api.Grant{g}})
	if err != nil {
		r.t.Fatal(err)
	}
	r.publish(ev)
	return g
}

func TestGrantsAndStopsOfADeposedSchedulersTermAreDropped(t *testing.T) {
	r := newRig(t)
	ran := make(chan string, 10)
	stopped := make(chan string, 10)
	release := make(chan struct{})
	r.start(2, func(ctx context.Context, g api.Grant, _ func(int64, int64)) api.Result {
		ran <- g.ID
		if g.DTR.Source == "file:///in/block" {
			select {
			case <-ctx.Done():
				stopped <- g.ID
			case <-release:
			}
		}
		return api.Result{}
	})
	expect := func(what string, ch chan string, want string) {
		t.Helper()
		select {
		case got := <-ch:
			if want == "" {
				t.Fatalf("%s: %s, want none", what, got)
			}
			if got != want {
				t.Fatalf("%s: %s, want %s", what, got, want)
			}
		case <-time.After(time.Second):
			if want != "" {
				t.Fatalf("%s: none within a second, want %s", what, want)
			}
		}
	}
	g7 := r.termGrant(7)
	expect("a grant of term 7", ran, g7.ID)
	g5 := r.termGrant(5)
	expect("a grant of term 5 after one of term 7", ran, "")
	r.streamEmpty() // taken, not left to come back
	waitFor(t, "the grant of term 5 given back", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, res := range r.results {
			if res.Grant == g5.ID {
				return res.Returned && res.Error == nil
			}
		}
		return false
	})
	g0 := r.termGrant(0)
	expect("a grant that does not say its term", ran, g0.ID)
	g9 := r.termGrant(9)
	expect("a grant of a newer term", ran, g9.ID)
	r.termGrant(8)
	expect("a grant of term 8 after one of term 9", ran, "")

	// A stop of an older term leaves the grant running; one of the
	// current term stops it.
	id := uuid.New()
	block := api.Grant{ID: id.String() + ".1", Stage: dtr.StagePre, State: dtr.QueryingReplica, Term: 9, LeaseSeconds: 60,
		DTR: &dtr.DTR{ID: id, Source: "file:///in/block", Destination: "file:///out/block"}}
	ev, err := codec.NewEvent(api.TypeGrants, "sluice/scheduler", "", api.Grants{Grants: []api.Grant{block}})
	if err != nil {
		t.Fatal(err)
	}
	r.publish(ev)
	expect("the grant to stop", ran, block.ID)
	stop := func(term uint64) {
		ev, err := codec.NewEvent(api.TypeStop, "sluice/scheduler", "", api.Stop{DTR: id, Grant: block.ID, Term: term})
		if err != nil {
			t.Fatal(err)
		}
		m, err := codec.Encode(context.Background(), api.SubjectStopPrefix+block.ID, "", ev)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	stop(8)
	expect("a stop of term 8", stopped, "")
	stop(9)
	expect("a stop of term 9", stopped, block.ID)
	close(release)
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
	}
}
