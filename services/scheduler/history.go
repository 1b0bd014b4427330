package scheduler

// Every DTR's history: the leader records each change of a DTR's state, and
// of what holds it in a state, as an event in the stream SLUICE_HISTORY
// (pkg/bus/history.go), one subject per DTR. The loop only builds the
// events of a step and hands them over (historyRecorder); a goroutine of
// its own numbers and publishes them in batches (historyWriter), so that a
// slow or full store never holds a step. `sluice history` reads them
// (readHistory).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"golang.org/x/sync/errgroup"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// historyItem is an event on its way to the store.
type historyItem struct {
	id uuid.UUID
	ev api.HistoryEvent
	// first: the DTR's first event (it was submitted in this term), so
	// numbering starts at 1 without asking the store; final: its last.
	first, final bool
	// ranBy is the id of the worker that sent the result of the grant
	// that ended (ev.Ended), if known: the writer names the worker.
	ranBy string
}

// recorded is what the recorder last wrote of an unfinished DTR.
type recorded struct {
	state dtr.State
	hold  core.Hold
	grant string
	err   string
}

// historyRecorder turns the core's decisions into history events. It runs
// on the scheduling loop and does no I/O: each step's events go to the
// writer in one hand-over, dropped and counted if the writer is behind.
type historyRecorder struct {
	last map[uuid.UUID]recorded
	out  chan<- []historyItem
	// dropped counts the events the writer had no room for.
	dropped *atomic.Uint64
	// ranBy holds the worker that sent each result of the step (grant →
	// worker id), arrivals the DTRs submitted in it; step clears both.
	ranBy    map[string]string
	arrivals map[uuid.UUID]bool
}

// resultsFrom notes the worker that sent results: their CloudEvent's
// source, sluice/<stage>/<worker id>.
func (r *historyRecorder) resultsFrom(source string, rs []api.Result) {
	parts := strings.SplitN(source, "/", 3)
	if len(parts) != 3 || parts[2] == "" {
		return
	}
	if r.ranBy == nil {
		r.ranBy = map[string]string{}
	}
	for _, res := range rs {
		r.ranBy[res.Grant] = parts[2]
	}
}

// workerName names the worker that held a grant (role@host (pid N)): the
// one whose heartbeats or renewals named it, else the one that sent its
// result (ranBy), known from its heartbeats or by its id alone; "" if
// none is known. The history's writer asks it, off the loop.
func (s *Service) workerName(grant, ranBy string) string {
	now := time.Now()
	if h, ok := s.workers.holderOf(grant, now); ok {
		return h.String()
	}
	if ranBy == "" {
		return ""
	}
	if h, ok := s.workers.byID(ranBy, now); ok {
		return h.String()
	}
	return "worker " + ranBy
}

// byID returns a worker heard from by its id.
func (t *workerTracker) byID(id string, now time.Time) (api.Holder, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, w := range t.seen {
		if k.worker == id {
			return t.holder(w, now), true
		}
	}
	return api.Holder{}, false
}

// arrived notes a DTR submitted in this step: its history begins.
func (r *historyRecorder) arrived(id uuid.UUID) {
	if r.arrivals == nil {
		r.arrivals = map[uuid.UUID]bool{}
	}
	r.arrivals[id] = true
}

func errText(f *dtr.Failure) string {
	if f == nil {
		return ""
	}
	return string(f.Kind) + ": " + f.Text
}

// step records the DTRs a step changed: a new state, a new error, a new
// grant. changed are the core's (read before it is called again), term
// the leader's. Of a DTR not seen before in this term and not submitted
// in this step (the last leader's), the state before is not known here:
// the reader takes it from the event before.
func (r *historyRecorder) step(now time.Time, c *core.Core, changed []*dtr.DTR, term uint64) {
	defer clear(r.ranBy)
	defer clear(r.arrivals)
	if len(changed) == 0 || r.out == nil {
		return
	}
	if r.last == nil {
		r.last = map[uuid.UUID]recorded{}
	}
	ids := make([]uuid.UUID, 0, len(changed))
	for _, d := range changed {
		if !d.State.Final() {
			ids = append(ids, d.ID)
		}
	}
	holds := make(map[uuid.UUID]core.Standing, len(ids))
	c.StandingsOf(ids, func(st core.Standing) { holds[st.DTR] = st })
	var items []historyItem
	for _, d := range changed {
		prev, known := r.last[d.ID]
		st := holds[d.ID]
		cur := recorded{state: d.State, hold: st.Hold, grant: d.Grant, err: errText(d.Error)}
		if known && cur == prev {
			continue // a priority, say: no event
		}
		at := d.Updated
		if at.IsZero() {
			at = now
		}
		ev := api.HistoryEvent{Time: at, State: d.State, Hold: string(st.Hold), Until: st.Until,
			Bytes: d.Bytes, Attempts: d.Attempts, Share: d.Share, Priority: d.Priority, Term: term}
		if d.State.IsActive() {
			ev.Grant = d.Grant
		}
		var ranBy string
		if known {
			ev.From = prev.state.String()
			if prev.state.IsActive() && prev.grant != "" {
				ev.Ended, ranBy = prev.grant, r.ranBy[prev.grant]
			}
		}
		if d.Error != nil && (!known || cur.err != prev.err) {
			f := *d.Error
			ev.Error = &f
		}
		// A DTR submitted in this step: if it moved on at once, its
		// arrival is an event of its own.
		first := !known && r.arrivals[d.ID]
		if first && d.State != dtr.New {
			arrived := d.Created
			if arrived.IsZero() || arrived.After(at) {
				arrived = at
			}
			items = append(items, historyItem{id: d.ID, first: true, ev: api.HistoryEvent{Time: arrived, State: dtr.New,
				Share: d.Share, Priority: d.Priority, Term: term}})
			first = false
			ev.From = dtr.New.String()
		}
		it := historyItem{id: d.ID, ev: ev, first: first, final: d.State.Final(), ranBy: ranBy}
		items = append(items, it)
		if it.final {
			delete(r.last, d.ID)
		} else {
			r.last[d.ID] = cur
		}
	}
	r.send(items)
}

// held records, from the periodic sweep, a change of what holds a DTR
// that the steps did not record: from one kind of wait to another (a
// full endpoint, the staging limit, the slots), not between the reasons
// of the slot split, which change with every grant.
func (r *historyRecorder) held(now time.Time, st core.Standing, term uint64) (historyItem, bool) {
	if r.out == nil {
		return historyItem{}, false // not recorded
	}
	if r.last == nil {
		r.last = map[uuid.UUID]recorded{}
	}
	prev, known := r.last[st.DTR]
	if !known { // the last leader's: remembered from here on
		r.last[st.DTR] = recorded{state: st.State, hold: st.Hold, grant: st.Grant}
		return historyItem{}, false
	}
	if prev.state == st.State && holdKind(prev.hold) == holdKind(st.Hold) {
		return historyItem{}, false
	}
	from := prev.state
	prev.state, prev.hold = st.State, st.Hold
	r.last[st.DTR] = prev
	return historyItem{id: st.DTR, ev: api.HistoryEvent{Time: now, From: from.String(), State: st.State,
		Hold: string(st.Hold), Until: st.Until, Term: term}}, true
}

// holdKind groups the holds of the slot split together.
func holdKind(h core.Hold) core.Hold {
	switch h {
	case core.HoldNoSlot, core.HoldStateFull, core.HoldShareFull, core.HoldFreeSlot:
		return "slots"
	}
	return h
}

// send hands items to the writer, or drops and counts them if it is
// behind.
func (r *historyRecorder) send(items []historyItem) {
	if len(items) == 0 || r.out == nil {
		return
	}
	select {
	case r.out <- items:
	default:
		r.dropped.Add(uint64(len(items)))
	}
}

// forget drops what is remembered of DTRs no longer in the core (a
// standby's copy rebuilt, say).
func (r *historyRecorder) forget(keep func(uuid.UUID) bool) {
	for id := range r.last {
		if !keep(id) {
			delete(r.last, id)
		}
	}
}

// historyStats are the history's counters, read by the metrics.
type historyStats struct {
	// written counts the events stored, messages the messages they took.
	written, messages atomic.Uint64
	// dropped by cause: the writer behind (queue), a store that refused
	// (store), the oldest events dropped by a full stream (full).
	droppedQueue, droppedStore, droppedFull atomic.Uint64
	// bytes and limit are the stream's size and its most bytes, as last
	// seen; full is 1 while it is dropping its oldest events.
	bytes, limit, full atomic.Int64
}

// historyWriter numbers a leader's events per DTR and publishes them in
// batches.
type historyWriter struct {
	js jetstream.JetStream
	// name names the worker of a grant that ended (Service.workerName).
	name      func(grant, ranBy string) string
	log       *slog.Logger
	retention time.Duration
	in        <-chan []historyItem
	stats     *historyStats
	// next is the number of each unfinished DTR's last event.
	next map[uuid.UUID]uint64
	// lastSeq and msgs are the stream's as last seen (looked: once seen).
	lastSeq, msgs uint64
	looked        bool
	// logged is when a store failure was last logged (Unix ns).
	logged int64
}

// historyBatchMax is the most events the writer holds before it
// publishes them; historyFlushEvery how long it holds them at most. Held
// a moment, a DTR's events of several steps go out as one message.
const (
	historyBatchMax   = 20000
	historyFlushEvery = time.Second
)

// historyQueue is how many steps' events may wait for the writer.
const historyQueue = 1024

// heldEvents are the events waiting to be published, by DTR in the order
// they first came.
type heldEvents struct {
	byDTR map[uuid.UUID][]historyItem
	order []uuid.UUID
	n     int
}

func (h *heldEvents) add(items []historyItem) {
	if h.byDTR == nil {
		h.byDTR = map[uuid.UUID][]historyItem{}
	}
	for _, it := range items {
		if _, ok := h.byDTR[it.id]; !ok {
			h.order = append(h.order, it.id)
		}
		h.byDTR[it.id] = append(h.byDTR[it.id], it)
		h.n++
	}
}

// take returns the events held, one group per DTR, and holds none.
func (h *heldEvents) take() [][]historyItem {
	out := make([][]historyItem, 0, len(h.order))
	for _, id := range h.order {
		out = append(out, h.byDTR[id])
	}
	h.byDTR, h.order, h.n = nil, nil, 0
	return out
}

// run publishes what comes in, each DTR's events of up to
// historyFlushEvery in one message, until in is closed (what it holds is
// published then) or ctx ends, and looks at the stream's size every 10 s.
func (w *historyWriter) run(ctx context.Context) {
	if w.next == nil {
		w.next = map[uuid.UUID]uint64{}
	}
	look := time.NewTicker(10 * time.Second)
	defer look.Stop()
	flush := time.NewTicker(historyFlushEvery)
	defer flush.Stop()
	w.look(ctx)
	var held heldEvents
	for {
		select {
		case <-ctx.Done():
			return
		case <-look.C:
			w.look(ctx)
		case <-flush.C:
			w.publish(ctx, held.take())
		case items, ok := <-w.in:
			if !ok {
				w.publish(ctx, held.take())
				return
			}
			held.add(items)
			if held.n >= historyBatchMax {
				w.publish(ctx, held.take())
			}
		}
	}
}

// publish numbers and stores groups of events, one message per group (one
// DTR's), historyAcksMax messages at a time. What the store refuses is
// counted and dropped: history never holds scheduling.
func (w *historyWriter) publish(ctx context.Context, groups [][]historyItem) {
	for len(groups) > 0 && ctx.Err() == nil {
		n := min(len(groups), historyAcksMax)
		w.publishSome(ctx, groups[:n])
		groups = groups[n:]
	}
}

// historyAcksMax is the most messages published before their
// acknowledgements are awaited (within nats.go's limit of pending
// asynchronous publishes).
const historyAcksMax = 1000

func (w *historyWriter) publishSome(ctx context.Context, groups [][]historyItem) {
	var ttl string
	if w.retention > 0 {
		ttl = strconv.FormatInt(int64(max(w.retention, time.Second)/time.Second), 10) + "s"
	}
	type sent struct {
		f      jetstream.PubAckFuture
		events int
	}
	futures := make([]sent, 0, len(groups))
	last := w.lastNumbers(ctx, groups)
	for _, group := range groups {
		id := group[0].id
		n, ok := w.next[id]
		if !ok {
			n = last[id]
		}
		rec := api.HistoryRecord{Events: make([]api.HistoryEvent, len(group))}
		for i, it := range group {
			n++
			it.ev.Seq = n
			if it.ev.Ended != "" && it.ev.Worker == "" && w.name != nil {
				it.ev.Worker = w.name(it.ev.Ended, it.ranBy)
			}
			if i > 0 && it.ev.Share == group[i-1].ev.Share && it.ev.Priority == group[i-1].ev.Priority {
				// Stored once a message while they stay (the reader
				// fills them in).
				it.ev.Share, it.ev.Priority = "", 0
			}
			rec.Events[i] = it.ev
		}
		if group[len(group)-1].final {
			delete(w.next, id)
		} else {
			w.next[id] = n
		}
		m := nats.NewMsg(bus.HistorySubject(id.String()))
		var err error
		if m.Data, err = codec.EncodeJSON(rec); err != nil {
			w.stats.droppedStore.Add(uint64(len(group)))
			continue
		}
		if ttl != "" {
			m.Header.Set(jetstream.MsgTTLHeader, ttl)
		}
		f, err := w.js.PublishMsgAsync(m)
		if err != nil {
			w.stats.droppedStore.Add(uint64(len(group)))
			w.logFailure(err)
			continue
		}
		futures = append(futures, sent{f, len(group)})
	}
	wait := time.NewTimer(10 * time.Second)
	defer wait.Stop()
	for _, f := range futures {
		select {
		case <-f.f.Ok():
			w.stats.written.Add(uint64(f.events))
			w.stats.messages.Add(1)
		case err := <-f.f.Err():
			w.stats.droppedStore.Add(uint64(f.events))
			w.logFailure(err)
		case <-wait.C:
			w.stats.droppedStore.Add(uint64(f.events))
		case <-ctx.Done():
			return
		}
	}
}

// logFailure logs a failure to store history, once a minute at most.
func (w *historyWriter) logFailure(err error) {
	now := time.Now().UnixNano()
	if now-w.logged > int64(time.Minute) {
		w.logged = now
		w.log.Warn("history events not stored (counted in sluice_scheduler_history_dropped); scheduling goes on", "err", err)
	}
}

// lastNumbers looks up, 32 at a time, the numbers of the last events
// stored of the DTRs of groups that this writer has not numbered and that
// were not submitted in this term (recorded by an earlier leader).
func (w *historyWriter) lastNumbers(ctx context.Context, groups [][]historyItem) map[uuid.UUID]uint64 {
	var ids []uuid.UUID
	for _, g := range groups {
		if _, ok := w.next[g[0].id]; !ok && !g[0].first {
			ids = append(ids, g[0].id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	out := make(map[uuid.UUID]uint64, len(ids))
	var mu sync.Mutex
	var g errgroup.Group
	g.SetLimit(32)
	for _, id := range ids {
		g.Go(func() error {
			n := w.lastNumber(ctx, id)
			mu.Lock()
			out[id] = n
			mu.Unlock()
			return nil
		})
	}
	_ = g.Wait()
	return out
}

// lastNumber is the number of the last event stored of a DTR (recorded by
// an earlier leader), 0 if none.
func (w *historyWriter) lastNumber(ctx context.Context, id uuid.UUID) uint64 {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := w.js.Stream(ctx, bus.StreamHistory)
	if err != nil {
		return 0
	}
	m, err := st.GetLastMsgForSubject(ctx, bus.HistorySubject(id.String()))
	if err != nil {
		return 0
	}
	var rec api.HistoryRecord
	if json.Unmarshal(m.Data, &rec) != nil || len(rec.Events) == 0 {
		return 0
	}
	return rec.Events[len(rec.Events)-1].Seq
}

// look reads the stream's size and, while it is full, counts the oldest
// events it dropped: the messages gone since the last look (an estimate:
// a message may hold several events, and messages that expired with their
// DTR's record, or that a DTR's own limit pushed out, count too while the
// stream is full).
func (w *historyWriter) look(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := w.js.Stream(ctx, bus.StreamHistory)
	if err != nil {
		return
	}
	info := st.CachedInfo()
	state, limit := info.State, info.Config.MaxBytes
	w.stats.bytes.Store(int64(state.Bytes))
	w.stats.limit.Store(limit)
	full := limit > 0 && int64(state.Bytes) >= limit-limit/20
	if full {
		w.stats.full.Store(1)
	} else {
		w.stats.full.Store(0)
	}
	if w.looked && full && state.LastSeq >= w.lastSeq {
		added := state.LastSeq - w.lastSeq
		if gone := int64(w.msgs) + int64(added) - int64(state.Msgs); gone > 0 {
			w.stats.droppedFull.Add(uint64(gone))
		}
	}
	w.lastSeq, w.msgs, w.looked = state.LastSeq, state.Msgs, true
}

// errNoHistory says a DTR has no history kept.
var errNoHistory = errors.New("no history kept")

// readHistory reads a DTR's events, the oldest first, without the
// duplicates a step taken again leaves, and counts those dropped.
func readHistory(ctx context.Context, js jetstream.JetStream, id uuid.UUID) (events []api.HistoryEvent, dropped uint64, err error) {
	st, err := js.Stream(ctx, bus.StreamHistory)
	if err != nil {
		return nil, 0, fmt.Errorf("history of %s: %w", id, err)
	}
	subject := bus.HistorySubject(id.String())
	seq := uint64(1)
	for range 4 * bus.HistoryPerDTR { // the stream keeps 64 a subject
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, 0, fmt.Errorf("history of %s: %w", id, err)
		}
		seq = m.Sequence + 1
		var rec api.HistoryRecord
		if json.Unmarshal(m.Data, &rec) == nil {
			events = append(events, rec.Events...)
		}
	}
	events, dropped = tidyHistory(events)
	if extra := len(events) - bus.HistoryPerDTR; extra > 0 {
		events, dropped = events[extra:], dropped+uint64(extra)
	}
	return events, dropped, nil
}

// tidyHistory orders events by their number, leaves out repeats (an event
// recorded again by a step taken again after a crash or a take-over: the
// same state, hold, grant and error as the one before it) and counts the
// numbers missing (dropped).
func tidyHistory(events []api.HistoryEvent) ([]api.HistoryEvent, uint64) {
	slices.SortStableFunc(events, func(a, b api.HistoryEvent) int {
		if a.Seq != b.Seq {
			if a.Seq < b.Seq {
				return -1
			}
			return 1
		}
		return a.Time.Compare(b.Time)
	})
	var out []api.HistoryEvent
	var dropped uint64
	var prevSeq uint64
	for _, ev := range events {
		if ev.Seq > prevSeq+1 {
			dropped += ev.Seq - prevSeq - 1
		}
		if ev.Seq > prevSeq {
			prevSeq = ev.Seq
		}
		if n := len(out); n > 0 && sameEvent(out[n-1], ev) {
			continue
		}
		if n := len(out); n > 0 && ev.From == "" {
			ev.From = out[n-1].State.String()
		}
		if n := len(out); n > 0 && ev.Share == "" && ev.Priority == 0 {
			ev.Share, ev.Priority = out[n-1].Share, out[n-1].Priority
		}
		out = append(out, ev)
	}
	return out, dropped
}

// sameEvent says two events record the same thing.
func sameEvent(a, b api.HistoryEvent) bool {
	return a.State == b.State && a.Hold == b.Hold && a.Grant == b.Grant && a.Ended == b.Ended && errText(a.Error) == errText(b.Error)
}

// writeHistory starts the writer of a term's history and returns what
// stops it: the events handed over are stored first, for up to 5 s.
func (s *Service) writeHistory(ctx context.Context) (stop func()) {
	s.history.last = nil
	if s.cfg.HistoryOff {
		s.history.out = nil
		return func() {}
	}
	in := make(chan []historyItem, historyQueue)
	s.history.out = in
	s.history.last = map[uuid.UUID]recorded{}
	s.sweptAt = time.Time{}
	// A connection of its own, so that grants never queue behind a
	// burst of history.
	js, closeConn := s.js, func() {}
	if nc, err := s.nc.Opts.Connect(); err != nil {
		s.log.Warn("history: no connection of its own; sharing the scheduler's", "err", err)
	} else if hjs, err := jetstream.New(nc); err != nil {
		nc.Close()
	} else {
		js, closeConn = hjs, nc.Close
	}
	w := &historyWriter{js: js, log: s.log, retention: s.cfg.Retention, in: in, stats: s.historyStats, name: s.workerName}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(wctx)
	}()
	return func() {
		s.history.out = nil
		close(in)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
		cancel()
		<-done
		closeConn()
	}
}

// handleHistory answers sluice.api.history: a DTR's history, to its owner
// or an administrator; for anyone else, as for a DTR never seen or whose
// record has expired, the DTR is unknown.
func (s *Service) handleHistory(r micro.Request) {
	c, ok := s.requester(r, api.SubjectHistory, auth.ScopeRead)
	if !ok {
		return
	}
	id, err := uuid.Parse(strings.TrimSpace(string(r.Data())))
	if err != nil {
		_ = r.Error("400", fmt.Sprintf("DTR id %q is not a UUID", r.Data()), nil)
		return
	}
	reply, code, err := s.historyOf(context.Background(), id, c.Owns)
	if code == 404 {
		unknown(r, c, "DTR "+id.String()+" (never submitted, or its record has expired)")
		return
	}
	if err != nil {
		_ = r.Error(strconv.Itoa(code), err.Error(), nil)
		return
	}
	_ = r.RespondJSON(reply)
}

// historyOf reads the history of a DTR that owns says is the caller's
// (nil: anyone's); 404 if it is unknown or not the caller's, 503 if the
// store could not be read.
func (s *Service) historyOf(ctx context.Context, id uuid.UUID, owns func(dtr.Identity) bool) (api.HistoryReply, int, error) {
	d, _, _, from := s.lookupDTR(ctx, id)
	if from == "" || owns != nil && !owns(d.Owner) {
		return api.HistoryReply{}, 404, fmt.Errorf("%w: %s", core.ErrUnknownDTR, id)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	events, dropped, err := readHistory(ctx, s.js, id)
	if err != nil {
		return api.HistoryReply{}, 503, err
	}
	if events == nil {
		events = []api.HistoryEvent{}
	}
	return api.HistoryReply{DTR: id, State: d.State, Events: events, Dropped: dropped}, 200, nil
}

// serveHistory answers GET /api/history/{id}: the DTR's history for the
// web page, its error texts redacted; 404 for an unknown DTR.
func (s *Service) serveHistory(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, webError{fmt.Sprintf("DTR id %q is not a UUID", r.PathValue("id"))})
		return
	}
	if !s.ready.Load() {
		writeJSON(w, http.StatusServiceUnavailable, webError{"the scheduler is not running now (starting, recovering or stopping); try again"})
		return
	}
	type answer struct {
		reply api.HistoryReply
		code  int
		err   error
	}
	ch := make(chan answer, 1)
	go func() { // the loop answers between two steps; a stuck loop must not hold the page
		var a answer
		a.reply, a.code, a.err = s.historyOf(context.WithoutCancel(r.Context()), id, nil)
		ch <- a
	}()
	var a answer
	select {
	case a = <-ch:
	case <-time.After(dtrLookupTimeout):
		writeJSON(w, http.StatusServiceUnavailable, webError{fmt.Sprintf("the scheduler did not look DTR %s up within %s (its loop is busy or stuck); try again", id, dtrLookupTimeout)})
		return
	}
	switch {
	case a.code == http.StatusNotFound:
		writeJSON(w, http.StatusNotFound, webError{fmt.Sprintf("DTR %s is not known to the scheduler: never submitted, or it ended and its record and history are gone (both are kept for SLUICE_RETENTION)", id)})
		return
	case a.err != nil:
		writeJSON(w, a.code, webError{a.err.Error()})
		return
	}
	for i := range a.reply.Events {
		if e := a.reply.Events[i].Error; e != nil {
			redacted := *e
			redacted.Text = dtr.RedactText(e.Text)
			a.reply.Events[i].Error = &redacted
		}
	}
	writeJSON(w, http.StatusOK, a.reply)
}
