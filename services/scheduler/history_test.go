package scheduler

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/bustest"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// coreRun drives a core on a fake clock and records its history as the
// scheduler's steps do.
type coreRun struct {
	t       *testing.T
	c       *core.Core
	now     time.Time
	rec     *historyRecorder
	out     chan []historyItem
	dropped atomic.Uint64
	running map[string]core.Grant
}

func newCoreRun(t *testing.T, cfg core.Config) *coreRun {
	r := &coreRun{t: t, c: core.New(cfg), now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		out: make(chan []historyItem, 1000), running: map[string]core.Grant{}}
	r.rec = &historyRecorder{out: r.out, dropped: &r.dropped}
	return r
}

// step lets d pass and records what changed, as Service.step does.
func (r *coreRun) step(d time.Duration) []core.Grant {
	r.now = r.now.Add(d)
	r.c.Tick(r.now)
	dec := r.c.Take()
	r.rec.send(r.rec.step(r.now, r.c, dec.Changed, dec.Chained, 7))
	for _, g := range dec.Grants {
		r.running[g.ID] = g
	}
	return dec.Grants
}

// answer ends a grant, with f as its error.
func (r *coreRun) answer(g core.Grant, f *dtr.Failure) {
	delete(r.running, g.ID)
	res := core.Result{DTR: g.DTR.ID, Grant: g.ID, Error: f, Size: 10, Bytes: 10, Checksum: "adler32:00000001"}
	r.rec.resultsFrom("sluice/"+string(g.Stage)+"/"+string(g.Stage)+"-"+g.ID, []api.Result{res})
	if err := r.c.Result(r.now, res); err != nil {
		r.t.Fatal(err)
	}
}

// events are the events recorded so far, by DTR.
func (r *coreRun) events() map[uuid.UUID][]historyItem {
	out := map[uuid.UUID][]historyItem{}
	for {
		select {
		case items := <-r.out:
			for _, it := range items {
				out[it.id] = append(out[it.id], it)
			}
		default:
			return out
		}
	}
}

func testDTR(i int) *dtr.DTR {
	return &dtr.DTR{ID: uuid.New(), Source: "http://src.example/" + string(rune('a'+i)), Destination: "file:///data/" + string(rune('a'+i)),
		Owner: dtr.Identity{DN: "alice"}}
}

func TestTheRecorderRecordsEachStateARetryAndTheWorkerOfAGrant(t *testing.T) {
	cfg := core.DefaultConfig()
	cfg.RetryBase = time.Minute
	r := newCoreRun(t, cfg)
	d := testDTR(0)
	if err := r.c.Submit(r.now, d); err != nil {
		t.Fatal(err)
	}
	r.rec.arrived(d.ID)
	failed := false
	for i := 0; i < 200 && r.c.Len() > 0; i++ {
		for _, g := range r.step(time.Second) {
			if g.State == dtr.Transferring && !failed {
				failed = true
				r.answer(g, &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "503 busy"})
				continue
			}
			r.answer(g, nil)
		}
	}
	if r.c.Len() != 0 {
		t.Fatal("the DTR did not finish")
	}
	r.step(time.Second) // the step that takes the final DTR
	evs := r.events()[d.ID]
	if len(evs) < 6 {
		t.Fatalf("only %d events", len(evs))
	}
	if !evs[0].first || evs[0].ev.State != dtr.New || evs[0].ev.From != "" {
		t.Errorf("first event %+v", evs[0])
	}
	if last := evs[len(evs)-1]; !last.final || last.ev.State != dtr.Done {
		t.Errorf("last event %+v, want final DONE", last.ev)
	}
	var retry, worker, failure bool
	for i, it := range evs {
		ev := it.ev
		if i > 0 && ev.From != evs[i-1].ev.State.String() {
			t.Errorf("event %d is from %s, the one before was in %s", i, ev.From, evs[i-1].ev.State)
		}
		if ev.Term != 7 {
			t.Errorf("event %d has term %d", i, ev.Term)
		}
		if ev.Hold == string(core.HoldRetry) && !ev.Until.IsZero() {
			retry = true
		}
		if ev.From == dtr.Transferring.String() && ev.Ended != "" && ev.Ended != ev.Grant && it.ranBy == "delivery-"+ev.Ended {
			worker = true
		}
		if ev.Error != nil && ev.Error.Text == "503 busy" {
			failure = true
		}
	}
	if !retry || !worker || !failure {
		t.Fatalf("retry with its end %v, worker of the transfer %v, its error %v; events:\n%s", retry, worker, failure, describe(evs))
	}
}

func describe(evs []historyItem) string {
	var b strings.Builder
	for _, it := range evs {
		b.WriteString(it.ev.From + " -> " + it.ev.State.String() + " " + it.ev.Hold + " " + it.ev.Grant + " ended " + it.ev.Ended + " " + it.ev.Worker + "\n")
	}
	return b.String()
}

func TestARecorderWhoseWriterIsBehindDropsAndCountsWithoutBlocking(t *testing.T) {
	var dropped atomic.Uint64
	out := make(chan []historyItem, 1)
	rec := &historyRecorder{out: out, dropped: &dropped}
	items := []historyItem{{id: uuid.New()}, {id: uuid.New()}}
	rec.send(items)
	rec.send(items) // the queue is full: dropped at once
	if got := dropped.Load(); got != 2 {
		t.Fatalf("dropped %d, want 2", got)
	}
}

// writeEvents stores events through a writer, as a leader does.
func writeEvents(t *testing.T, w *historyWriter, items []historyItem) {
	t.Helper()
	in := make(chan []historyItem, 1)
	w.in = in
	in <- items
	close(in)
	w.run(context.Background())
}

func TestTheHistoryKeepsTheLast64EventsNumberedOnAcrossLeaders(t *testing.T) {
	_, js := bustest.Server(t)
	ctx := context.Background()
	id := uuid.New()
	t0 := time.Now()
	ev := func(i int, st dtr.State) api.HistoryEvent {
		return api.HistoryEvent{Time: t0.Add(time.Duration(i) * time.Second), State: st, Grant: "g" + string(rune('A'+i%26)) + string(rune('a'+i/26))}
	}
	var first []historyItem
	for i := range 50 {
		first = append(first, historyItem{id: id, ev: ev(i, dtr.Transfer), first: i == 0})
	}
	stats := &historyStats{}
	writeEvents(t, &historyWriter{js: js, log: quiet(), stats: stats}, first)
	// A later leader knows nothing of the numbers: it asks the store.
	var second []historyItem
	for i := 50; i < 70; i++ {
		second = append(second, historyItem{id: id, ev: ev(i, dtr.Transfer)})
	}
	// The last one, recorded again after a take-over, is left out.
	second = append(second, historyItem{id: id, ev: ev(69, dtr.Transfer)})
	writeEvents(t, &historyWriter{js: js, log: quiet(), stats: stats}, second)
	if got, msgs := stats.written.Load(), stats.messages.Load(); got != 71 || msgs != 2 {
		t.Fatalf("%d events written in %d messages, want 71 in 2 (one per leader)", got, msgs)
	}
	events, dropped, err := readHistory(ctx, js, id)
	if err != nil {
		t.Fatal(err)
	}
	// 71 events, the last a repeat: the last 64 of the other 70 are kept.
	if len(events) != bus.HistoryPerDTR || dropped != 70-bus.HistoryPerDTR {
		t.Fatalf("%d events, %d dropped; want %d kept and %d dropped", len(events), dropped, bus.HistoryPerDTR, 70-bus.HistoryPerDTR)
	}
	if events[0].Seq != 70-bus.HistoryPerDTR+1 || events[len(events)-1].Seq != 70 {
		t.Fatalf("events numbered %d to %d", events[0].Seq, events[len(events)-1].Seq)
	}
	for i := 1; i < len(events); i++ {
		if events[i].Seq <= events[i-1].Seq {
			t.Fatalf("event %d numbered %d after %d", i, events[i].Seq, events[i-1].Seq)
		}
	}
	if other, _, err := readHistory(ctx, js, uuid.New()); err != nil || len(other) != 0 {
		t.Fatalf("an unknown DTR's history: %v, %v", other, err)
	}
}

func TestAStuckDTRIsReportedOncePerEpisodeAndAWaitingOneNever(t *testing.T) {
	cfg := core.DefaultConfig()
	cfg.MaxDelivery = 1
	cfg.MaxEmergency = 0
	cfg.Lease = 100 * time.Hour // a worker that keeps its grant alive and moves nothing
	r := newCoreRun(t, cfg)
	running, waiting := testDTR(0), testDTR(1)
	for _, d := range []*dtr.DTR{running, waiting} {
		if err := r.c.Submit(r.now, d); err != nil {
			t.Fatal(err)
		}
	}
	var transfer core.Grant
	for i := 0; i < 50 && transfer.ID == ""; i++ {
		for _, g := range r.step(time.Second) {
			if g.State == dtr.Transferring {
				transfer = g
			} else {
				r.answer(g, nil)
			}
		}
	}
	for i := 0; i < 50; i++ { // the other one reaches TRANSFER and waits there
		for _, g := range r.step(time.Second) {
			r.answer(g, nil)
		}
	}
	var logs bytes.Buffer
	s := &Service{core: r.c, stuck: newStuckDetector(slog.New(slog.NewTextHandler(&logs, nil)), core.DeadlineFor), history: r.rec}
	s.role.Store(roleLeader)
	stuckIDs := func() []uuid.UUID {
		var ids []uuid.UUID
		for _, d := range s.stuck.list(nil) {
			ids = append(ids, d.DTR)
		}
		return ids
	}
	s.sweep(r.now)
	if n := s.stuck.count.Load(); n != 0 {
		t.Fatalf("%d stuck at once", n)
	}
	// Past the 2 h of a transfer: the running one is stuck; the one that
	// waits for the only slot is not, however long it waits.
	r.now = r.now.Add(2*time.Hour + time.Minute)
	r.c.Tick(r.now)
	s.sweep(r.now)
	s.sweep(r.now.Add(time.Minute))
	if ids := stuckIDs(); len(ids) != 1 || ids[0] != transfer.DTR.ID || s.stuck.count.Load() != 1 {
		t.Fatalf("stuck %v, want only %s", ids, transfer.DTR.ID)
	}
	if n := strings.Count(logs.String(), "DTR stuck"); n != 1 {
		t.Fatalf("%d warnings for one stuck DTR, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), transfer.DTR.ID.String()) {
		t.Fatalf("the warning does not name the DTR:\n%s", logs.String())
	}
	// It ends: no longer stuck.
	r.answer(transfer, nil)
	r.step(time.Second)
	s.sweep(r.now)
	if n := s.stuck.count.Load(); n != 0 {
		t.Fatalf("%d stuck after it moved on", n)
	}
}

func TestAStandbyReportsNoStuckDTR(t *testing.T) {
	cfg := core.DefaultConfig()
	cfg.Lease = 100 * time.Hour
	r := newCoreRun(t, cfg)
	d := testDTR(0)
	if err := r.c.Submit(r.now, d); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ { // to a transfer that runs and moves nothing
		for _, g := range r.step(time.Second) {
			if g.State != dtr.Transferring {
				r.answer(g, nil)
			}
		}
	}
	r.now = r.now.Add(3 * time.Hour)
	var logs bytes.Buffer
	s := &Service{core: r.c, stuck: newStuckDetector(slog.New(slog.NewTextHandler(&logs, nil)), core.DeadlineFor), history: r.rec}
	s.role.Store(roleLeader)
	s.sweep(r.now)
	if n := s.stuck.count.Load(); n != 1 {
		t.Fatalf("the leader finds %d stuck, want 1", n)
	}
	// Stepped down: the standby sweeps nothing and reports nothing.
	s.role.Store(roleStandby)
	logs.Reset()
	s.sweep(r.now.Add(time.Minute))
	if n, l := s.stuck.count.Load(), s.stuck.list(nil); n != 0 || len(l) != 0 {
		t.Fatalf("a standby reports %d stuck: %v", n, l)
	}
	if strings.Contains(logs.String(), "DTR stuck") {
		t.Fatalf("a standby warned:\n%s", logs.String())
	}
}

func TestTheStuckDeadlinesAreARCsAgeingDeadlines(t *testing.T) {
	for _, tt := range []struct {
		state     dtr.State
		cacheable bool
		want      time.Duration
	}{
		{dtr.New, false, time.Hour},
		{dtr.New, true, 24 * time.Hour},
		{dtr.Transfer, false, 2 * time.Hour},
		{dtr.Transferring, false, 2 * time.Hour},
		{dtr.Resolving, false, time.Hour},
	} {
		if got := newStuckDetector(nil, core.DefaultConfig().DeadlineFor).deadline(tt.state, tt.cacheable); got != tt.want {
			t.Errorf("deadline(%s, cacheable %v) = %s, want %s", tt.state, tt.cacheable, got, tt.want)
		}
	}
}

func TestAFullHistoryDropsItsOldestEventsAndCountsThem(t *testing.T) {
	_, js := bustest.Server(t)
	ctx := context.Background()
	if err := bus.Ensure(ctx, js, bus.Setup{Limits: bus.Limits{History: bus.MinLimit}}); err != nil {
		t.Fatal(err)
	}
	stats := &historyStats{}
	w := &historyWriter{js: js, log: quiet(), stats: stats, next: map[uuid.UUID]numbered{}}
	w.look(ctx)
	// 2 KiB events, 6,000 of them in 3,000 DTRs: half again the stream's
	// 8 MiB.
	text := strings.Repeat("x", 2048)
	const dtrs, each = 3000, 2
	first := uuid.New()
	for batch := 0; batch < dtrs/500; batch++ {
		var groups [][]historyItem
		for i := 0; i < 500; i++ {
			id := uuid.New()
			if batch == 0 && i == 0 {
				id = first
			}
			var items []historyItem
			for e := 0; e < each; e++ {
				items = append(items, historyItem{id: id, first: e == 0, ev: api.HistoryEvent{Time: time.Now(), State: dtr.Transfer,
					Error: &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: text}}})
			}
			groups = append(groups, items)
		}
		w.publish(ctx, groups)
	}
	w.look(ctx)
	if got := stats.written.Load(); got != dtrs*each {
		t.Fatalf("%d events stored, want all %d: a full history takes new events", got, dtrs*each)
	}
	if stats.full.Load() != 1 || stats.droppedFull.Load() == 0 || stats.bytes.Load() > bus.MinLimit {
		t.Fatalf("full %d, dropped %d, %d bytes of %d", stats.full.Load(), stats.droppedFull.Load(), stats.bytes.Load(), stats.limit.Load())
	}
	// The oldest went first.
	if events, _, err := readHistory(ctx, js, first); err != nil || len(events) != 0 {
		t.Fatalf("the first DTR's history: %d events, %v; want it dropped", len(events), err)
	}
}

func TestTheSweepRecordsAChangeOfWaitButNotOfTheSplitsReasons(t *testing.T) {
	var dropped atomic.Uint64
	r := &historyRecorder{dropped: &dropped, out: make(chan []historyItem, 1)}
	id, now := uuid.New(), time.Now()
	stand := func(h core.Hold) core.Standing { return core.Standing{DTR: id, State: dtr.Transfer, Hold: h} }
	if _, ok := r.held(now, stand(core.HoldShareFull), 3); ok {
		t.Fatal("an event for a DTR first seen (the last leader's)")
	}
	r.swept = true // the term's first sweep is over
	for _, tt := range []struct {
		hold  core.Hold
		event bool
	}{
		{core.HoldStateFull, false}, // the split's reasons: one kind
		{core.HoldFreeSlot, false},
		{core.HoldEndpoint, true},
		{core.HoldEndpoint, false},
		{core.HoldMaxPrepared, true},
		{core.HoldShareFull, true},
	} {
		it, ok := r.held(now, stand(tt.hold), 3)
		if ok != tt.event {
			t.Fatalf("to %s: event %v, want %v", tt.hold, ok, tt.event)
		}
		if ok && (it.ev.State != dtr.Transfer || it.ev.From != dtr.Transfer.String() || it.ev.Hold != string(tt.hold) || it.ev.Term != 3) {
			t.Fatalf("to %s: %+v", tt.hold, it.ev)
		}
	}
}

// A leader's first sweep over DTRs it took over remembers none that
// waits for a slot (no entry for each of millions) and records no event;
// one held by something else then is remembered. After that sweep, a DTR
// not remembered waited for a slot at every sweep: a change is an event.
func TestTheFirstSweepOfATermRemembersOnlyTheDTRsNotWaitingForASlot(t *testing.T) {
	var dropped atomic.Uint64
	r := &historyRecorder{dropped: &dropped, out: make(chan []historyItem, 1)}
	now := time.Now()
	queued, parked, later := uuid.New(), uuid.New(), uuid.New()
	for _, st := range []core.Standing{
		{DTR: queued, State: dtr.Transfer, Hold: core.HoldShareFull},
		{DTR: parked, State: dtr.Transfer, Hold: core.HoldEndpoint},
		{DTR: later, State: dtr.Transfer, Hold: core.HoldNoSlot},
	} {
		if it, ok := r.held(now, st, 2); ok {
			t.Fatalf("the first sweep recorded %+v", it.ev)
		}
	}
	if len(r.last) != 1 {
		t.Fatalf("the first sweep remembers %d DTRs, want 1 (the one held by a full endpoint)", len(r.last))
	}
	r.swept = true
	if _, ok := r.held(now, core.Standing{DTR: parked, State: dtr.Transfer, Hold: core.HoldEndpoint}, 2); ok {
		t.Fatal("an event for a hold unchanged since the first sweep")
	}
	it, ok := r.held(now, core.Standing{DTR: later, State: dtr.Transfer, Hold: core.HoldEndpoint}, 2)
	if !ok || it.ev.From != dtr.Transfer.String() || it.ev.Hold != string(core.HoldEndpoint) {
		t.Fatalf("a DTR held by a full endpoint after waiting for a slot: %+v %v, want the event", it.ev, ok)
	}
}

func TestWithHistoryOffNothingIsRecorded(t *testing.T) {
	var dropped atomic.Uint64
	s := &Service{cfg: Config{HistoryOff: true}, history: &historyRecorder{dropped: &dropped}}
	stop := s.writeHistory(context.Background())
	defer stop()
	if s.history.out != nil {
		t.Fatal("a writer runs with the history off")
	}
	r := newCoreRun(t, core.DefaultConfig())
	r.rec = s.history
	d := testDTR(0)
	if err := r.c.Submit(r.now, d); err != nil {
		t.Fatal(err)
	}
	r.rec.arrived(d.ID)
	r.step(time.Second)
	if len(r.rec.last) != 0 || dropped.Load() != 0 {
		t.Fatalf("recorded %d DTRs, dropped %d", len(r.rec.last), dropped.Load())
	}
	if _, ok := r.rec.held(r.now, core.Standing{DTR: d.ID, State: dtr.Transfer, Hold: core.HoldEndpoint}, 1); ok {
		t.Fatal("the sweep recorded an event")
	}
}

func TestAStepsHistoryIsStoredBeforeItsInputsAreAcknowledged(t *testing.T) {
	_, js := bustest.Server(t)
	ctx := context.Background()
	var dropped atomic.Uint64
	s := &Service{js: js, log: quiet(), historyStats: &historyStats{}, history: &historyRecorder{dropped: &dropped}}
	in := make(chan []historyItem, 8)
	s.history.out = in
	w := &historyWriter{js: js, log: quiet(), in: in, stats: s.historyStats, flushNow: make(chan struct{}, 1), stored: make(chan struct{})}
	s.historyWriter.Store(w)
	done := make(chan struct{})
	go func() { defer close(done); w.run(ctx) }()
	defer func() { close(in); <-done }()

	id := uuid.New()
	ticket := s.history.send([]historyItem{{id: id, first: true, ev: api.HistoryEvent{Time: time.Now(), State: dtr.New}}})
	s.awaitHistory(ctx, ticket, false) // as the committer does before acknowledging
	events, _, err := readHistory(ctx, js, id)
	if err != nil || len(events) != 1 || events[0].Seq != 1 {
		t.Fatalf("right after: %+v, %v; want the event stored", events, err)
	}
}

func TestADTRWaitingForATimeLongPastCountsAsStuck(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name  string
		hold  core.Hold
		until time.Time
		stuck bool
	}{
		{"retry due later", core.HoldRetry, now.Add(time.Hour), false},
		{"retry just due", core.HoldRetry, now.Add(-30 * time.Second), false},
		{"retry due hours ago", core.HoldRetry, now.Add(-3 * time.Hour), true},
		{"cache wait hours past its end", core.HoldCache, now.Add(-3 * time.Hour), true},
		{"waiting for a slot", core.HoldShareFull, time.Time{}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := newStuckDetector(quiet(), core.DeadlineFor)
			d.begin()
			d.observe(now, core.Standing{DTR: uuid.New(), State: dtr.Transfer, Hold: tt.hold, Until: tt.until, Since: now.Add(-5 * time.Hour)},
				func(uuid.UUID) (dtr.DTR, bool) { return dtr.DTR{}, false })
			d.end()
			if got := d.count.Load() == 1; got != tt.stuck {
				t.Fatalf("stuck %v, want %v", got, tt.stuck)
			}
		})
	}
}

func TestTheRecorderKeepsWhatItLastWroteOfEachDTRExactly(t *testing.T) {
	tests := []struct {
		name string
		rec  recorded
	}{
		{"queued, no slot", recorded{state: dtr.Transfer, hold: core.HoldNoSlot}},
		{"running its grant", recorded{state: dtr.Transferring, hold: core.HoldRunning, grant: "g.1"}},
		{"waiting after an error", recorded{state: dtr.New, hold: core.HoldRetry, err: "temporary: 503"}},
		{"a hold it does not number", recorded{state: dtr.Transfer, hold: core.Hold("something_new")}},
		{"no hold", recorded{state: dtr.Transfer}},
	}
	r := &historyRecorder{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := uuid.New()
			r.setLast(id, recorded{state: dtr.PreClean, grant: "older", err: "older"})
			r.setLast(id, tt.rec)
			if got, ok := r.lastOf(id); !ok || got != tt.rec {
				t.Errorf("kept %+v (%v), want %+v", got, ok, tt.rec)
			}
			r.forgetLast(id)
			if _, ok := r.lastOf(id); ok {
				t.Error("kept after it was forgotten")
			}
		})
	}
	if len(r.more) != 0 || len(r.last) != 0 {
		t.Errorf("%d and %d kept after every DTR was forgotten", len(r.last), len(r.more))
	}
}

// A chained grant's pre-clean, which never waits in a queue nor gets a
// grant message of its own, shows in the history as any pre-clean does:
// granted (PRE_CLEANING under its grant id, ending the query's grant) and
// ended by the DTR's next event, both run by the worker that sent the
// chained result.
func TestTheRecorderRecordsAChainedPreCleanAsGrantedAndEnded(t *testing.T) {
	cfg := core.DefaultConfig()
	cfg.ChainPreClean = true
	r := newCoreRun(t, cfg)
	d := testDTR(0)
	if err := r.c.Submit(r.now, d); err != nil {
		t.Fatal(err)
	}
	r.rec.arrived(d.ID)
	var query core.Grant
	for i := 0; i < 200 && r.c.Len() > 0; i++ {
		for _, g := range r.step(time.Second) {
			if g.Then == nil {
				r.answer(g, nil)
				continue
			}
			query = g
			delete(r.running, g.ID)
			res := core.Result{DTR: d.ID, Grant: g.ID, State: g.State, Size: 10,
				Then: &core.Result{DTR: d.ID, Grant: g.Then.Grant, State: g.Then.State}}
			r.rec.resultsFrom("sluice/pre/w1", []api.Result{res})
			if err := r.c.Result(r.now, res); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.step(time.Second) // the step that takes the final DTR
	if query.ID == "" {
		t.Fatal("no chained grant")
	}
	evs := r.events()[d.ID]
	var states []string
	at := -1
	for i, it := range evs {
		states = append(states, it.ev.State.String())
		if i > 0 && it.ev.From != evs[i-1].ev.State.String() {
			t.Errorf("event %d is from %s, the one before was in %s", i, it.ev.From, evs[i-1].ev.State)
		}
		if it.ev.State == dtr.PreCleaning {
			at = i
		}
	}
	if at < 1 || at+1 >= len(evs) {
		t.Fatalf("no PRE_CLEANING event between others: %v", states)
	}
	granted, ended := evs[at], evs[at+1]
	if granted.ev.Grant != query.Then.Grant || granted.ev.From != dtr.QueryingReplica.String() || granted.ev.Ended != query.ID || granted.ranBy != "w1" {
		t.Errorf("the pre-clean's grant event %+v (ran by %q), want grant %s from QUERYING_REPLICA ending %s, ran by w1",
			granted.ev, granted.ranBy, query.Then.Grant, query.ID)
	}
	if ended.ev.Ended != query.Then.Grant || ended.ranBy != "w1" {
		t.Errorf("the event after the pre-clean %+v (ran by %q), want it to end %s, ran by w1", ended.ev, ended.ranBy, query.Then.Grant)
	}
	if last := evs[len(evs)-1]; !last.final || last.ev.State != dtr.Done {
		t.Errorf("last event %+v, want final DONE", last.ev)
	}
}

// manyToSweep is a leader over 3 sweep steps and a bit of DTRs, with
// one transfer running for three hours, moving nothing (transfer).
func manyToSweep(t *testing.T) (r *coreRun, s *Service, transfer core.Grant) {
	cfg := core.DefaultConfig()
	cfg.MaxDelivery = 1
	cfg.MaxEmergency = 0
	cfg.Lease = 100 * time.Hour
	r = newCoreRun(t, cfg)
	const n = 3*sweepStep + 10
	for i := range n {
		d := testDTR(0)
		d.Source, d.Destination = fmt.Sprintf("http://src.example/%d", i), fmt.Sprintf("file:///data/%d", i)
		if err := r.c.Submit(r.now, d); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 50; i++ {
		for _, g := range r.step(time.Second) {
			if g.State != dtr.Transferring {
				r.answer(g, nil)
			} else {
				transfer = g
			}
		}
	}
	r.now = r.now.Add(3 * time.Hour)
	s = &Service{core: r.c, stuck: newStuckDetector(slog.New(slog.NewTextHandler(io.Discard, nil)), core.DeadlineFor), history: r.rec}
	s.role.Store(roleLeader)
	return r, s, transfer
}

func TestASweepOverManyDTRsIsMadeASliceAtATimeAndReportsOnceOver(t *testing.T) {
	r, s, _ := manyToSweep(t)
	slices := 0
	for slices == 0 || s.pass != nil {
		s.sweepSome(r.now, time.Nanosecond) // one step of sweepStep DTRs each
		slices++
		if s.pass != nil && s.stuck.count.Load() != 0 {
			t.Fatalf("a stuck DTR reported after %d of the sweep's slices, before it is over", slices)
		}
		if slices > r.c.Len() {
			t.Fatal("the sweep never ends")
		}
	}
	if slices != 4 {
		t.Fatalf("a sweep over %d DTRs took %d slices of %d, want 4", r.c.Len(), slices, sweepStep)
	}
	whole := &Service{core: r.c, stuck: newStuckDetector(slog.New(slog.NewTextHandler(io.Discard, nil)), core.DeadlineFor), history: r.rec}
	whole.role.Store(roleLeader)
	whole.sweep(r.now)
	if c, w := s.stuck.count.Load(), whole.stuck.count.Load(); c != w || c == 0 {
		t.Fatalf("%d stuck once the sweep in slices is over, %d by a sweep at once", c, w)
	}
	if !s.history.swept {
		t.Fatal("the term's first sweep is over, and the history does not know it")
	}
}

func TestADTRFoundStuckEarlyInASweepThatMovesOnBeforeItsEndIsNotReported(t *testing.T) {
	r, s, transfer := manyToSweep(t)
	if transfer.ID == "" {
		t.Fatal("no transfer runs")
	}
	moved := false
	for slices := 0; slices == 0 || s.pass != nil; slices++ {
		s.sweepSome(r.now, time.Nanosecond)
		if _, found := s.stuck.stuck[transfer.DTR.ID]; found && s.pass != nil && !moved {
			// Met stuck, the sweep not over: the transfer ends.
			r.answer(transfer, nil)
			r.step(time.Second)
			moved = true
		}
	}
	if !moved {
		t.Skip("the transfer was met in the sweep's last slice (1 run in about 1,200)")
	}
	for _, d := range s.stuck.list(nil) {
		if d.DTR == transfer.DTR.ID {
			t.Fatalf("%s is reported stuck once the sweep is over, but moved on during it", d.DTR)
		}
	}
}
