package scheduler

// Recovery at start: the checkpoint in the bucket; then the journal since,
// from a tail (standby.go).

import (
	"context"
	"log/slog"
	"runtime"
	"sort"
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
func (s *Service) loadCheckpoints(ctx context.Context, kv jetstream.KeyValue) error {
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer w.Stop()
	var ds []*dtr.DTR
	var chunk [][]byte
	flush := func() {
		for _, d := range decodeRecords(chunk, s.log) {
			if d != nil && !d.State.Final() { // a resubmission of a final one is found by takenBefore
				ds = append(ds, d)
			}
		}
		chunk = chunk[:0]
	}
	for e := range w.Updates() {
		if e == nil {
			break // caught up
		}
		id, err := uuid.Parse(e.Key())
		if err != nil {
			continue // not a DTR: the term of the last barrier (leader.go)
		}
		s.stored.Add(id)
		if chunk = append(chunk, e.Value()); len(chunk) == 8192 {
			flush()
		}
	}
	flush()
	sort.SliceStable(ds, func(i, j int) bool { return ds[i].Updated.Before(ds[j].Updated) })
	now := time.Now()
	for _, d := range ds {
		if err := s.core.Restore(now, d); err != nil {
			s.log.Error("saved DTR not restored", "dtr", d.ID, "err", err)
		}
	}
	s.core.Take() // what Restore routed is in the records already
	if len(ds) > 0 {
		s.log.Info("checkpoints loaded", "dtrs", len(ds))
	}
	return nil
}

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
