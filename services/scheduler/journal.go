package scheduler

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/bus"
)

// The scheduler's decisions are made durable in two places.
//
// The journal (stream SLUICE_JOURNAL) is written on every step: one message
// holds the records of all the DTRs a step changed, one per line, so a DTR
// that changes eight times on its way costs eight lines, not eight stored
// messages. The checkpoint (bucket sluice_dtrs) holds each DTR's record as
// of the last checkpoint: every CheckpointEvery, or sooner when
// CheckpointRecords DTRs have changed, the latest record of each DTR
// changed since the last checkpoint is put there once, and the journal
// messages that covered it are purged.
//
// Recovery loads the bucket and then replays what is left of the journal
// in order; a later record of a DTR replaces an earlier one. A checkpoint
// that stopped half-way leaves no gap: the journal it covered is purged
// only after every record is in the bucket, and the records it had put are
// no newer than the journal's.

// record is a changed DTR's stored form.
type record struct {
	id    uuid.UUID
	data  []byte // the DTR's JSON, one line
	final bool   // the DTR is in a final state
}

// pendingRecord is a DTR record journaled and not yet checkpointed; seq is
// the journal message that holds it.
type pendingRecord struct {
	data  []byte
	final bool
	seq   uint64
}

// journal appends records to the journal and checkpoints them. Append and
// Checkpoint run on the committer; Lookup on any goroutine.
type journal struct {
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	log *slog.Logger
	// maxBytes bounds a journal message (half of the server's max_payload).
	maxBytes int
	every    time.Duration
	atMost   int

	mu sync.Mutex
	// dirty holds the latest record of each DTR changed since the last
	// checkpoint began; flushing, those the running checkpoint stores.
	dirty, flushing map[uuid.UUID]pendingRecord
	// last is the journal sequence of the last message appended (or
	// read, standing by); purged is the last one a checkpoint purged.
	last, purged uint64
	// running is set while a checkpoint runs; checkpointed is when the
	// last one began.
	running      bool
	checkpointed time.Time
	wg           sync.WaitGroup
	// retention, if set, is how long the bucket keeps the record of a
	// final DTR (a per-message TTL: the bucket's stream must allow it).
	retention time.Duration
	// full, if set, is the scheduler's Space: an Append that the store
	// refuses for want of space is tried again until stored (a
	// checkpoint is not: it fails and the next one tries again).
	full *bus.Space
	// fenced is set while this scheduler leads (leader.go): every journal
	// message is appended, and every checkpoint record put, on the
	// condition that the stream's last sequence is last (the journal's)
	// or bucketLastID (the id of the checkpoint bucket's last message), so that the server refuses
	// the writes of a leader deposed since. deposed hears a checkpoint
	// that was refused so.
	fenced       bool
	bucketLastID string
	deposed      chan<- error
	// unannounced are the journal messages, by sequence and in order,
	// that hold final records appended here whose Finals events are not
	// yet known to be stored (the committer gathers a few steps' final
	// DTRs before it announces them), or, from the start of a term
	// (Lead), final records kept from the journal that the term
	// announces again. A checkpoint purges the journal only up to the
	// first of them: should this scheduler die before it announces them,
	// the next leader finds them in the journal and announces them
	// (keptFinals).
	unannounced []uint64
	// index is the restart's index (restoreindex.go) that the next
	// checkpoint stores, as of journal sequence indexAsOf: it describes
	// the core after every message up to there (nil: none to store; empty:
	// store none, removing the bucket's). storedAsOf is what the index in
	// the bucket is as of: a checkpoint purges the journal no further, so
	// that a restart replays every change the index does not show.
	index                 []byte
	indexAsOf, storedAsOf uint64
	// indexed says that the leader stores an index at its checkpoints
	// (SLUICE_RESTORE_HEADS above 0).
	indexed bool
	// recorded are where the checkpoints stored records (kept only if
	// indexed), for the loop to tell the core (TakeRecorded).
	recorded []recordAt
}

// recordAt is where a checkpoint stored a DTR's record: its stream
// sequence in the checkpoint bucket.
type recordAt struct {
	id  uuid.UUID
	seq uint64
}

// TakeRecorded returns where the checkpoints stored records since the
// last call.
func (j *journal) TakeRecorded() []recordAt {
	j.mu.Lock()
	defer j.mu.Unlock()
	r := j.recorded
	j.recorded = nil
	return r
}

func newJournal(js jetstream.JetStream, kv jetstream.KeyValue, log *slog.Logger, maxBytes int, every time.Duration, atMost int) *journal {
	return &journal{js: js, kv: kv, log: log, maxBytes: maxBytes, every: every, atMost: atMost,
		dirty: map[uuid.UUID]pendingRecord{}, checkpointed: time.Now()}
}

// messages packs records into journal messages of at most maxBytes (a
// record larger than that goes alone). Each has a message id, so that one
// published again while NATS fails over is stored once.
func (j *journal) messages(recs []record) (msgs []*nats.Msg, counts []int) {
	for len(recs) > 0 {
		// As many records as fit, at least one.
		n, size := 1, len(recs[0].data)+1
		for n < len(recs) && size+len(recs[n].data)+1 <= j.maxBytes {
			size += len(recs[n].data) + 1
			n++
		}
		data := make([]byte, 0, size)
		for _, r := range recs[:n] {
			data = append(data, r.data...)
			data = append(data, '\n')
		}
		m := nats.NewMsg(bus.SubjectJournal)
		m.Data = data
		m.Header.Set(jetstream.MsgIDHeader, uuid.NewString())
		msgs, counts = append(msgs, m), append(counts, n)
		recs = recs[n:]
	}
	return msgs, counts
}

// Append stores the records in the journal and returns once they are
// stored; within recs each DTR appears once. Its messages are appended one
// after the other; fenced, each on the condition that the journal ends
// where the last one did, and a refusal is errDeposed.
func (j *journal) Append(ctx context.Context, recs []record) error {
	msgs, counts := j.messages(recs)
	for k, m := range msgs {
		seq, err := j.appendOne(ctx, m)
		if err != nil {
			return fmt.Errorf("journal: %w", err)
		}
		j.mu.Lock()
		j.last = max(j.last, seq)
		final := false
		for _, r := range recs[:counts[k]] {
			j.dirty[r.id] = pendingRecord{r.data, r.final, seq}
			final = final || r.final
		}
		if final {
			j.unannounced = append(j.unannounced, seq)
		}
		j.mu.Unlock()
		recs = recs[counts[k]:]
	}
	return nil
}

// appendOne appends one journal message and returns its sequence.
func (j *journal) appendOne(ctx context.Context, m *nats.Msg) (uint64, error) {
	j.mu.Lock()
	fenced, last := j.fenced, j.last
	j.mu.Unlock()
	if fenced {
		conditional(m, last)
	}
	out := bus.NewBatch(ctx, j.js)
	out.Full = j.full
	out.Add(m)
	err := out.Wait(ctx)
	if err == nil || !fenced || !isWrongLast(err) {
		return out.Last, err
	}
	// Sent again after an acknowledgement was lost, a message stored the
	// first time is refused as if the journal had moved on: it has, by
	// this very message.
	if actual, ok := wrongLastSequence(err); ok && actual == last+1 {
		if st, serr := j.js.Stream(ctx, bus.StreamJournal); serr == nil {
			if sm, gerr := st.GetMsg(ctx, actual); gerr == nil && sm.Header.Get(jetstream.MsgIDHeader) == m.Header.Get(jetstream.MsgIDHeader) {
				return actual, nil
			}
		}
	}
	return 0, fmt.Errorf("%w: another scheduler has written the journal since its sequence %d (%v)", errDeposed, last, err)
}

// Lookup returns the latest record of a DTR that is not yet checkpointed.
func (j *journal) Lookup(id uuid.UUID) ([]byte, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if h, ok := j.dirty[id]; ok {
		return h.data, true
	}
	h, ok := j.flushing[id]
	return h.data, ok
}

// Due says whether a checkpoint should begin now.
func (j *journal) Due(now time.Time) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return !j.running && j.toCheckpoint() && (len(j.dirty) >= j.atMost || now.Sub(j.checkpointed) >= j.every)
}

// toCheckpoint says whether there is anything to checkpoint: records, or
// journal messages not yet purged that hold none (a term's barrier).
func (j *journal) toCheckpoint() bool { return len(j.dirty) > 0 || j.fenced && j.last > j.purged }

// Checkpoint begins a checkpoint of what is appended so far, in the
// background; it does nothing while one runs. Call it between Appends.
func (j *journal) Checkpoint(ctx context.Context) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.running || !j.toCheckpoint() {
		return
	}
	j.running, j.checkpointed = true, time.Now()
	j.flushing, j.dirty = j.dirty, make(map[uuid.UUID]pendingRecord, len(j.dirty))
	upTo, recs := j.last, j.flushing
	index, indexAsOf := j.index, j.indexAsOf
	j.index = nil
	// The journal is kept from the index's point on, unless the store is
	// full: then what a purge frees comes first, and a restart finds the
	// index older than the journal and reads every stored DTR instead.
	switch full, _, _ := j.full.Full(); {
	case full:
		index = nil // what it would show is purged
	case index != nil && len(index) > 0:
		upTo = min(upTo, indexAsOf)
	case index == nil && j.indexed:
		upTo = min(upTo, j.storedAsOf)
	}
	if len(j.unannounced) > 0 {
		// Every record is put in the bucket, but the journal is kept from
		// the first message whose final DTRs are not yet announced: a
		// later recovery replays it (a record replayed before a newer one
		// of the same DTR, which is kept too, changes nothing).
		upTo = min(upTo, j.unannounced[0]-1)
	}
	j.wg.Go(func() {
		err := j.store(ctx, recs, upTo, index)
		j.mu.Lock()
		defer j.mu.Unlock()
		switch {
		case err == nil && index != nil && len(index) > 0:
			j.storedAsOf = indexAsOf
		case err == nil && index != nil:
			j.storedAsOf = math.MaxUint64 // no index in the bucket to keep true
		case err != nil && index != nil && j.index == nil:
			j.index, j.indexAsOf = index, indexAsOf // the next checkpoint stores it
		}
		if err != nil {
			// Nothing is lost: the journal still holds these records,
			// and the next checkpoint stores them.
			j.log.Warn("checkpoint failed; the journal keeps the records", "dtrs", len(recs), "err", err)
			for id, d := range recs {
				if _, newer := j.dirty[id]; !newer {
					j.dirty[id] = d
				}
			}
		} else {
			j.purged = max(j.purged, upTo)
		}
		j.flushing, j.running = nil, false
	})
}

// Wait waits for a running checkpoint.
func (j *journal) Wait() { j.wg.Wait() }

// store puts the records in the bucket, and index after them if it is
// not nil (an empty one removes the bucket's), and then purges the journal
// up to and including upTo.
func (j *journal) store(ctx context.Context, recs map[uuid.UUID]pendingRecord, upTo uint64, index []byte) error {
	j.mu.Lock()
	fenced, prev, indexed := j.fenced, j.bucketLastID, j.indexed
	j.mu.Unlock()
	out := bus.NewBatch(ctx, j.js)
	var keys []uuid.UUID // of each message added (the index's: uuid.Nil)
	var recorded []recordAt
	if indexed {
		keys = make([]uuid.UUID, 0, len(recs)+1)
		out.Stored = func(i int, seq uint64) {
			if keys[i] != uuid.Nil {
				recorded = append(recorded, recordAt{keys[i], seq})
			}
		}
		defer func() {
			j.mu.Lock()
			j.recorded = append(j.recorded, recorded...)
			j.mu.Unlock()
		}()
	}
	refused := -1 // the first record the server refused, by index
	var refusal error
	out.Refused = func(i int, err error) error {
		refused, refusal = i, err
		return err
	}
	ttl := ""
	if j.retention > 0 {
		ttl = strconv.FormatInt(int64(max(j.retention, time.Second)/time.Second), 10) + "s"
	}
	// Fenced, each record is stored only if the bucket's last message is
	// the one before it: the first follows the last this leader stored
	// (or its term's barrier). Chained by message id, not sequence: once
	// another scheduler has written, none of the records after it can
	// match again.
	ids := make([]string, 0, len(recs))
	ours := map[string]bool{prev: true}
	add := func(m *nats.Msg) {
		if fenced {
			mid := uuid.NewString()
			m.Header.Set(jetstream.MsgIDHeader, mid)
			m.Header.Set(jetstream.ExpectedLastMsgIDHeader, prev)
			prev = mid
			ids, ours[mid] = append(ids, mid), true
		}
		out.Add(m)
	}
	for id, h := range recs {
		m := nats.NewMsg("$KV." + bus.BucketDTRs + "." + id.String())
		m.Data = h.data
		if h.final && ttl != "" {
			m.Header.Set(jetstream.MsgTTLHeader, ttl)
		}
		if indexed {
			keys = append(keys, id)
		}
		add(m)
	}
	if index != nil {
		m := nats.NewMsg("$KV." + bus.BucketDTRs + "." + indexKey)
		m.Data = index
		if len(index) == 0 {
			m.Header.Set("KV-Operation", "DEL")
		}
		if indexed {
			keys = append(keys, uuid.Nil)
		}
		add(m)
	}
	err := out.Wait(ctx)
	if fenced {
		// The records before the first refused one are stored; those
		// after it are refused too (each expects the one before).
		switch {
		case err == nil && len(ids) > 0:
			j.setBucketLastID(ids[len(ids)-1])
		case refused > 0:
			j.setBucketLastID(ids[refused-1])
		}
		if last, ok := wrongLastMsgID(refusal); ok && !ours[last] {
			err = fmt.Errorf("%w: another scheduler has written the checkpoints since this one's last record", errDeposed)
			select {
			case j.deposed <- err:
			default:
			}
			return err
		}
		if err != nil && refused < 0 {
			// Not refused, yet not acknowledged: where the bucket ends
			// is read back, and taken only if it is this leader's.
			j.recoverBucketLastID(ctx, ours)
		}
	}
	if err != nil {
		return fmt.Errorf("store records: %w", err)
	}
	st, err := j.js.Stream(ctx, bus.StreamJournal)
	if err != nil {
		return fmt.Errorf("purge journal: %w", err)
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSequence(upTo+1)); err != nil {
		return fmt.Errorf("purge journal: %w", err)
	}
	return nil
}

// Keep marks a record read from journal message seq as not yet
// checkpointed.
func (j *journal) Keep(id uuid.UUID, data []byte, final bool, seq uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.dirty[id] = pendingRecord{data, final, seq}
	j.last = max(j.last, seq)
}

// Read records that the journal has read up to seq (a standby's barrier
// message, say, which holds no record).
func (j *journal) Read(seq uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.last = max(j.last, seq)
}

// ReadUpTo is the last journal sequence read or appended.
func (j *journal) ReadUpTo() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.last
}

// Announced says that the final records appended in journal messages up
// to upTo are announced (their Finals events stored): a checkpoint may
// purge those messages.
func (j *journal) Announced(upTo uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	n := 0
	for n < len(j.unannounced) && j.unannounced[n] <= upTo {
		n++
	}
	j.unannounced = j.unannounced[n:]
}

// KeptFinals returns the final records not yet checkpointed.
func (j *journal) KeptFinals() [][]byte {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out [][]byte
	for _, r := range j.dirty {
		if r.final {
			out = append(out, r.data)
		}
	}
	for id, r := range j.flushing {
		if _, newer := j.dirty[id]; r.final && !newer {
			out = append(out, r.data)
		}
	}
	return out
}

// Prune forgets the records kept from journal messages before first, the
// journal's first sequence: a checkpoint has put them in the bucket.
func (j *journal) Prune(first uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for id, r := range j.dirty {
		if r.seq < first {
			delete(j.dirty, id)
		}
	}
}

func (j *journal) setBucketLastID(id string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.bucketLastID = id
}

// recoverBucketLastID reads the id of the checkpoint bucket's last
// message after a checkpoint whose end is not known (acknowledgements
// lost), and takes it if it is one of this leader's.
func (j *journal) recoverBucketLastID(ctx context.Context, ours map[string]bool) {
	st, err := j.js.Stream(ctx, "KV_"+bus.BucketDTRs)
	if err != nil {
		return
	}
	info, err := st.Info(ctx)
	if err != nil {
		return
	}
	m, err := st.GetMsg(ctx, info.State.LastSeq)
	if err != nil {
		return
	}
	if id := m.Header.Get(jetstream.MsgIDHeader); ours[id] {
		j.setBucketLastID(id)
	}
}

// reset forgets everything kept, for a standby that starts over; a
// checkpoint that runs is waited for.
func (j *journal) reset() {
	j.wg.Wait()
	j.mu.Lock()
	defer j.mu.Unlock()
	j.dirty, j.flushing = map[uuid.UUID]pendingRecord{}, nil
	j.last, j.purged, j.bucketLastID, j.fenced, j.deposed = 0, 0, "", false, nil
	j.running, j.unannounced = false, nil
	j.index, j.indexAsOf, j.storedAsOf = nil, 0, 0
}

// WantIndex says whether the leader should hand the journal an index for
// the next checkpoint (SetIndex): it leads and has none waiting.
func (j *journal) WantIndex() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.indexed && j.fenced && j.index == nil
}

// SetIndex hands the next checkpoint an index as of journal sequence
// asOf (empty: the checkpoint removes the bucket's).
func (j *journal) SetIndex(index []byte, asOf uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.index, j.indexAsOf = index, asOf
}

// Lead makes every later write conditional (fenced): the journal ends at
// term, the leader's barrier, and the checkpoint bucket at the message
// bucketLastID (the barrier's there).
func (j *journal) Lead(term uint64, bucketLastID string, deposed chan<- error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.fenced, j.last, j.bucketLastID, j.deposed = true, term, bucketLastID, deposed
	// The bucket's index (the last leader's) may be as of any message of
	// the journal: nothing is purged until this term stores its own.
	j.storedAsOf = 0
	// The final records kept from the journal, which the last leader may
	// not have announced, the new term announces first (keptFinals). Until
	// that announcement is stored (Announced) the journal keeps their
	// messages: should this leader fail or die meanwhile, the next one
	// reads them there, as it could not from the bucket alone.
	j.unannounced = j.keptFinalSeqs()
}

// keptFinalSeqs are the journal messages, by sequence and in order, that
// hold the final records KeptFinals returns.
func (j *journal) keptFinalSeqs() []uint64 {
	var seqs []uint64
	for _, r := range j.dirty {
		if r.final {
			seqs = append(seqs, r.seq)
		}
	}
	for id, r := range j.flushing {
		if _, newer := j.dirty[id]; r.final && !newer {
			seqs = append(seqs, r.seq)
		}
	}
	slices.Sort(seqs)
	return slices.Compact(seqs)
}

// Deposed sets where a refused checkpoint is reported.
func (j *journal) Deposed(deposed chan<- error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.deposed = deposed
}
