package scheduler

// Recovery at start: the checkpoint in the bucket, then the journal since.

import (
	"context"
	"runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// recover loads every saved DTR: the checkpoint in the bucket, then the
// journal written since. Unfinished DTRs go back into the core in the order
// they last changed; DTRs that finished after the checkpoint are
// remembered as finished.
func (s *Service) recover(ctx context.Context, kv jetstream.KeyValue) error {
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer w.Stop()
	var ds []*dtr.DTR
	now := time.Now()
	// Decoding is most of the work: records are decoded in chunks, each
	// on every core.
	type raw struct {
		key  string
		data []byte
	}
	var chunk []raw
	decode := func(keep func(d *dtr.DTR, data []byte)) {
		out := make([]*dtr.DTR, len(chunk))
		var wg sync.WaitGroup
		workers := runtime.GOMAXPROCS(0)
		for k := range workers {
			wg.Go(func() {
				for i := k; i < len(chunk); i += workers {
					d := &dtr.DTR{}
					if err := codec.DecodeJSON(chunk[i].data, d); err != nil {
						s.log.Error("unreadable saved DTR skipped", "key", chunk[i].key, "err", err)
						continue
					}
					out[i] = d
				}
			})
		}
		wg.Wait()
		for i, d := range out {
			if d != nil {
				keep(d, chunk[i].data)
			}
		}
		chunk = chunk[:0]
	}
	checkpointed := func(d *dtr.DTR, _ []byte) {
		if !d.State.Final() { // a resubmission of a final one is found by takenBefore
			ds = append(ds, d)
		}
	}
	for e := range w.Updates() {
		if e == nil {
			break // caught up
		}
		if id, err := uuid.Parse(e.Key()); err == nil {
			s.stored.Add(id)
		}
		if chunk = append(chunk, raw{e.Key(), e.Value()}); len(chunk) == 8192 {
			decode(checkpointed)
		}
	}
	decode(checkpointed)
	// The journal: later records replace earlier ones. Each DTR's latest
	// record stays in the journal's keeping until the next checkpoint.
	journaled := map[uuid.UUID]*dtr.DTR{}
	keep := func(d *dtr.DTR, data []byte) {
		journaled[d.ID] = d
		s.stored.Add(d.ID)
		s.journal.Keep(d.ID, data, d.State.Final())
	}
	if err := s.journal.Replay(ctx, func(data []byte) {
		if chunk = append(chunk, raw{"journal", data}); len(chunk) == 8192 {
			decode(keep)
		}
	}); err != nil {
		return err
	}
	decode(keep)
	if len(journaled) > 0 {
		ds = slices.DeleteFunc(ds, func(d *dtr.DTR) bool { return journaled[d.ID] != nil })
		for _, d := range journaled {
			if d.State.Final() {
				s.finished.Add(d.ID, now)
			} else {
				ds = append(ds, d)
			}
		}
	}
	sort.SliceStable(ds, func(i, j int) bool { return ds[i].Updated.Before(ds[j].Updated) })
	for _, d := range ds {
		if err := s.core.Restore(now, d); err != nil {
			s.log.Error("saved DTR not restored", "dtr", d.ID, "err", err)
		}
	}
	if len(ds) > 0 || len(journaled) > 0 {
		s.log.Info("recovered", "dtrs", len(ds), "from_journal", len(journaled))
	}
	return nil
}
