package generator

// SLUICE_RETENTION: the records of jobs that ended long enough ago removed.

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/bus"
)

// expire removes, every so often, the records of jobs that ended more than
// Retention ago. Any number of generator replicas may run it: a purge done
// twice is harmless.
func (s *Service) expire(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, err := s.expireEnded(ctx, time.Now()); err != nil && ctx.Err() == nil {
			s.log.Warn("ended jobs not expired; trying again later", "err", err)
		} else if n > 0 {
			s.log.Info("ended jobs expired", "jobs", n, "retention", s.cfg.Retention)
		}
	}
}

// expireEnded removes every job that ended before now less Retention: its
// file list and stored final DTRs first, then its record, so that a job
// whose removal stopped half-way is found again. They are purged from the
// bucket's stream, which leaves no delete markers behind.
func (s *Service) expireEnded(ctx context.Context, now time.Time) (int, error) {
	w, err := s.kv.WatchFiltered(ctx, []string{"*"}, jetstream.IgnoreDeletes())
	if err != nil {
		return 0, fmt.Errorf("list jobs: %w", err)
	}
	var old []string
	for e := range w.Updates() {
		if e == nil {
			break // every job record seen
		}
		var r Record
		if json.Unmarshal(e.Value(), &r) == nil && r.Announced && !r.Ended.IsZero() && now.Sub(r.Ended) > s.cfg.Retention {
			old = append(old, e.Key())
		}
	}
	_ = w.Stop()
	if len(old) == 0 {
		return 0, nil
	}
	st, err := s.js.Stream(ctx, "KV_"+bus.BucketJobs)
	if err != nil {
		return 0, fmt.Errorf("bucket %s: %w", bus.BucketJobs, err)
	}
	for i, jobID := range old {
		for _, subject := range []string{"$KV." + bus.BucketJobs + "." + jobID + ".>", "$KV." + bus.BucketJobs + "." + jobID} {
			if err := st.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
				return i, fmt.Errorf("expire job %s: %w", jobID, err)
			}
		}
	}
	return len(old), nil
}
