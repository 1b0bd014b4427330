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
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/natsext"
	"golang.org/x/sync/errgroup"

	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// indexKey is the key of the checkpoint bucket that holds the index.
const indexKey = bus.IndexKey

// DefaultRestoreHeads is SLUICE_RESTORE_HEADS's default.
const DefaultRestoreHeads = 64

// indexVersion begins an index's stored form; another is not read.
const indexVersion = "sluice-index-3"

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
// varints and 16-byte ids, each id followed by its record's sequence.
func indexBody(ix core.Index) []byte {
	var b []byte
	ids := func(ids []uuid.UUID, at []uint64) {
		b = binary.AppendUvarint(b, uint64(len(ids)))
		for i, id := range ids {
			b = append(b, id[:]...)
			var seq uint64
			if i < len(at) {
				seq = at[i]
			}
			b = binary.AppendUvarint(b, seq)
		}
	}
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	ids(ix.Keep, ix.KeepAt)
	b = binary.AppendUvarint(b, uint64(len(ix.Queues)))
	for _, q := range ix.Queues {
		str(q.State.String())
		str(q.Share)
		b = binary.AppendVarint(b, int64(q.Prio))
		b = binary.AppendVarint(b, q.Stamp)
		b = binary.AppendUvarint(b, q.Tie)
		b = binary.AppendUvarint(b, uint64(q.Behind))
		ids(q.Heads, q.HeadsAt)
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
	ix.Keep, ix.KeepAt = r.ids()
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
		q.Heads, q.HeadsAt = r.ids()
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

// ids reads a list of ids, each with its record's sequence.
func (r *indexReader) ids() ([]uuid.UUID, []uint64) {
	n := r.uvarint()
	if n > uint64(len(r.b)/17) {
		r.fail()
		return nil, nil
	}
	if n == 0 {
		return nil, nil
	}
	out, at := make([]uuid.UUID, n), make([]uint64, n)
	for i := range out {
		copy(out[i][:], r.take(16))
		at[i] = r.uvarint()
	}
	return out, at
}

// indexEvery is the least time between two indexes: a checkpoint begun
// sooner stores none, and purges the journal no further than the last.
const indexEvery = time.Second

// indexOf makes the body of an index of the core for the next
// checkpoint, with as many heads per queue as fit in a message: fewer if
// it is too large, and none at all (an empty body: the bucket's index is
// removed) if even the kept DTRs alone are. The committer gives it its
// journal sequence once the step it follows is journaled (store). It
// returns the index too.
func (s *Service) indexOf() ([]byte, core.Index) {
	for k := s.cfg.RestoreHeads; ; k /= 2 {
		ix := s.core.Index(k)
		b := indexBody(ix)
		if len(b)+len(indexVersion)+binary.MaxVarintLen64 <= s.journal.maxBytes {
			return b, ix
		}
		if k == 0 {
			return []byte{}, core.Index{}
		}
	}
}

// How near the bucket's end the index's DTRs are kept. A restart's fetch
// takes as long as the server takes to read the blocks of the bucket that
// hold them: over 10 M stored DTRs the heads of 1,000 queues lay in nearly
// every block (6.6 GB read, 25 s). So the DTRs an index names whose
// records lie further back than the last nearWindow messages of the
// bucket (or eight times as many as the index names, if more) are stored
// again as they are, nearPerTurn with each turn of the loop until the
// next index, and then lie together near the end. That costs nothing where
// queues are short; where they are deep, a record more for each DTR that
// comes to a queue's head while its record lies beyond the window, and,
// for DTRs that stay named, at most one record for every eight the bucket
// takes (the window is at least eight times the DTRs named).
const nearPerTurn = 1024

// nearWindow is a variable for tests.
var nearWindow uint64 = 256 << 10

// farFromEnd returns the DTRs ix names whose records lie before the
// window that ends at stream sequence end, furthest first; a DTR whose
// place is not known (0) is not among them (it is being stored).
func farFromEnd(ix core.Index, end uint64) []uuid.UUID {
	named := 0
	for _, q := range ix.Queues {
		named += len(q.Heads)
	}
	named += len(ix.Keep)
	window := max(nearWindow, 8*uint64(named))
	if end <= window {
		return nil
	}
	type far struct {
		id  uuid.UUID
		seq uint64
	}
	var fars []far
	pick := func(ids []uuid.UUID, at []uint64) {
		for i, id := range ids {
			if i < len(at) && at[i] > 0 && at[i] <= end-window {
				fars = append(fars, far{id, at[i]})
			}
		}
	}
	for _, q := range ix.Queues {
		pick(q.Heads, q.HeadsAt)
	}
	pick(ix.Keep, ix.KeepAt)
	slices.SortFunc(fars, func(a, b far) int { return cmp.Or(cmp.Compare(a.seq, b.seq), bytes.Compare(a.id[:], b.id[:])) })
	fars = slices.CompactFunc(fars, func(a, b far) bool { return a.id == b.id })
	out := make([]uuid.UUID, len(fars))
	for i, f := range fars {
		out[i] = f.id
	}
	return out
}

// storeNearEnd adds to c, as records to store again, up to nearPerTurn
// of the DTRs the last index found far from the bucket's end (s.far),
// each as the core holds it now, and tells the core they will lie at the
// end, so that an index made before their checkpoint says where does not
// pick them again. One the core no longer holds is passed over. While the
// store is full nothing is stored again: what room there is goes to
// changes.
func (s *Service) storeNearEnd(c *commit) error {
	if len(s.far) == 0 {
		return nil
	}
	if full, _, _ := bus.SpaceOf(s.nc).Full(); full {
		s.far = nil
		return nil
	}
	n := min(len(s.far), nearPerTurn)
	end := s.core.RecordedUpTo()
	for _, id := range s.far[:n] {
		d, ok := s.core.Get(id)
		if !ok {
			continue
		}
		b, err := codec.EncodeJSON(&d)
		if err != nil {
			return fmt.Errorf("encode DTR %s: %w", d.ID, err)
		}
		c.records = append(c.records, record{id: d.ID, data: b})
		s.core.Recorded(id, end)
	}
	s.far = s.far[n:]
	return nil
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
	named := map[uuid.UUID]uint64{} // a DTR named twice is fetched once
	name := func(ids []uuid.UUID, at []uint64) {
		for i, id := range ids {
			var seq uint64
			if i < len(at) {
				seq = at[i]
			}
			named[id] = max(named[id], seq)
		}
	}
	for _, q := range ix.Queues {
		name(q.Heads, q.HeadsAt)
	}
	name(ix.Keep, ix.KeepAt)
	// In the order they are stored: each request's keys lie in a few of
	// the bucket's blocks (fetchRecords); those whose place is not known
	// last. A record stored again since only makes the order a little
	// worse: the get is by key, and answers the newest.
	ids := slices.Collect(maps.Keys(named))
	slices.SortFunc(ids, func(a, b uuid.UUID) int {
		return cmp.Or(cmp.Compare(named[a]-1, named[b]-1), bytes.Compare(a[:], b[:])) // 0 wraps round to the end
	})
	recs, seqs, err := s.fetchRecords(ctx, ids)
	if err != nil {
		return err
	}
	fetched := time.Since(began)
	now := time.Now()
	for i, d := range decodeRecords(recs, s.log) {
		if d == nil {
			continue
		}
		s.stored.Add(d.ID)
		if err := s.core.Restore(now, d); err != nil && !errors.Is(err, core.ErrDuplicate) {
			s.log.Error("saved DTR not restored", "dtr", d.ID, "err", err)
		}
		s.core.Recorded(d.ID, seqs[i])
	}
	s.core.BeginLoad(ix.Queues)
	s.core.Take() // what Restore routed is in the records already
	behind := 0
	for _, q := range ix.Queues {
		behind += q.Behind
	}
	placed := 0
	for _, seq := range named {
		if seq > 0 {
			placed++
		}
	}
	s.log.Info("restart index read: leading with these, reading the rest meanwhile", "dtrs", s.core.Len(), "queued_behind", behind,
		"named", len(named), "placed", placed,
		"fetched_in", fetched.Round(time.Millisecond).String(), "took", time.Since(began).Round(time.Millisecond).String())
	s.restPending = true
	return nil
}

// fetchBatch is how many DTRs one request of fetchRecords asks for: the
// most a server answers at once.
const fetchBatch = 1024

// fetchBatchWait is how long fetchRecords waits for one request's answer
// before it asks for the keys left one at a time (a variable for tests).
var fetchBatchWait = 10 * time.Second

// fetchRecords gets the stored record of each of ids (nil for one not
// stored or deleted) and its stream sequence, up to fetchBatch keys a
// request (getLast), in the order given: ids sorted as their records lie
// in the bucket keep each request to a few of its blocks. (One request a
// key, in no order, made the server read a whole block back and index it
// again for most keys: 45-50 s for 64,000 keys over 10 M.) The keys of a
// request that was not answered to the end (it failed or timed out, the
// server cut it short at its byte limit, or answers no batched gets:
// before NATS 2.11, or a bucket without direct gets) are asked one at a
// time.
func (s *Service) fetchRecords(ctx context.Context, ids []uuid.UUID) (recs [][]byte, seqs []uint64, err error) {
	recs, seqs = make([][]byte, len(ids)), make([]uint64, len(ids))
	answered := make([]bool, len(ids))
	prefix := "$KV." + bus.BucketDTRs + "."
	var warn sync.Once
	// A request answered with nothing at all (refused by the server's
	// permissions, say, which answers no such publish) would cost every
	// other one fetchBatchWait: their keys are asked alone at once.
	var unanswered atomic.Bool
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(2)
	for lo := 0; lo < len(ids); lo += fetchBatch {
		hi := min(lo+fetchBatch, len(ids))
		g.Go(func() error {
			if unanswered.Load() {
				return gctx.Err()
			}
			at := make(map[string]int, hi-lo)
			subjects := make([]string, 0, hi-lo)
			for i := lo; i < hi; i++ {
				subj := prefix + ids[i].String()
				at[subj] = i
				subjects = append(subjects, subj)
			}
			rctx, cancel := context.WithTimeout(gctx, fetchBatchWait)
			defer cancel()
			got := 0
			complete, err := s.getLast(rctx, subjects, func(subject string, seq uint64, h nats.Header, data []byte) {
				got++
				if i, ok := at[subject]; ok {
					answered[i] = true
					if isRecord(h) {
						recs[i], seqs[i] = data, seq
					}
				}
			})
			switch {
			case complete: // a key not answered is not stored
				for i := lo; i < hi; i++ {
					answered[i] = true
				}
			case err != nil:
				if got == 0 {
					unanswered.Store(true)
				}
				warn.Do(func() {
					s.log.Warn("restart index: batched get failed; getting its DTRs one at a time", "err", err)
				})
			}
			return gctx.Err()
		})
	}
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(64)
	for i, id := range ids {
		if answered[i] {
			continue
		}
		g.Go(func() error {
			e, err := s.kv.Get(gctx, id.String())
			switch {
			case err == nil:
				recs[i], seqs[i] = e.Value(), e.Revision()
			case !errors.Is(err, jetstream.ErrKeyNotFound):
				return fmt.Errorf("restart index: get DTR %s: %w", id, err)
			}
			return nil
		})
	}
	return recs, seqs, g.Wait()
}

// getLast asks the checkpoint bucket's stream for the last message of
// each of subjects at once (a batched direct get, NATS 2.11 and later),
// which the server answers in stream order, reading each message block
// once. It calls each for every message answered; complete says the
// server answered to the end, so a subject not answered has no message.
func (s *Service) getLast(ctx context.Context, subjects []string, each func(subject string, seq uint64, h nats.Header, data []byte)) (complete bool, err error) {
	req, err := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
	}{subjects})
	if err != nil {
		return false, err
	}
	var eob nats.Header // the end of the batch, or nil
	msgs, err := natsext.RequestMany(ctx, s.nc, "$JS.API.DIRECT.GET.KV_"+bus.BucketDTRs, req,
		natsext.RequestManySentinel(func(m *nats.Msg) bool {
			if len(m.Data) == 0 && m.Header.Get("Status") == "204" {
				eob = m.Header
				return true
			}
			return false
		}))
	if err != nil {
		return false, err
	}
	got := 0
	for m, err := range msgs {
		if err != nil {
			return false, err
		}
		switch status := m.Header.Get("Status"); status {
		case "":
			seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
			if err != nil {
				return false, fmt.Errorf("batched get: a message's sequence: %w", err)
			}
			got++
			each(m.Header.Get(jetstream.SubjectHeader), seq, m.Header, m.Data)
		case "404":
			// "No Results" before any message: none of them has one.
			// Otherwise ("Message Not Found") a message the server had
			// found failed to load, and the batch ended there.
			if got == 0 && m.Header.Get("Description") == "No Results" {
				return true, nil
			}
			return false, fmt.Errorf("batched get: 404 %s after %d messages", m.Header.Get("Description"), got)
		default:
			return false, fmt.Errorf("batched get: %s %s", status, m.Header.Get("Description"))
		}
	}
	switch {
	case eob == nil:
		return false, fmt.Errorf("batched get: no answer to the end within %s: %w", fetchBatchWait, cmp.Or(ctx.Err(), context.DeadlineExceeded))
	case eob.Get("Nats-Num-Pending") != "0":
		return false, fmt.Errorf("batched get: cut short with %s left", eob.Get("Nats-Num-Pending"))
	}
	return true, nil
}

// isRecord says whether a message of the checkpoint bucket with these
// headers holds a value: not a delete or purge marker, nor the marker
// the server leaves for a record whose time to live ran out.
func isRecord(h nats.Header) bool {
	return h.Get("KV-Operation") == "" && h.Get(jetstream.MarkerReasonHeader) == ""
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
	seqs []uint64 // the stream sequence of each one's record
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
		var seqs []uint64
		flush := func() bool {
			ds := decodeRecords(chunk, s.log)
			c := loadChunk{dtrs: ds, seqs: seqs}
			chunk, seqs = nil, nil
			return send(c)
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
			if keyErr == nil && isRecord(m.Headers()) { // not the term's or the index's key
				chunk, seqs = append(chunk, m.Data()), append(seqs, md.Sequence.Stream)
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
	for i, d := range c.dtrs {
		if d == nil {
			continue
		}
		s.stored.Add(d.ID)
		if _, err := s.core.Load(now, d); err != nil {
			s.log.Error("saved DTR not restored", "dtr", d.ID, "err", err)
		}
		s.core.Recorded(d.ID, c.seqs[i])
	}
	s.core.Take() // what Restore routed is in the records already
	return nil
}
