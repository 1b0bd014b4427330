package scheduler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// pendingRecord is a DTR record journaled and not yet checkpointed.
type pendingRecord struct {
	data  []byte
	final bool
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
	// last is the journal sequence of the last message appended.
	last uint64
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
}

func newJournal(js jetstream.JetStream, kv jetstream.KeyValue, log *slog.Logger, maxBytes int, every time.Duration, atMost int) *journal {
	return &journal{js: js, kv: kv, log: log, maxBytes: maxBytes, every: every, atMost: atMost,
		dirty: map[uuid.UUID]pendingRecord{}, checkpointed: time.Now()}
}

// messages packs records into journal messages of at most maxBytes (a
// record larger than that goes alone). Each has a message id, so that one
// published again while NATS fails over is stored once.
func (j *journal) messages(recs []record) []*nats.Msg {
	var msgs []*nats.Msg
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
		msgs = append(msgs, m)
		recs = recs[n:]
	}
	return msgs
}

// Append stores the records in the journal and returns once they are
// stored; within recs each DTR appears once.
func (j *journal) Append(ctx context.Context, recs []record) error {
	if len(recs) == 0 {
		return nil
	}
	out := bus.NewBatch(ctx, j.js)
	out.Full = j.full
	for _, m := range j.messages(recs) {
		out.Add(m)
	}
	if err := out.Wait(ctx); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.last = max(j.last, out.Last)
	for _, r := range recs {
		j.dirty[r.id] = pendingRecord{r.data, r.final}
	}
	return nil
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
	return !j.running && len(j.dirty) > 0 && (len(j.dirty) >= j.atMost || now.Sub(j.checkpointed) >= j.every)
}

// Checkpoint begins a checkpoint of what is appended so far, in the
// background; it does nothing while one runs. Call it between Appends.
func (j *journal) Checkpoint(ctx context.Context) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.running || len(j.dirty) == 0 {
		return
	}
	j.running, j.checkpointed = true, time.Now()
	j.flushing, j.dirty = j.dirty, make(map[uuid.UUID]pendingRecord, len(j.dirty))
	upTo, recs := j.last, j.flushing
	j.wg.Go(func() {
		err := j.store(ctx, recs, upTo)
		j.mu.Lock()
		defer j.mu.Unlock()
		if err != nil {
			// Nothing is lost: the journal still holds these records,
			// and the next checkpoint stores them.
			j.log.Warn("checkpoint failed; the journal keeps the records", "dtrs", len(recs), "err", err)
			for id, d := range recs {
				if _, newer := j.dirty[id]; !newer {
					j.dirty[id] = d
				}
			}
		}
		j.flushing, j.running = nil, false
	})
}

// Wait waits for a running checkpoint.
func (j *journal) Wait() { j.wg.Wait() }

// store puts the records in the bucket and then purges the journal up to
// and including upTo.
func (j *journal) store(ctx context.Context, recs map[uuid.UUID]pendingRecord, upTo uint64) error {
	out := bus.NewBatch(ctx, j.js)
	ttl := ""
	if j.retention > 0 {
		ttl = strconv.FormatInt(int64(max(j.retention, time.Second)/time.Second), 10) + "s"
	}
	for id, h := range recs {
		m := nats.NewMsg("$KV." + bus.BucketDTRs + "." + id.String())
		m.Data = h.data
		if h.final && ttl != "" {
			m.Header.Set(jetstream.MsgTTLHeader, ttl)
		}
		out.Add(m)
	}
	if err := out.Wait(ctx); err != nil {
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

// Replay reads the journal from its first message to its last and hands
// each record to apply, in the order written; it keeps them as not yet
// checkpointed.
func (j *journal) Replay(ctx context.Context, apply func(data []byte)) error {
	st, err := j.js.Stream(ctx, bus.StreamJournal)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	state := st.CachedInfo().State
	if state.Msgs == 0 {
		j.last = state.LastSeq
		return nil
	}
	for seq := state.FirstSeq; seq <= state.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // a gap left by a duplicate refused, say
		}
		if err != nil {
			return fmt.Errorf("journal message %d: %w", seq, err)
		}
		for line := range bytes.Lines(m.Data) {
			if line = bytes.TrimSuffix(line, []byte{'\n'}); len(line) > 0 {
				apply(line)
			}
		}
	}
	j.last = state.LastSeq
	return nil
}

// Keep marks a replayed record as not yet checkpointed.
func (j *journal) Keep(id uuid.UUID, data []byte, final bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.dirty[id] = pendingRecord{data, final}
}
