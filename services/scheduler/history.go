package scheduler

// Every DTR's history: the leader records each change of a DTR's state, and
// of what holds it in a state, as an event in the stream SLUICE_HISTORY
// (pkg/bus/history.go), one subject per DTR. The loop only builds the
// events of a step and hands them over (historyRecorder); a goroutine of
// its own numbers and publishes them in batches (historyWriter,
// historywriter.go), so that a slow or full store never holds a step.
// `sluice history` and the web page read them (readHistory; historyapi.go).

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
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

// lastRecorded is what the recorder keeps of each unfinished DTR, a million
// of them with a deep queue: its state and hold in two bytes, the hold as
// 1 + its number in holds (0: none, or one kept in more). A DTR with a
// grant, an error or a hold not numbered has the rest in more.
type lastRecorded struct {
	state dtr.State
	hold  uint8
}

// recordedHolds are the holds a lastRecorded numbers.
var recordedHolds = []core.Hold{core.HoldRunning, core.HoldRetry, core.HoldCache, core.HoldRouting, core.HoldEndpoint,
	core.HoldLink, core.HoldActivity, core.HoldMaxPrepared, core.HoldNoSlot, core.HoldStateFull, core.HoldShareFull, core.HoldFreeSlot}

// lastOf returns what the recorder last wrote of a DTR.
func (r *historyRecorder) lastOf(id uuid.UUID) (recorded, bool) {
	l, ok := r.last[id]
	if !ok {
		return recorded{}, false
	}
	if l.hold == 0 {
		if m, ok := r.more[id]; ok {
			m.state = l.state
			return m, true
		}
		return recorded{state: l.state}, true
	}
	rec := recorded{state: l.state, hold: recordedHolds[l.hold-1]}
	if m, ok := r.more[id]; ok {
		rec.grant, rec.err = m.grant, m.err
	}
	return rec, true
}

// setLast keeps what the recorder wrote of a DTR.
func (r *historyRecorder) setLast(id uuid.UUID, rec recorded) {
	if r.last == nil {
		r.last, r.more = map[uuid.UUID]lastRecorded{}, map[uuid.UUID]recorded{}
	}
	l := lastRecorded{state: rec.state}
	if i := slices.Index(recordedHolds, rec.hold); i >= 0 {
		l.hold = uint8(i + 1)
	}
	r.last[id] = l
	if rec.grant != "" || rec.err != "" || (l.hold == 0 && rec.hold != "") {
		r.more[id] = rec
	} else {
		delete(r.more, id)
	}
}

// forgetLast forgets a DTR that ended.
func (r *historyRecorder) forgetLast(id uuid.UUID) {
	delete(r.last, id)
	delete(r.more, id)
}

// historyRecorder turns the core's decisions into history events. It runs
// on the scheduling loop and does no I/O: each step's events go with the
// step's commit, and the committer hands them to the writer in one
// hand-over once the step's records are journaled (a step refused, by a
// deposed leader say, records no history), dropped and counted if the
// writer is behind.
type historyRecorder struct {
	// last and more hold what it last wrote of each unfinished DTR
	// (lastOf, setLast).
	last map[uuid.UUID]lastRecorded
	more map[uuid.UUID]recorded
	out  chan<- []historyItem
	// sent counts the batches handed to this term's writer: a step's
	// inputs are acknowledged once its batch is stored (awaitHistory).
	// The loop (the sweep) and the committer send: mu guards it.
	mu   sync.Mutex
	sent uint64
	// dropped counts the events the writer had no room for; queued, if
	// set, the events handed over and not yet taken by the writer.
	dropped *atomic.Uint64
	queued  *atomic.Int64
	// ranBy holds the worker that sent each result of the step (grant →
	// worker id), arrivals the DTRs submitted in it; step clears both.
	ranBy    map[string]string
	arrivals map[uuid.UUID]bool
	// swept is set once the term's first sweep is over (held).
	swept bool
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
		if res.Then != nil {
			r.ranBy[res.Then.Grant] = parts[2] // a chained grant's next step, run by the same worker
		}
	}
}

// workerNames returns what names the worker that held a grant (role@host
// (pid N)): the one whose heartbeats or renewals named it, else the one
// that sent its result (ranBy), known from its heartbeats or by its id
// alone; "" if none is known. It looks at the workers heard from once, for
// a batch of events: the history's writer asks it, off the loop.
func (s *Service) workerNames() func(grant, ranBy string) string {
	byGrant, byID := s.workers.names(time.Now())
	return func(grant, ranBy string) string {
		if name, ok := byGrant[grant]; ok {
			return name
		}
		if ranBy == "" {
			return ""
		}
		if name, ok := byID[ranBy]; ok {
			return name
		}
		return "worker " + ranBy
	}
}

// names returns the name of the worker holding each grant (the one heard
// from last where two claim it, as holderOf) and of each worker by its id.
func (t *workerTracker) names(now time.Time) (byGrant, byID map[string]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forget(now)
	byGrant, byID = map[string]string{}, make(map[string]string, len(t.seen))
	heard := map[string]time.Time{}
	for k, w := range t.seen {
		name := t.holder(w, now).String()
		byID[k.worker] = name
		for grant := range w.holds {
			if last, ok := heard[grant]; !ok || last.Before(w.last) {
				heard[grant], byGrant[grant] = w.last, name
			}
		}
	}
	return byGrant, byID
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

// step returns the events of the DTRs a step changed: a new state, a new
// error, a new grant, to be sent once the step is committed. changed are the core's (read before it is called again), term
// the leader's; chained are the PRE_CLEAN grants that chained grants'
// workers ran and whose results the step applied, each recorded as
// granted (PRE_CLEANING, from the query's grant) and then ended by the
// DTR's next event, as if it had been granted on its own. Of a DTR not seen before in this term and not submitted
// in this step (the last leader's), the state before is not known here:
// the reader takes it from the event before.
func (r *historyRecorder) step(now time.Time, c *core.Core, changed []*dtr.DTR, chained []core.Grant, term uint64) []historyItem {
	defer clear(r.ranBy)
	defer clear(r.arrivals)
	if len(changed) == 0 || r.out == nil {
		return nil
	}
	ids := make([]uuid.UUID, 0, len(changed))
	for _, d := range changed {
		if !d.State.Final() {
			ids = append(ids, d.ID)
		}
	}
	holds := make(map[uuid.UUID]core.Standing, len(ids))
	c.StandingsOf(ids, func(st core.Standing) { holds[st.DTR] = st })
	var preCleans map[uuid.UUID]string
	if len(chained) > 0 {
		preCleans = make(map[uuid.UUID]string, len(chained))
		for _, g := range chained {
			preCleans[g.DTR.ID] = g.ID
		}
	}
	items := make([]historyItem, 0, len(changed)+len(chained)+len(r.arrivals))
	for _, d := range changed {
		prev, known := r.lastOf(d.ID)
		if grant, ok := preCleans[d.ID]; ok {
			// The pre-clean its chained grant ran: granted when the query
			// ended (it held its slot from the query's grant on), ended by
			// the event below.
			at := cmp.Or(d.Updated, now)
			ev := api.HistoryEvent{Time: at, State: dtr.PreCleaning, Grant: grant, Attempts: d.Attempts,
				Share: d.Share, Priority: d.Priority, Term: term}
			var ranBy string
			if known {
				ev.From = prev.state.String()
				if prev.state.IsActive() && prev.grant != "" {
					ev.Ended, ranBy = prev.grant, r.ranBy[prev.grant]
				}
			}
			items = append(items, historyItem{id: d.ID, ev: ev, ranBy: ranBy})
			prev, known = recorded{state: dtr.PreCleaning, hold: core.HoldRunning, grant: grant}, true
		}
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
			r.forgetLast(d.ID)
		} else {
			r.setLast(d.ID, cur)
		}
	}
	return items
}

// held records, from the periodic sweep, a change of what holds a DTR
// that the steps did not record: from one kind of wait to another (a
// full endpoint, the staging limit, the slots), not between the reasons
// of the slot split, which change with every grant.
func (r *historyRecorder) held(now time.Time, st core.Standing, term uint64) (historyItem, bool) {
	if r.out == nil {
		return historyItem{}, false // not recorded
	}
	prev, known := r.lastOf(st.DTR)
	switch {
	case known:
	case holdKind(st.Hold) == "slots":
		// A DTR that has not stepped under this leader (the last
		// leader's), waiting for a slot: nothing to remember, so that a
		// leader taking over millions of queued DTRs does not make an
		// entry for each at once (over 10,000,000 the map's growth, under
		// a collector marking a heap of GBs, held the first sweep for
		// seconds on end).
		return historyItem{}, false
	case !r.swept:
		// Held by something else when the term began, as the last
		// leader may have recorded already: remembered from here on.
		r.setLast(st.DTR, recorded{state: st.State, hold: st.Hold, grant: st.Grant})
		return historyItem{}, false
	default:
		// Not remembered after the term's first sweep: it waited for a
		// slot in this state at every sweep since.
		prev = recorded{state: st.State, hold: core.HoldNoSlot}
	}
	if prev.state == st.State && holdKind(prev.hold) == holdKind(st.Hold) {
		return historyItem{}, false
	}
	from := prev.state
	prev.state, prev.hold = st.State, st.Hold
	r.setLast(st.DTR, prev)
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
// behind. It returns the batches handed over so far (the ticket
// awaitHistory waits for).
func (r *historyRecorder) send(items []historyItem) (ticket uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(items) == 0 || r.out == nil {
		return r.sent
	}
	if r.queued != nil && r.queued.Load()+int64(len(items)) > historyQueueEvents {
		r.dropped.Add(uint64(len(items)))
		return r.sent
	}
	select {
	case r.out <- items:
		r.sent++
		if r.queued != nil {
			r.queued.Add(int64(len(items)))
		}
	default:
		r.dropped.Add(uint64(len(items)))
	}
	return r.sent
}

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
		// The same number twice: given by two leaders (the later term's
		// comes after).
		if a.Term != b.Term {
			if a.Term < b.Term {
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
// stops it: the events handed over are stored first, for up to 2 s (a
// leader that steps down does not wait longer to resign).
func (s *Service) writeHistory(ctx context.Context) (stop func()) {
	s.history.last, s.history.more = nil, nil
	if s.cfg.HistoryOff {
		s.history.out = nil
		return func() {}
	}
	in := make(chan []historyItem, historyQueue)
	s.history.out, s.history.sent = in, 0
	s.history.last, s.history.more, s.history.swept = map[uuid.UUID]lastRecorded{}, map[uuid.UUID]recorded{}, false
	s.sweptAt = time.Time{}
	s.stopSweep()
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
	coalesce := cmp.Or(s.historyCoalesce, historyCoalesce)
	w := &historyWriter{js: js, log: s.log, retention: s.cfg.Retention, in: in, stats: s.historyStats, names: s.workerNames,
		flushNow: make(chan struct{}, 1), stored: make(chan struct{}), coalesce: coalesce, flushEvery: max(coalesce, historyFlushEvery)}
	s.history.queued = &w.queued
	s.historyWriter.Store(w)
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(wctx)
	}()
	return func() {
		s.history.out, s.history.queued = nil, nil
		s.historyWriter.Store(nil)
		close(in)
		select {
		case <-done:
		case <-time.After(2 * time.Second):
		}
		cancel()
		<-done
		closeConn()
	}
}

// awaitHistory waits until this term's writer has stored the first
// ticket batches of events (the history of the steps whose inputs are
// about to be acknowledged, so that a leader's crash loses none: at least
// once), asking it to store what it holds: at once if urgent (a caller
// waits for one of the steps), else once historyCoalesce has passed since
// its last store began; at most historyAwait, so
// that a slow or full store never holds scheduling. Once a wait ends
// unfulfilled, commits do not wait at all (each is counted in
// historyStats.unawaited) until a store succeeds within historyAwait
// again: a store that does not answer costs one wait, not one a step.
func (s *Service) awaitHistory(ctx context.Context, ticket uint64, urgent bool) {
	w := s.historyWriter.Load()
	if w == nil || ticket == 0 {
		return
	}
	if w.lagging.Load() {
		w.stats.unawaited.Add(1)
		return
	}
	deadline := time.NewTimer(historyAwait)
	defer deadline.Stop()
	for {
		stored, done := w.storedUpTo()
		if done >= ticket {
			return
		}
		w.ask(urgent)
		select {
		case <-stored:
		case <-deadline.C:
			w.lag()
			w.stats.unawaited.Add(1)
			return
		case <-ctx.Done():
			return
		}
	}
}

// historyAwait is the longest the committer waits for a step's history.
const historyAwait = 2 * time.Second
