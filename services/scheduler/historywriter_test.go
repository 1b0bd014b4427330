package scheduler

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/bustest"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// startHistory runs a term's writer for a bare Service, as writeHistory
// does, on js, storing at once what the committer asks for; stop stops it
// at once.
func startHistory(t *testing.T, js jetstream.JetStream) (s *Service, w *historyWriter, stop func()) {
	t.Helper()
	return startHistoryCoalescing(t, js, 0)
}

// startHistoryCoalescing is startHistory with the least time between two
// stores asked for, and as long between two stores not asked for.
func startHistoryCoalescing(t *testing.T, js jetstream.JetStream, coalesce time.Duration) (s *Service, w *historyWriter, stop func()) {
	t.Helper()
	var dropped atomic.Uint64
	s = &Service{js: js, log: quiet(), historyStats: &historyStats{}, history: &historyRecorder{dropped: &dropped}}
	in := make(chan []historyItem, historyQueue)
	s.history.out = in
	w = &historyWriter{js: js, log: quiet(), in: in, stats: s.historyStats, flushNow: make(chan struct{}, 1), stored: make(chan struct{}),
		coalesce: coalesce, flushEvery: max(coalesce, historyFlushEvery)}
	s.history.queued = &w.queued
	s.historyWriter.Store(w)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.run(ctx) }()
	return s, w, func() { cancel(); <-done }
}

// newStep is a step's commit of one new DTR: its record, and its arrival
// as its history; done, if set, is its caller's.
func newStep(done func(error)) *commit {
	id := uuid.New()
	return &commit{records: []record{{id: id, data: []byte(`{"id":"` + id.String() + `"}`)}}, done: done,
		events: []historyItem{{id: id, first: true, ev: api.HistoryEvent{Time: time.Now(), State: dtr.New}}}}
}

func TestAHistoryStoreThatNeverAnswersCostsOneWaitNotOneEachStep(t *testing.T) {
	nc, js := bustest.Server(t)
	ctx := context.Background()
	// The stream is gone and something silent listens on its subjects:
	// no publish of history is ever acknowledged (as with a stream whose
	// leader is lost).
	if err := js.DeleteStream(ctx, bus.StreamHistory); err != nil {
		t.Fatal(err)
	}
	silent, err := nc.SubscribeSync(bus.SubjectHistoryPrefix + "*")
	if err != nil {
		t.Fatal(err)
	}
	s, w, stop := startHistory(t, js)
	defer stop()
	s.nc, s.journal = nc, newJournal(js, nil, quiet(), 1<<20, time.Hour, 0)
	const commits = 8
	began := time.Now()
	for range commits { // each step's commit: a record journaled, its history handed over
		if err := s.carryOut(ctx, []*commit{newStep(nil)}); err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(began)
	if got := s.historyStats.unawaited.Load(); got != commits {
		t.Fatalf("%d commits went on without their history, want all %d", got, commits)
	}
	if !w.lagging.Load() {
		t.Fatal("the writer is not marked lagging")
	}
	// Waiting each time would take commits × historyAwait; one wait is
	// the cost.
	if took >= commits*historyAwait/2 {
		t.Fatalf("%d commits took %s: they waited for a store that never answers", commits, took)
	}

	// The store answers again: once a store succeeds, commits wait for
	// their history again.
	if err := silent.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := bus.Ensure(ctx, js, bus.Setup{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); w.lagging.Load(); {
		if time.Now().After(deadline) {
			t.Fatal("still lagging a minute after the store came back")
		}
		s.history.send([]historyItem{{id: uuid.New(), first: true, ev: api.HistoryEvent{Time: time.Now(), State: dtr.New}}})
		time.Sleep(200 * time.Millisecond)
	}
	id := uuid.New()
	ticket := s.history.send([]historyItem{{id: id, first: true, ev: api.HistoryEvent{Time: time.Now(), State: dtr.New}}})
	s.awaitHistory(ctx, ticket, false)
	if events, _, err := readHistory(ctx, js, id); err != nil || len(events) != 1 {
		t.Fatalf("after the store came back: %+v, %v; want the event stored before the commit goes on", events, err)
	}
}

func TestStepsAskingForTheirHistoryWithinTheCoalescingTimeStoreEachDTRsEventsInOneMessage(t *testing.T) {
	_, js := bustest.Server(t)
	ctx := context.Background()
	s, _, stop := startHistoryCoalescing(t, js, time.Hour)
	defer stop()
	id := uuid.New()
	send := func(state dtr.State, first bool) uint64 {
		return s.history.send([]historyItem{{id: id, first: first, ev: api.HistoryEvent{Time: time.Now(), State: state}}})
	}
	messages := func() uint64 {
		t.Helper()
		st, err := js.Stream(ctx, bus.StreamHistory)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(bus.HistorySubject(id.String())))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects[bus.HistorySubject(id.String())]
	}
	// The first store asked for goes out at once.
	s.awaitHistory(ctx, send(dtr.New, true), false)
	if got := messages(); got != 1 {
		t.Fatalf("%d messages after the first step, want 1", got)
	}
	// Two more steps whose acknowledgements wait: held (an hour here),
	// the writer stores them together at its next store, which a step a
	// caller waits for (urgent) asks for at once.
	for _, state := range []dtr.State{dtr.CacheChecked, dtr.Resolved} {
		ticket := send(state, false)
		waited := make(chan struct{})
		go func() { defer close(waited); s.awaitHistory(ctx, ticket, false) }()
		select {
		case <-waited:
			t.Fatalf("the step to %s was stored within the hour the writer gathers steps", state)
		case <-time.After(200 * time.Millisecond):
		}
		defer func() { <-waited }()
	}
	s.awaitHistory(ctx, send(dtr.QueryReplica, false), true)
	if got := messages(); got != 2 {
		t.Fatalf("%d messages after three more steps, stored together, want 2", got)
	}
	events, _, err := readHistory(ctx, js, id)
	if err != nil {
		t.Fatal(err)
	}
	var states []dtr.State
	for _, ev := range events {
		states = append(states, ev.State)
	}
	if want := []dtr.State{dtr.New, dtr.CacheChecked, dtr.Resolved, dtr.QueryReplica}; !slices.Equal(states, want) {
		t.Fatalf("history %v, want %v", states, want)
	}
}

func TestAChangeACallerWaitsForIsNotHeldWhileTheHistoryIsGathered(t *testing.T) {
	nc, js := bustest.Server(t)
	ctx := context.Background()
	s, _, stop := startHistoryCoalescing(t, js, time.Hour)
	defer stop()
	s.nc, s.journal = nc, newJournal(js, nil, quiet(), 1<<20, time.Hour, 0)
	// A first step, stored at once; the next store is due in an hour.
	if err := s.carryOut(ctx, []*commit{newStep(nil)}); err != nil {
		t.Fatal(err)
	}
	// A change asked through the API: its caller hears it once its
	// history is stored, which is stored at once, not at the next store
	// due (in an hour), nor given up on after historyAwait.
	c := newStep(func(error) {})
	if err := s.carryOut(ctx, []*commit{c}); err != nil {
		t.Fatal(err)
	}
	if n := s.historyStats.unawaited.Load(); n != 0 {
		t.Fatalf("%d steps went on without their history: the change waited for the history's next store", n)
	}
	if events, _, err := readHistory(ctx, js, c.records[0].id); err != nil || len(events) != 1 {
		t.Fatalf("the change's history: %+v, %v; want its event stored before its caller hears", events, err)
	}
}

func TestAChangeACallerWaitsForIsStoredAtOnceWhileEarlierStepsAreGathered(t *testing.T) {
	s := journaledService(t)
	ctx := context.Background()
	s.historyCoalesce = time.Hour
	stopHistory := s.writeHistory(ctx)
	defer stopHistory()
	commits, failed := make(chan *commit), make(chan error, 1)
	stopped := make(chan struct{})
	go func() { defer close(stopped); s.commitLoop(ctx, commits, failed) }()
	defer func() { close(commits); <-stopped }()
	commits <- newStep(nil) // stored at once; the next store is due in an hour
	time.Sleep(50 * time.Millisecond)
	// A step whose settle waits for its history to be gathered (for the
	// hour, or historyAwait, after which the writer counts as lagging).
	commits <- newStep(nil)
	time.Sleep(50 * time.Millisecond)
	// A change asked through the API behind it: stored at once, and the
	// step before it with it.
	heard := make(chan struct{})
	commits <- newStep(func(error) { close(heard) })
	<-heard
	if n := s.historyStats.unawaited.Load(); n != 0 {
		t.Fatalf("%d steps went on without their history: the change waited behind the gathered step", n)
	}
	w := s.historyWriter.Load()
	if w.lagging.Load() {
		t.Fatal("the writer is lagging: a step waited historyAwait for its history")
	}
	// A caller that waits for history already stored leaves no ask for
	// the next store: the steps after it are gathered again.
	s.awaitHistory(ctx, 1, true)
	if w.urgent.Load() {
		t.Fatal("waiting for history already stored left the next store urgent")
	}
}

func TestAFailedLookupOfTheLastNumberHoldsTheEventsBackInsteadOfNumberingFromOne(t *testing.T) {
	_, js := bustest.Server(t)
	ctx := context.Background()
	id := uuid.New()
	ev := func(i int) api.HistoryEvent {
		return api.HistoryEvent{Time: time.Now(), State: dtr.Transferring, Grant: "g" + string(rune('a'+i))}
	}
	stats := &historyStats{}
	writeEvents(t, &historyWriter{js: js, log: quiet(), stats: stats}, []historyItem{
		{id: id, ev: ev(0), first: true}, {id: id, ev: ev(1)}, {id: id, ev: ev(2)}})

	// The next leader's writer holds a handle whose connection is gone:
	// it cannot read the last number.
	ns, err := nats.Connect(js.Conn().ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	bjs, err := jetstream.New(ns)
	if err != nil {
		t.Fatal(err)
	}
	broken, err := bjs.Stream(ctx, bus.StreamHistory)
	if err != nil {
		t.Fatal(err)
	}
	ns.Close()
	w := &historyWriter{js: js, log: quiet(), stats: stats, next: map[uuid.UUID]numbered{}, stream: broken}
	groups := [][]historyItem{{{id: id, ev: ev(3)}, {id: id, ev: ev(4)}}}
	ok, later := w.publish(ctx, groups)
	if ok || len(later) != 1 || len(later[0]) != 2 {
		t.Fatalf("with the lookup failing: ok %v, held back %v; want both events held back", ok, later)
	}
	if got := stats.written.Load(); got != 3 {
		t.Fatalf("%d events written, want the first 3 only", got)
	}
	// Tried again, with the stream looked up anew: numbered on.
	if ok, later = w.publish(ctx, later); !ok || len(later) != 0 {
		t.Fatalf("tried again: ok %v, held back %v", ok, later)
	}
	events, dropped, err := readHistory(ctx, js, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 5 || dropped != 0 {
		t.Fatalf("%d events, %d dropped; want 5 and none", len(events), dropped)
	}
	for i, e := range events {
		if e.Seq != uint64(i+1) || e.Grant != ev(i).Grant {
			t.Fatalf("event %d: number %d grant %s, want %d %s", i, e.Seq, e.Grant, i+1, ev(i).Grant)
		}
	}
}

func TestATermThatLapsesWhileTheCommitWaitsForHistoryLeavesTheInputsUnacknowledged(t *testing.T) {
	nc, js := bustest.Server(t)
	ctx := context.Background()
	// An input to acknowledge, from a stream of the test's own.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "INPUTS", Subjects: []string{"inputs"}}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateConsumer(ctx, "INPUTS", jetstream.ConsumerConfig{Durable: "in", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "inputs", []byte("x")); err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	input := <-batch.Messages()
	if input == nil {
		t.Fatal("no input")
	}
	// A history store that never answers: the commit waits historyAwait.
	if err := js.DeleteStream(ctx, bus.StreamHistory); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.SubscribeSync(bus.SubjectHistoryPrefix + "*"); err != nil {
		t.Fatal(err)
	}
	s, _, stop := startHistory(t, js)
	defer stop()
	s.nc, s.journal = nc, &journal{}
	// The term holds for a second more: it lapses during the wait.
	s.election = &election{ttl: 4 * time.Second}
	s.election.renewed.Store(time.Now().Add(-2 * time.Second).UnixNano())
	if s.election.lapsed(time.Now()) {
		t.Fatal("lapsed already")
	}
	err = s.carryOut(ctx, []*commit{{acks: []jetstream.Msg{input}, events: []historyItem{{id: uuid.New(), first: true, ev: api.HistoryEvent{Time: time.Now(), State: dtr.New}}}}})
	if !errors.Is(err, errDeposed) {
		t.Fatalf("carried out with %v, want the term found lapsed", err)
	}
	if err := nc.Flush(); err != nil { // any acknowledgement sent reaches the server
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 1 {
		t.Fatalf("%d inputs pending acknowledgement, want the 1 left to the next leader", info.NumAckPending)
	}
}

func TestAStepsHistoryIsStoredOnlyIfItsRecordsWereJournaled(t *testing.T) {
	for _, tt := range []struct {
		name    string
		deposed bool // another leader appended since: the append is refused
	}{
		{"journaled", false},
		{"refused", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nc, js := bustest.Server(t)
			ctx := context.Background()
			s, _, stop := startHistory(t, js)
			defer stop()
			s.nc = nc
			s.journal = newJournal(js, nil, quiet(), 1<<20, time.Hour, 0)
			if tt.deposed {
				s.journal.fenced, s.journal.last = true, 1000
			}
			id := uuid.New()
			c := &commit{records: []record{{id: id, data: []byte(`{"id":"` + id.String() + `"}`)}},
				events: []historyItem{{id: id, first: true, ev: api.HistoryEvent{Time: time.Now(), State: dtr.New, Term: 3}}}}
			err := s.carryOut(ctx, []*commit{c})
			if (err != nil) != tt.deposed {
				t.Fatalf("carried out with %v", err)
			}
			want := map[bool]int{false: 1, true: 0}[tt.deposed]
			if handed := s.history.send(nil); handed != uint64(want) {
				t.Fatalf("%d batches handed to the writer, want %d", handed, want)
			}
			s.awaitHistory(ctx, 1, false) // what was handed over is stored
			events, _, err := readHistory(ctx, js, id)
			if err != nil {
				t.Fatal(err)
			}
			if len(events) != want {
				t.Fatalf("%d events stored, want %d", len(events), want)
			}
		})
	}
}

func TestEventsOfTheSameNumberAreOrderedByTerm(t *testing.T) {
	t0 := time.Now()
	events, _ := tidyHistory([]api.HistoryEvent{
		{Seq: 2, Term: 5, Time: t0, State: dtr.Transfer}, // the next leader's, its clock behind
		{Seq: 1, Term: 4, Time: t0, State: dtr.New},
		{Seq: 2, Term: 4, Time: t0.Add(time.Second), State: dtr.Resolving},
	})
	if len(events) != 3 || events[1].Term != 4 || events[2].Term != 5 {
		t.Fatalf("ordered %+v; want term 4's number 2 before term 5's", events)
	}
}

func TestTheWritersQueueIsBoundedInEvents(t *testing.T) {
	var dropped atomic.Uint64
	var queued atomic.Int64
	r := &historyRecorder{out: make(chan []historyItem, historyQueue), dropped: &dropped, queued: &queued}
	big := make([]historyItem, historyQueueEvents/2+1)
	r.send(big) // one step's many events: taken
	if got := r.send(big); got != 1 || dropped.Load() != uint64(len(big)) {
		t.Fatalf("%d batches handed over, %d events dropped; want the second batch dropped: the queue holds %d events at most",
			got, dropped.Load(), historyQueueEvents)
	}
	if queued.Load() != int64(len(big)) {
		t.Fatalf("%d events counted queued, want %d", queued.Load(), len(big))
	}
}

func TestTheWriterForgetsTheNumbersOfDTRsIdleForAnHour(t *testing.T) {
	now := time.Now()
	idle, busy := uuid.New(), uuid.New()
	w := &historyWriter{next: map[uuid.UUID]numbered{idle: {5, now.Add(-2 * time.Hour)}, busy: {7, now.Add(-time.Minute)}}}
	w.pruneNext(now)
	if _, ok := w.next[idle]; ok {
		t.Fatal("an idle DTR's number is still remembered")
	}
	if n, ok := w.next[busy]; !ok || n.n != 7 {
		t.Fatal("a busy DTR's number was forgotten")
	}
}

// The figures of docs/operations.md's "How much it keeps": what the
// histories of DTRs that go straight through take in the stream, each
// step's events stored as one message a DTR (as a busy leader does).
func TestAStraightThroughDTRsHistoryTakesUnderFourKilobytes(t *testing.T) {
	_, js := bustest.Server(t)
	r := newCoreRun(t, core.DefaultConfig())
	const n = 200
	for i := range n {
		d := testDTR(i % 20)
		d.Share = "atlas"
		if err := r.c.Submit(r.now, d); err != nil {
			t.Fatal(err)
		}
		r.rec.arrived(d.ID)
	}
	for range 200 {
		for _, g := range r.step(100 * time.Millisecond) {
			r.answer(g, nil)
		}
	}
	var items []historyItem
	w := &historyWriter{js: js, log: quiet(), stats: &historyStats{}, next: map[uuid.UUID]numbered{}}
	for {
		select {
		case b := <-r.out:
			items = append(items, b...)
			var h heldEvents
			h.add(b)
			w.publish(context.Background(), h.take())
			continue
		default:
		}
		break
	}
	done := 0
	for _, it := range items {
		if it.ev.State == dtr.Done {
			done++
		}
	}
	st, err := js.Stream(context.Background(), bus.StreamHistory)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if done != n {
		t.Fatalf("%d of %d DTRs done", done, n)
	}
	perDTR := info.State.Bytes / n
	t.Logf("%d DTRs: %d events in %d messages, %d bytes: %d bytes an event, %d a DTR",
		n, len(items), info.State.Msgs, info.State.Bytes, info.State.Bytes/uint64(len(items)), perDTR)
	if perDTR >= 4096 {
		t.Fatalf("%d bytes a DTR's history, want under 4 KiB (docs/operations.md)", perDTR)
	}
}

func TestOneAcknowledgementStandsForAHundredMessagesOfHistory(t *testing.T) {
	for _, tt := range []struct {
		name   string
		dtrs   int
		delete bool // the stream is gone: nothing acknowledged
		acks   int
	}{
		{"one DTR", 1, false, 1},
		{"250 DTRs", 250, false, 4},           // the first, each hundredth, the last
		{"250 DTRs, no stream", 250, true, 0}, // "no responders" goes to the publisher alone
	} {
		t.Run(tt.name, func(t *testing.T) {
			nc, js := bustest.Server(t)
			ctx := context.Background()
			if tt.delete {
				if err := js.DeleteStream(ctx, bus.StreamHistory); err != nil {
					t.Fatal(err)
				}
			}
			// The replies to the writer's publishes, on a connection of
			// its own.
			watch, err := nats.Connect(nc.ConnectedUrl())
			if err != nil {
				t.Fatal(err)
			}
			defer watch.Close()
			acks, err := watch.SubscribeSync(nats.InboxPrefix + ">")
			if err != nil {
				t.Fatal(err)
			}
			if err := watch.Flush(); err != nil {
				t.Fatal(err)
			}
			items := make([]historyItem, tt.dtrs)
			for i := range items {
				items[i] = historyItem{id: uuid.New(), first: true, ev: api.HistoryEvent{Time: time.Now(), State: dtr.New}}
			}
			stats := &historyStats{}
			w := &historyWriter{js: js, log: quiet(), stats: stats, next: map[uuid.UUID]numbered{}}
			ok, later := w.publish(ctx, [][]historyItem(slices.Collect(func(yield func([]historyItem) bool) {
				for i := range items {
					if !yield(items[i : i+1]) {
						return
					}
				}
			})))
			if len(later) != 0 || ok == tt.delete {
				t.Fatalf("stored: %v, held back %d; want stored %v", ok, len(later), !tt.delete)
			}
			want := uint64(tt.dtrs)
			if tt.delete {
				want = 0
			}
			if stats.written.Load() != want || stats.messages.Load() != want || stats.droppedStore.Load() != uint64(tt.dtrs)-want {
				t.Fatalf("written %d in %d messages, %d dropped; want %d written", stats.written.Load(), stats.messages.Load(), stats.droppedStore.Load(), want)
			}
			if err := watch.Flush(); err != nil {
				t.Fatal(err)
			}
			if n, _, _ := acks.Pending(); n != tt.acks {
				t.Fatalf("%d replies to %d messages, want %d", n, tt.dtrs, tt.acks)
			}
			if tt.delete {
				return
			}
			for _, it := range items {
				if events, _, err := readHistory(ctx, js, it.id); err != nil || len(events) != 1 {
					t.Fatalf("%s: %d events (%v), want its one", it.id, len(events), err)
				}
			}
		})
	}
}

func TestMessagesOfHistoryLostBeforeAnAcknowledgedOneCountAsDropped(t *testing.T) {
	_, js := bustest.Server(t)
	ctx := context.Background()
	// The stream is gone as the store begins, and back 100 ms later (a
	// stream changing leader): the plain messages sent meanwhile are
	// lost, while nats.go sends each asking one again after "no
	// responders", and it is stored.
	if err := js.DeleteStream(ctx, bus.StreamHistory); err != nil {
		t.Fatal(err)
	}
	back := make(chan error, 1)
	go func() {
		time.Sleep(100 * time.Millisecond)
		back <- bus.Ensure(ctx, js, bus.Setup{})
	}()
	groups := make([][]historyItem, 250)
	for i := range groups {
		groups[i] = []historyItem{{id: uuid.New(), first: true, ev: api.HistoryEvent{Time: time.Now(), State: dtr.New}}}
	}
	stats := &historyStats{}
	w := &historyWriter{js: js, log: quiet(), stats: stats, next: map[uuid.UUID]numbered{}}
	w.publish(ctx, groups)
	if err := <-back; err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, bus.StreamHistory)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	written, dropped := stats.written.Load(), stats.droppedStore.Load()
	if written > info.State.Msgs || written+dropped != uint64(len(groups)) {
		t.Fatalf("%d counted written and %d dropped of %d, where the stream holds %d", written, dropped, len(groups), info.State.Msgs)
	}
}

func TestHeldEventsComeOutOneGroupADTRInTheOrderTheyCame(t *testing.T) {
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	it := func(id uuid.UUID, st dtr.State) historyItem {
		return historyItem{id: id, ev: api.HistoryEvent{State: st}}
	}
	cases := []struct {
		name    string
		batches [][]historyItem
		want    [][]dtr.State // by DTR, in the order each first came
	}{
		{"one DTR, one event", [][]historyItem{{it(a, dtr.New)}}, [][]dtr.State{{dtr.New}}},
		{"three DTRs interleaved over three steps",
			[][]historyItem{{it(a, dtr.New), it(b, dtr.New)}, {it(a, dtr.CacheChecked), it(c, dtr.New)}, {it(b, dtr.Resolved), it(a, dtr.QueryReplica)}},
			[][]dtr.State{{dtr.New, dtr.CacheChecked, dtr.QueryReplica}, {dtr.New, dtr.Resolved}, {dtr.New}}},
	}
	var h heldEvents // used again after each take, as the writer does
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			total := 0
			for _, batch := range tc.batches {
				h.add(batch)
				total += len(batch)
			}
			if h.n != total {
				t.Fatalf("%d events held, want %d", h.n, total)
			}
			groups := h.take()
			var got [][]dtr.State
			for _, g := range groups {
				var states []dtr.State
				for _, e := range g {
					if e.id != g[0].id {
						t.Fatalf("a group holds events of DTRs %s and %s", g[0].id, e.id)
					}
					states = append(states, e.ev.State)
				}
				got = append(got, states)
			}
			if !slices.EqualFunc(got, tc.want, slices.Equal[[]dtr.State]) {
				t.Fatalf("groups %v, want %v", got, tc.want)
			}
			if h.n != 0 || len(h.take()) != 0 {
				t.Fatal("events still held after they were taken")
			}
		})
	}
}
