package scheduler

// The history's writer: it numbers a leader's events per DTR and stores
// them in SLUICE_HISTORY, off the scheduling loop (history.go).

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
)

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
	// unawaited counts the commits that acknowledged their inputs
	// without waiting for their history, the store being slow (lagging).
	unawaited atomic.Uint64
}

// historyWriter numbers a leader's events per DTR and publishes them in
// batches.
type historyWriter struct {
	js jetstream.JetStream
	// names returns what names the worker of a grant that ended
	// (Service.workerNames), asked once a store.
	names     func() func(grant, ranBy string) string
	log       *slog.Logger
	retention time.Duration
	in        <-chan []historyItem
	stats     *historyStats
	// next is the number of each unfinished DTR's last event, and when
	// it was given (pruneNext forgets those not used for a while).
	next map[uuid.UUID]numbered
	// queued counts the events handed over and not yet taken (the
	// recorder drops new ones beyond historyQueueEvents).
	queued atomic.Int64
	// flushNow asks the writer to store what it holds: once coalesce
	// has passed since its last store began, or at once if urgent is
	// set (a caller waits). done counts the batches received and stored,
	// and stored is closed (and made anew) each time it grows.
	flushNow chan struct{}
	urgent   atomic.Bool
	coalesce time.Duration
	// flushEvery is how long it holds events at most (0:
	// historyFlushEvery).
	flushEvery time.Duration
	mu         sync.Mutex
	received   uint64
	done       uint64
	stored     chan struct{}
	// lastSeq and msgs are the stream's as last seen (looked: once seen).
	lastSeq, msgs uint64
	looked        bool
	// ackedSeq is the stream sequence of the last message this writer
	// had acknowledged (0: none yet, or a failure since): see vouches.
	ackedSeq uint64
	// logged is when a store failure was last logged (Unix ns).
	logged int64
	// lagging is set when a commit waited historyAwait for a store in
	// vain, and cleared when a store succeeds within historyAwait: while
	// it is set, commits do not wait for history (awaitHistory).
	lagging atomic.Bool
	// stream is SLUICE_HISTORY's handle, looked up once (lastNumbers).
	stream jetstream.Stream
}

// numbered is the number of a DTR's last event, and when it was given.
type numbered struct {
	n  uint64
	at time.Time
}

// historyNextIdle is how long the writer remembers the number of a DTR
// whose events stopped coming (its final event dropped, say); one that
// comes back after has its number read from the store.
const historyNextIdle = time.Hour

// pruneNext forgets the numbers not given for historyNextIdle.
func (w *historyWriter) pruneNext(now time.Time) {
	for id, n := range w.next {
		if now.Sub(n.at) > historyNextIdle {
			delete(w.next, id)
		}
	}
}

// ask asks the writer to store what it holds: at once if urgent, else
// once w.coalesce has passed since its last store began.
func (w *historyWriter) ask(urgent bool) {
	if urgent {
		w.urgent.Store(true)
	}
	select {
	case w.flushNow <- struct{}{}:
	default:
	}
}

// lag notes that a commit waited for the store in vain: the commits
// stop waiting for history until a store succeeds promptly again.
func (w *historyWriter) lag() {
	if w.lagging.CompareAndSwap(false, true) {
		w.log.Warn("history store too slow: a step's events were not stored within the wait; steps no longer wait for history until a store succeeds (sluice_scheduler_history_unawaited_total counts them)",
			"wait", historyAwait)
	}
}

// caughtUp notes a store that succeeded within historyAwait: the
// commits wait for history again.
func (w *historyWriter) caughtUp() {
	if w.lagging.CompareAndSwap(true, false) {
		w.log.Info("history store answers again; steps wait for their history again")
	}
}

// historyBatchMax is the most events the writer holds before it
// publishes them; historyFlushEvery how long it holds them at most. Held
// a moment, a DTR's events of several steps go out as one message.
//
// historyCoalesce is the least time between two stores that the committer
// asks for (flushNow) to acknowledge the inputs of the steps whose events
// they hold, unless a caller waits for one of the steps (urgent). A DTR of
// a small file passes through its states within a few hundred
// milliseconds, so held this long its events go out in one or two
// messages rather than one a step: about 1.7 to 2.2 messages a DTR instead
// of 5.9 on 1 KiB files at 500 slots (BENCHMARKS.md). A step's inputs are
// acknowledged up to this much later; its grants and final DTRs are not
// held.
const (
	historyBatchMax   = 20000
	historyFlushEvery = time.Second
	historyCoalesce   = 250 * time.Millisecond
)

// historyQueue is how many steps' events may wait for the writer, and
// historyQueueEvents how many events.
const (
	historyQueue       = 1024
	historyQueueEvents = 4 * historyBatchMax
)

// heldEvents are the events waiting to be published, by DTR in the order
// they first came. They are held in one slice, each DTR's chained in the
// order they came (next), and copied into one group per DTR as they are
// taken: a DTR's events of many steps cost no growing of a slice of its
// own.
type heldEvents struct {
	items []historyItem
	next  []int32 // the index of the same DTR's next event; -1: none
	dtrs  map[uuid.UUID]heldChain
	order []uuid.UUID
	n     int
}

// heldKept is the most events whose arrays heldEvents keeps between
// stores (about 2 MB).
const heldKept = 8192

// heldChain is where a DTR's held events are: its first and last, and how
// many.
type heldChain struct{ first, last, n int32 }

func (h *heldEvents) add(items []historyItem) {
	if h.dtrs == nil {
		h.dtrs = map[uuid.UUID]heldChain{}
	}
	for _, it := range items {
		i := int32(len(h.items))
		h.items, h.next = append(h.items, it), append(h.next, -1)
		if c, ok := h.dtrs[it.id]; ok {
			h.next[c.last] = i
			c.last, c.n = i, c.n+1
			h.dtrs[it.id] = c
		} else {
			h.dtrs[it.id] = heldChain{i, i, 1}
			h.order = append(h.order, it.id)
		}
		h.n++
	}
}

// take returns the events held, one group per DTR, and holds none.
func (h *heldEvents) take() [][]historyItem {
	out := make([][]historyItem, 0, len(h.order))
	for _, id := range h.order {
		c := h.dtrs[id]
		g := make([]historyItem, 0, c.n)
		for i := c.first; i >= 0; i = h.next[i] {
			g = append(g, h.items[i])
		}
		out = append(out, g)
	}
	clear(h.items) // what the events point to is not kept
	h.items, h.next, h.dtrs, h.order, h.n = h.items[:0], h.next[:0], nil, nil, 0
	if cap(h.items) > heldKept {
		h.items, h.next = nil, nil // a burst's arrays are not kept for the term
	}
	return out
}

// run publishes what comes in, each DTR's events of up to
// historyFlushEvery in one message, until in is closed (what it holds is
// published then) or ctx ends, and looks at the stream's size every 10 s.
func (w *historyWriter) run(ctx context.Context) {
	if w.next == nil {
		w.next = map[uuid.UUID]numbered{}
	}
	w.mu.Lock()
	if w.stored == nil {
		w.stored = make(chan struct{})
	}
	w.mu.Unlock()
	look := time.NewTicker(10 * time.Second)
	defer look.Stop()
	flush := time.NewTicker(cmp.Or(w.flushEvery, historyFlushEvery))
	defer flush.Stop()
	w.look(ctx)
	var held heldEvents
	// soon fires when a store asked for is due (coalesce after the last
	// store began); soonC is soon.C while one is asked for.
	soon := time.NewTimer(time.Hour)
	soon.Stop()
	defer soon.Stop()
	var soonC <-chan time.Time
	var began time.Time
	// store stores what is held and what has come in, up to
	// historyBatchMax events; more says events may be left in w.in.
	store := func() (more bool) {
		began, soonC = time.Now(), nil
		soon.Stop()
		w.urgent.Store(false)
		// What has come in is stored with what is held, up to
		// historyBatchMax events (the rest by the next stores).
		for more = true; more && held.n < historyBatchMax; {
			select {
			case items, ok := <-w.in:
				if !ok {
					more = false
					break
				}
				w.take(&held, items)
			default:
				more = false
			}
		}
		if held.n > 0 {
			ok, later := w.publish(ctx, held.take())
			if ok && time.Since(began) < historyAwait {
				w.caughtUp()
			}
			w.holdBack(&held, later)
		}
		if ctx.Err() != nil {
			// Stopped part-way: what was not stored is not reported
			// stored, so its inputs stay unacknowledged (awaitHistory).
			return false
		}
		w.mu.Lock()
		w.done = w.received
		close(w.stored)
		w.stored = make(chan struct{})
		w.mu.Unlock()
		return more
	}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-look.C:
			w.look(ctx)
			w.pruneNext(now)
		case <-flush.C:
			store()
		case <-soonC:
			store()
		case <-w.flushNow:
			switch wait := w.coalesce - time.Since(began); {
			case wait <= 0 || w.urgent.Load():
				store()
			case soonC == nil:
				soon.Reset(wait)
				soonC = soon.C
			}
		case items, ok := <-w.in:
			if !ok {
				for store() && ctx.Err() == nil {
				}
				return
			}
			w.take(&held, items)
			if held.n >= historyBatchMax {
				store()
			}
		}
	}
}

// take holds a batch that came in.
func (w *historyWriter) take(held *heldEvents, items []historyItem) {
	held.add(items)
	w.received++
	w.queued.Add(-int64(len(items)))
}

// storedUpTo returns how many batches are stored, and a channel closed
// when that grows.
func (w *historyWriter) storedUpTo() (grown <-chan struct{}, done uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stored, w.done
}

// publish numbers and stores groups of events, one message per group (one
// DTR's), historyAcksMax messages at a time. What the store refuses is
// counted and dropped: history never holds scheduling. It reports whether
// every group was stored, and returns the groups held back (later): those
// of DTRs whose last number could not be read from the store.
func (w *historyWriter) publish(ctx context.Context, groups [][]historyItem) (ok bool, later [][]historyItem) {
	ok = true
	for len(groups) > 0 && ctx.Err() == nil {
		n := min(len(groups), historyAcksMax)
		stored, back := w.publishSome(ctx, groups[:n])
		ok = stored && ok
		later = append(later, back...)
		groups = groups[n:]
	}
	return ok && len(later) == 0 && ctx.Err() == nil, later
}

// historyHeldMax is the most events held back for a later store; beyond
// it, those held back are dropped and counted (cause store).
const historyHeldMax = 4 * historyBatchMax

// holdBack keeps the groups held back for the next store, in front of
// what comes in after them, or drops and counts them if too many are
// held.
func (w *historyWriter) holdBack(held *heldEvents, later [][]historyItem) {
	n := 0
	for _, g := range later {
		n += len(g)
	}
	if n == 0 {
		return
	}
	if held.n+n > historyHeldMax {
		w.stats.droppedStore.Add(uint64(n))
		return
	}
	for _, g := range later {
		held.add(g)
	}
}

// historyAcksMax is the most messages published before their
// acknowledgements are awaited (within nats.go's limit of pending
// asynchronous publishes); historyAckEvery is how many messages one
// acknowledgement stands for (publishSome).
const (
	historyAcksMax  = 1000
	historyAckEvery = 100
)

func (w *historyWriter) publishSome(ctx context.Context, groups [][]historyItem) (ok bool, later [][]historyItem) {
	ok = true
	var ttl string
	if w.retention > 0 {
		ttl = strconv.FormatInt(int64(max(w.retention, time.Second)/time.Second), 10) + "s"
	}
	// Only every historyAckEvery-th message, and the last, asks to be
	// acknowledged; the others are published plainly. The server stores a
	// connection's messages to a stream in the order they were sent, so
	// an acknowledgement whose stream sequence moved on by exactly the
	// messages sent since the last one asked says they were all stored
	// (vouches); otherwise, or on a failure or a silence, they all count
	// as dropped. Each acknowledgement is a message back and a decoding:
	// 6-7 % of the scheduler's CPU when each message asked for one.
	type sent struct {
		f      jetstream.PubAckFuture
		events int // of the messages it stands for
		msgs   int
	}
	type outgoing struct {
		m      *nats.Msg
		events int
	}
	out := make([]outgoing, 0, len(groups))
	last, unknown := w.lastNumbers(ctx, groups)
	var name func(grant, ranBy string) string
	if w.names != nil {
		name = w.names()
	}
	// Every message carries the same header, read only.
	var header nats.Header
	if ttl != "" {
		header = nats.Header{jetstream.MsgTTLHeader: []string{ttl}}
	}
	now := time.Now()
	var events []api.HistoryEvent
	for _, group := range groups {
		id := group[0].id
		if unknown[id] {
			later = append(later, group)
			continue
		}
		nb, known := w.next[id]
		n := nb.n
		if !known {
			n = last[id]
		}
		events = events[:0]
		for i, it := range group {
			n++
			it.ev.Seq = n
			if it.ev.Ended != "" && it.ev.Worker == "" && name != nil {
				it.ev.Worker = name(it.ev.Ended, it.ranBy)
			}
			if i > 0 && it.ev.Share == group[i-1].ev.Share && it.ev.Priority == group[i-1].ev.Priority {
				// Stored once a message while they stay (the reader
				// fills them in).
				it.ev.Share, it.ev.Priority = "", 0
			}
			events = append(events, it.ev)
		}
		if group[len(group)-1].final {
			delete(w.next, id)
		} else {
			w.next[id] = numbered{n, now}
		}
		data, err := appendHistoryRecord(make([]byte, 0, 64+256*len(events)), events)
		if err != nil {
			w.stats.droppedStore.Add(uint64(len(group)))
			ok = false
			continue
		}
		out = append(out, outgoing{&nats.Msg{Subject: bus.HistorySubject(id.String()), Header: header, Data: data}, len(group)})
	}
	futures := make([]sent, 0, len(out)/historyAckEvery+2)
	var unacked sent // the messages published since the last that asked
	for i, o := range out {
		m := o.m
		unacked.events += o.events
		unacked.msgs++
		// With no acknowledged sequence to count from, the first asks.
		if (i > 0 || w.ackedSeq != 0) && (i+1)%historyAckEvery != 0 && i != len(out)-1 {
			if err := w.js.Conn().PublishMsg(m); err != nil {
				w.stats.droppedStore.Add(uint64(unacked.events))
				w.logFailure(err)
				ok = false
				unacked = sent{}
			}
			continue
		}
		f, err := w.js.PublishMsgAsync(m)
		if err != nil {
			w.stats.droppedStore.Add(uint64(unacked.events))
			w.logFailure(err)
			ok = false
			unacked = sent{}
			continue
		}
		unacked.f = f
		futures = append(futures, unacked)
		unacked = sent{}
	}
	// Ten seconds for them all: once they are over, what has not been
	// acknowledged counts as dropped, without waiting again.
	wait := time.NewTimer(10 * time.Second)
	defer wait.Stop()
	expired := false
	for _, f := range futures {
		var ack *jetstream.PubAck
		var err error
		if expired {
			select {
			case ack = <-f.f.Ok():
			case err = <-f.f.Err():
			default:
				err = errHistoryUnanswered
			}
		} else {
			select {
			case ack = <-f.f.Ok():
			case err = <-f.f.Err():
			case <-wait.C:
				err, expired = errHistoryUnanswered, true
			case <-ctx.Done():
				return false, later
			}
		}
		if err != nil {
			w.ackedSeq = 0 // nothing to count from
		} else if !w.vouches(ack, f.msgs) {
			err = fmt.Errorf("%w: stored at sequence %d, %d messages after the one acknowledged before", errHistoryGap, ack.Sequence, f.msgs)
		}
		if err != nil {
			w.stats.droppedStore.Add(uint64(f.events))
			w.logFailure(err)
			ok = false
			continue
		}
		w.stats.written.Add(uint64(f.events))
		w.stats.messages.Add(uint64(f.msgs))
	}
	return ok, later
}

// errHistoryUnanswered and errHistoryGap are why messages of history
// count as dropped: no acknowledgement within the wait, or one that does
// not vouch for the messages sent before it without asking.
var (
	errHistoryUnanswered = errors.New("no acknowledgement within 10 s")
	errHistoryGap        = errors.New("messages of history sent unacknowledged may be lost")
)

// vouches reports whether ack, for the last of msgs messages sent one
// after the other, shows that they were all stored: the stream's sequence
// moved on by msgs since the last acknowledgement this writer had. The
// server stores one connection's messages in order, but a plain publish
// can be lost without a word while a later one is stored: to a stream
// that lost its leader (nats.go sends an asking publish again after "no
// responders"), across a reconnection, or refused for want of space that
// came back. A stream written by another writer too (a deposed leader's)
// moves on by more, and its messages count as dropped: an underestimate,
// never the other way. One message alone is vouched for by its own.
func (w *historyWriter) vouches(ack *jetstream.PubAck, msgs int) bool {
	prev := w.ackedSeq
	w.ackedSeq = ack.Sequence
	return msgs == 1 || (prev != 0 && ack.Sequence == prev+uint64(msgs))
}

// logFailure logs a failure to store history, once a minute at most.
func (w *historyWriter) logFailure(err error) {
	now := time.Now().UnixNano()
	if now-w.logged > int64(time.Minute) {
		w.logged = now
		w.log.Warn("history events not stored (counted in sluice_scheduler_history_dropped_total); scheduling goes on", "err", err)
	}
}

// lastNumbers looks up, 32 at a time, the numbers of the last events
// stored of the DTRs of groups that this writer has not numbered and that
// were not submitted in this term (recorded by an earlier leader). The
// DTRs whose number could not be read (unknown: the store did not
// answer) are to be held back and tried again; after the first such
// failure the others are not asked, so that a store that does not answer
// costs one lookup's timeout a store, not one a DTR.
func (w *historyWriter) lastNumbers(ctx context.Context, groups [][]historyItem) (last map[uuid.UUID]uint64, unknown map[uuid.UUID]bool) {
	var ids []uuid.UUID
	for _, g := range groups {
		if _, ok := w.next[g[0].id]; !ok && !g[0].first {
			ids = append(ids, g[0].id)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	unknown = map[uuid.UUID]bool{}
	st, err := w.historyStream(ctx)
	if err != nil {
		w.logFailure(err)
		for _, id := range ids {
			unknown[id] = true
		}
		return nil, unknown
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	last = make(map[uuid.UUID]uint64, len(ids))
	var mu sync.Mutex
	var failure error
	var g errgroup.Group
	g.SetLimit(32)
	for _, id := range ids {
		g.Go(func() error {
			n, err := lastNumber(ctx, st, id)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				unknown[id] = true
				if failure == nil && ctx.Err() == nil {
					failure = err
				}
				cancel()
				return nil
			}
			last[id] = n
			return nil
		})
	}
	_ = g.Wait()
	if failure != nil {
		w.logFailure(failure)
		w.stream = nil // looked up again by the next store
	}
	return last, unknown
}

// historyStream returns SLUICE_HISTORY's handle, looked up the first time.
func (w *historyWriter) historyStream(ctx context.Context) (jetstream.Stream, error) {
	if w.stream != nil {
		return w.stream, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := w.js.Stream(ctx, bus.StreamHistory)
	if err != nil {
		return nil, fmt.Errorf("history: look up stream %s: %w", bus.StreamHistory, err)
	}
	w.stream = st
	return st, nil
}

// lastNumber is the number of the last event stored of a DTR (recorded by
// an earlier leader): 0 if the store holds none (or none readable), an
// error if the store could not say.
func lastNumber(ctx context.Context, st jetstream.Stream, id uuid.UUID) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := st.GetLastMsgForSubject(ctx, bus.HistorySubject(id.String()))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("history: last event of %s: %w", id, err)
	}
	var rec api.HistoryRecord
	if json.Unmarshal(m.Data, &rec) != nil || len(rec.Events) == 0 {
		return 0, nil
	}
	return rec.Events[len(rec.Events)-1].Seq, nil
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
