package scheduler

// Recovery at start: the checkpoint in the bucket; then the journal since,
// from a tail (standby.go).

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// loadCheckpoints restores every unfinished DTR of the checkpoint bucket
// into the core, in the order they last changed. The journal written since
// is applied after it, from a tail started before (standby.go).
//
// Records are decoded a chunk at a time on every core and held packed
// (the core's compact form, a few hundred bytes each) until all are read
// and sorted, not as decoded DTRs (about a kilobyte each): a scheduler
// restarted over millions of stored DTRs needs little more memory to load
// them than to hold them.
func (s *Service) loadCheckpoints(ctx context.Context, kv jetstream.KeyValue) error {
	// The watch's consumer is made under this deadline, not the client's
	// 5 s default for a request with none: over 10,000,000 records the
	// server took 2-3 s to make it when idle and over 5 s when busy, and
	// then every try timed out. The watch ends with it.
	ctx, cancel := context.WithTimeout(ctx, checkpointLoadLimit)
	defer cancel()
	began := time.Now()
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("checkpoint watch: %w", err)
	}
	defer w.Stop()
	if took := time.Since(began); took > time.Second {
		s.log.Info("checkpoint watch made", "took", took)
	}
	type saved struct {
		updated int64 // when it last changed, in nanoseconds since 1970
		packed  string
		record  uint64 // its stream sequence
	}
	var ds []saved
	var chunk [][]byte
	var seqs []uint64
	flush := func() {
		for i, d := range decodeRecords(chunk, s.log) {
			if d != nil && !d.State.Final() { // a resubmission of a final one is found by takenBefore
				ds = append(ds, saved{d.Updated.UnixNano(), s.core.Pack(d), seqs[i]})
			}
		}
		clear(chunk)
		chunk, seqs = chunk[:0], seqs[:0]
	}
	read, caughtUp := 0, false
	for e := range w.Updates() {
		if e == nil {
			caughtUp = true
			break
		}
		read++
		id, err := uuid.Parse(e.Key())
		if err != nil {
			continue // not a DTR: the term of the last barrier (leader.go)
		}
		s.stored.Add(id)
		seqs = append(seqs, e.Revision())
		if chunk = append(chunk, e.Value()); len(chunk) == 8192 {
			flush()
		}
	}
	if !caughtUp {
		// The watch was stopped (the deadline, the scheduler's stop, the
		// connection closed) before it delivered every record: restoring
		// what was read would lose the rest.
		return fmt.Errorf("checkpoint watch ended after %d records, before it caught up: %w", read, cmp.Or(context.Cause(ctx), errWatchEnded))
	}
	flush()
	slices.SortStableFunc(ds, func(a, b saved) int { return cmp.Compare(a.updated, b.updated) })
	now := time.Now()
	for i := range ds {
		if err := s.core.RestorePacked(now, ds[i].packed, ds[i].record); err != nil {
			s.log.Error("saved DTR not restored", "err", err)
		}
		ds[i].packed = "" // held by the core now, if it keeps it packed
	}
	s.core.Take() // what Restore routed is in the records already
	loaded := len(ds)
	if loaded > 0 {
		s.log.Info("checkpoints loaded", "dtrs", loaded)
	}
	ds, chunk = nil, nil
	if loaded >= 100_000 {
		// Give back what loading freed (the records read and held
		// packed) now rather than over minutes: collected beside the
		// scheduling that begins.
		go debug.FreeOSMemory()
	}
	return nil
}

// checkpointLoadLimit bounds the time to read the checkpoint bucket at
// start: at about 10 µs a record, 10,000,000 take a few minutes.
const checkpointLoadLimit = 30 * time.Minute

// errWatchEnded is the cause of a checkpoint watch whose updates stopped
// before it caught up, its context still alive.
var errWatchEnded = errors.New("the watch's subscription ended")

// decodeRecords decodes DTR records on every core; an unreadable one is
// logged and left nil.
func decodeRecords(recs [][]byte, log *slog.Logger) []*dtr.DTR {
	out := make([]*dtr.DTR, len(recs))
	var wg sync.WaitGroup
	workers := min(runtime.GOMAXPROCS(0), (len(recs)+63)/64)
	for k := range workers {
		wg.Go(func() {
			for i := k; i < len(recs); i += workers {
				d := &dtr.DTR{}
				if err := codec.DecodeJSON(recs[i], d); err != nil {
					log.Error("unreadable saved DTR skipped", "record", quoteStart(string(recs[i])), "err", err)
					continue
				}
				out[i] = d
			}
		})
	}
	wg.Wait()
	return out
}
