package scheduler

// The restart's index: what a restarted scheduler restores first so that
// it can lead before it has read every stored DTR (core/load.go says how
// the core grants meanwhile).
//
// The leader computes an index of its core between steps and hands it to
// the journal, which stores it under indexKey in the checkpoint bucket as
// the last message of its next checkpoint (journal.go). The index is as
// of a journal sequence: it shows every change journaled up to there, and
// the checkpoint purges the journal no further, so a restart that reads
// the index and then replays the journal misses no change. A restart
// reads the index, gets the DTRs it names, replays the journal, and
// leads; the other records are read meanwhile, a chunk per turn of the
// loop, and until they all are, new submissions wait in their stream and
// changes by job or DTR (cancel, priority, reconfigure) are refused with
// a 503 to try again.

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// indexKey is the key of the checkpoint bucket that holds the index.
const indexKey = bus.IndexKey

// DefaultRestoreHeads is SLUICE_RESTORE_HEADS's default.
const DefaultRestoreHeads = 64

// indexVersion begins an index's stored form; another is not read.
const indexVersion = "sluice-index-2"

// errLoading answers changes asked while the scheduler loads its stored
// DTRs after a restart.
var errLoading = errors.New("503 this scheduler is still reading its stored DTRs after a restart: changes wait until it has read them all; try again")

// encodeIndex writes an index as of journal sequence asOf: the version,
// asOf, and the body (indexBody).
func encodeIndex(asOf uint64, ix core.Index) []byte { return indexAsOf(asOf, indexBody(ix)) }

// indexAsOf puts the version and asOf before an index's body.
func indexAsOf(asOf uint64, body []byte) []byte {
	b := append([]byte(indexVersion), binary.AppendUvarint(nil, asOf)...)
	return append(b, body...)
}

// indexBody writes the kept DTRs, and each queue with its heads, all in
// varints and 16-byte ids.
func indexBody(ix core.Index) []byte {
	var b []byte
	ids := func(ids []uuid.UUID) {
		b = binary.AppendUvarint(b, uint64(len(ids)))
		for _, id := range ids {
			b = append(b, id[:]...)
		}
	}
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	ids(ix.Keep)
	b = binary.AppendUvarint(b, uint64(len(ix.Queues)))
	for _, q := range ix.Queues {
		str(q.State.String())
		str(q.Share)
		b = binary.AppendVarint(b, int64(q.Prio))
		b = binary.AppendVarint(b, q.Stamp)
		b = binary.AppendUvarint(b, q.Tie)
		b = binary.AppendUvarint(b, uint64(q.Behind))
		ids(q.Heads)
	}
	return b
}

// errBadIndex is the error of an index that cannot be read.
var errBadIndex = errors.New("unreadable restart index")

// decodeIndex reads an index written by encodeIndex.
func decodeIndex(b []byte) (asOf uint64, ix core.Index, err error) {
	r := indexReader{b: b}
	if string(r.take(len(indexVersion))) != indexVersion {
		return 0, ix, fmt.Errorf("%w: not version %q", errBadIndex, indexVersion)
	}
	asOf = r.uvarint()
	ix.Keep = r.ids()
	n := r.uvarint()
	for i := uint64(0); i < n && r.err == nil; i++ {
		var q core.QueueIndex
		st, err := dtr.ParseState(string(r.take(int(r.uvarint()))))
		if err != nil && r.err == nil {
			r.err = fmt.Errorf("%w: %w", errBadIndex, err)
		}
		q.State = st
		q.Share = string(r.take(int(r.uvarint())))
		q.Prio = int32(r.varint())
		q.Stamp = r.varint()
		q.Tie = r.uvarint()
		q.Behind = int(r.uvarint())
		q.Heads = r.ids()
		ix.Queues = append(ix.Queues, q)
	}
	if r.err == nil && len(r.b) > 0 {
		r.err = fmt.Errorf("%w: %d bytes left over", errBadIndex, len(r.b))
	}
	return asOf, ix, r.err
}

// indexReader reads an index's fields; the first error stops it.
type indexReader struct {
	b   []byte
	err error
}

func (r *indexReader) fail() {
	if r.err == nil {
		r.err = fmt.Errorf("%w: cut short", errBadIndex)
	}
	r.b = nil
}

func (r *indexReader) take(n int) []byte {
	if n < 0 || n > len(r.b) {
		r.fail()
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *indexReader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *indexReader) varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *indexReader) ids() []uuid.UUID {
	n := r.uvarint()
	if n > uint64(len(r.b)/16) {
		r.fail()
		return nil
	}
	if n == 0 {
		return nil
	}
	out := make([]uuid.UUID, n)
	for i := range out {
		copy(out[i][:], r.take(16))
	}
	return out
}

// indexEvery is the least time between two indexes: a checkpoint begun
// sooner stores none, and purges the journal no further than the last.
const indexEvery = time.Second

// indexOf makes the body of an index of the core for the next
// checkpoint, with as many heads per queue as fit in a message: fewer if
// it is too large, and none at all (an empty body: the bucket's index is
// removed) if even the kept DTRs alone are. The committer gives it its
// journal sequence once the step it follows is journaled (store).
func (s *Service) indexOf() []byte {
	for k := s.cfg.RestoreHeads; ; k /= 2 {
		b := indexBody(s.core.Index(k))
		if len(b)+len(indexVersion)+binary.MaxVarintLen64 <= s.journal.maxBytes {
			return b
		}
		if k == 0 {
			return []byte{}
		}
	}
}

// restore builds the core from the checkpoint bucket: in parts if it holds
// an index that the journal still follows (its first message, first, is
// no later than the one after the index's), reading the rest while the
// scheduler goes on (loadRest); else all at once (loadCheckpoints). An
// index the journal was purged past (written before a leader that stored
// none, SLUICE_RESTORE_HEADS=0, or an older Sluice) misses changes, and
// is not used.
func (s *Service) restore(ctx context.Context, first uint64) error {
	s.loaded = make(chan struct{})
	if s.cfg.RestoreHeads > 0 {
		began := time.Now()
		e, err := s.kv.Get(ctx, indexKey)
		if took := time.Since(began); took > time.Second {
			s.log.Info("restart index fetched", "took", took.String())
		}
		switch {
		case err == nil:
			asOf, ix, err := decodeIndex(e.Value())
			switch {
			case err != nil:
				s.log.Warn("restart index not used; reading every stored DTR first", "err", err)
			case first > asOf+1:
				s.log.Warn("restart index not used: the journal was purged past it; reading every stored DTR first", "index_as_of", asOf, "journal_first", first)
			default:
				return s.loadIndexed(ctx, ix)
			}
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return fmt.Errorf("restart index: %w", err)
		}
	}
	if err := s.loadCheckpoints(ctx, s.kv); err != nil {
		return err
	}
	close(s.loaded)
	return nil
}

// loadIndexed restores what the index names, fences the queues it shows
// and starts reading the rest.
func (s *Service) loadIndexed(ctx context.Context, ix core.Index) error {
	began := time.Now()
	var ids []uuid.UUID
	for _, q := range ix.Queues {
		ids = append(ids, q.Heads...)
	}
	ids = append(ids, ix.Keep...)
	recs := make([][]byte, len(ids))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(64)
	for i, id := range ids {
		g.Go(func() error {
			e, err := s.kv.Get(gctx, id.String())
			switch {
			case err == nil:
				recs[i] = e.Value()
			case !errors.Is(err, jetstream.ErrKeyNotFound):
				return fmt.Errorf("restart index: get DTR %s: %w", id, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	fetched := time.Since(began)
	now := time.Now()
	for _, d := range decodeRecords(recs, s.log) {
		if d == nil {
			continue
		}
		s.stored.Add(d.ID)
		if err := s.core.Restore(now, d); err != nil && !errors.Is(err, core.ErrDuplicate) {
			s.log.Error("saved DTR not restored", "dtr", d.ID, "err", err)
		}
	}
	s.core.BeginLoad(ix.Queues)
	s.core.Take() // what Restore routed is in the records already
	behind := 0
	for _, q := range ix.Queues {
		behind += q.Behind
	}
	s.log.Info("restart index read: leading with these, reading the rest meanwhile", "dtrs", s.core.Len(), "queued_behind", behind,
		"fetched_in", fetched.Round(time.Millisecond).String(), "took", time.Since(began).Round(time.Millisecond).String())
	s.restPending = true
	return nil
}

// readRest starts reading the stored DTRs the index did not name, if it
// is still to be started. Not at once: reading millions keeps the server
// busy, and the term's barrier and the new leader's consumers come first,
// so a scheduler that leads starts it once it leads, and a standby once
// it has not won an election for a leader's TTL (the old leader's key has
// had time to expire).
func (s *Service) readRest(ctx context.Context) {
	if !s.restPending {
		return
	}
	s.restPending = false
	lctx, stop := context.WithCancel(ctx)
	s.stopLoading = stop
	s.loads = s.loadRest(lctx)
}

// loadChunk is a chunk of the stored DTRs read in the background: DTRs,
// or the end of the reading (over), or why it failed.
type loadChunk struct {
	dtrs []*dtr.DTR
	over bool
	err  error
}

// loadRest reads every stored DTR in the background, decoded a chunk at a
// time on every core, for the loop to load (takeLoaded). It reads the
// bucket's stream from its first message with an ordered consumer, not
// with a watch: the server makes a watch's consumer (the last message of
// each key) by going over every key first, seconds over millions, and
// holds up the JetStream API meanwhile (a new leader's consumers
// included). The bucket keeps one message per key, so reading them all up
// to the stream's last sequence at the start reads every record. One
// changed meanwhile (its older message gone, the newer after that last
// sequence) was changed by this scheduler, or by the leader whose journal
// this standby applies: the core has it already.
func (s *Service) loadRest(ctx context.Context) <-chan loadChunk {
	out := make(chan loadChunk, 4)
	send := func(c loadChunk) bool {
		select {
		case out <- c:
			return true
		case <-ctx.Done():
			return false
		}
	}
	go func() {
		ctx, cancel := context.WithTimeout(ctx, checkpointLoadLimit)
		defer cancel()
		fail := func(err error) { send(loadChunk{err: fmt.Errorf("reading the checkpoint bucket: %w", err)}) }
		st, err := s.js.Stream(ctx, "KV_"+bus.BucketDTRs)
		if err != nil {
			fail(err)
			return
		}
		info, err := st.Info(ctx)
		if err != nil {
			fail(err)
			return
		}
		last := info.State.LastSeq
		if info.State.Msgs == 0 {
			send(loadChunk{over: true})
			return
		}
		cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
		if err != nil {
			fail(err)
			return
		}
		it, err := cons.Messages(jetstream.PullMaxMessages(4 * loadChunkSize))
		if err != nil {
			fail(err)
			return
		}
		defer it.Stop()
		go func() { <-ctx.Done(); it.Stop() }()
		var chunk [][]byte
		flush := func() bool {
			ds := decodeRecords(chunk, s.log)
			chunk = nil
			return send(loadChunk{dtrs: ds})
		}
		prefix := "$KV." + bus.BucketDTRs + "."
		for {
			m, err := it.Next()
			if err != nil {
				fail(fmt.Errorf("%w: %w", errWatchEnded, cmp.Or(context.Cause(ctx), err)))
				return
			}
			md, err := m.Metadata()
			if err != nil {
				fail(err)
				return
			}
			_, keyErr := uuid.Parse(strings.TrimPrefix(m.Subject(), prefix))
			if keyErr == nil && m.Headers().Get("KV-Operation") == "" { // not a delete, nor the term's or the index's key
				chunk = append(chunk, m.Data())
			}
			if md.Sequence.Stream >= last || md.NumPending == 0 {
				if flush() {
					send(loadChunk{over: true})
				}
				return
			}
			if len(chunk) == loadChunkSize && !flush() {
				return
			}
		}
	}()
	return out
}

// loadChunkSize is how many stored DTRs the loop loads at a turn: a few
// milliseconds' work.
const loadChunkSize = 1024

// takeLoaded loads a chunk read in the background; at the end it lifts
// the core's fences and lets submissions in.
func (s *Service) takeLoaded(c loadChunk, ok bool) error {
	if !ok {
		return fmt.Errorf("loading the stored DTRs: %w", errWatchEnded)
	}
	if c.err != nil {
		return fmt.Errorf("loading the stored DTRs: %w", c.err)
	}
	if c.over {
		s.core.EndLoad()
		s.stopLoading()
		s.loads, s.stopLoading = nil, nil
		close(s.loaded)
		s.log.Info("every stored DTR read", "dtrs", s.core.Len())
		return nil
	}
	now := time.Now()
	for _, d := range c.dtrs {
		if d == nil {
			continue
		}
		s.stored.Add(d.ID)
		if _, err := s.core.Load(now, d); err != nil {
			s.log.Error("saved DTR not restored", "dtr", d.ID, "err", err)
		}
	}
	s.core.Take() // what Restore routed is in the records already
	return nil
}
