package generator

// Who submits a job (pkg/auth), the id it gets and how many jobs and files
// one owner may have running.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// OwnerLimits bound the running jobs of one owner.
type OwnerLimits struct {
	OwnerMaxJobs int `envconfig:"OWNER_MAX_JOBS" default:"1000" desc:"most running jobs one owner may have; one more from a caller who is not trusted is refused (400, naming the limit); 0: no limit"`
}

// ErrOwnerLimit refuses a job that would take its owner past a limit.
var ErrOwnerLimit = errors.New("owner limit reached")

// ownJob makes j its caller's: the owner (a trusted caller may state
// another), and, for a caller who is not trusted, a job id in the owner's
// own namespace (auth.Caller.JobID).
func ownJob(c auth.Caller, j *job.Job) error {
	for i, f := range slices.Concat(j.Inputs, j.Outputs) {
		if f.SciTag != 0 {
			if err := c.MayTag(); err != nil {
				return fmt.Errorf("file %d: scitag: %w", i+1, err)
			}
		}
	}
	j.Owner = c.Owner(j.Owner)
	id, err := c.JobID(j.Owner, j.ID)
	j.ID = id
	return err
}

// ownerUse is what one owner's running jobs hold.
type ownerUse struct {
	jobs, files int
	bytes       int64
}

// admitJob refuses a job of files DTRs whose records take bytes that would
// take its owner past a limit.
func (s *Service) admitJob(c auth.Caller, j *job.Job, files int, bytes int64) error {
	if c.Trusted {
		return nil // the operator or a front end answers for its users
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.owners[j.Owner.DN]
	if max := s.cfg.OwnerMaxJobs; max > 0 && u.jobs+1 > max {
		return fmt.Errorf("%w: %s has %d running jobs, the most SLUICE_GENERATOR_OWNER_MAX_JOBS allows", ErrOwnerLimit, c, u.jobs)
	}
	if max := s.cfg.OwnerMaxDTRs; max > 0 && u.files+files > max {
		return fmt.Errorf("%w: %s has %d files in running jobs; %d more would pass SLUICE_OWNER_MAX_DTRS (%d)", ErrOwnerLimit, c, u.files, files, max)
	}
	if max := s.cfg.OwnerMaxBytes; max > 0 && u.bytes+bytes > max {
		return fmt.Errorf("%w: the DTRs of %s's running jobs take %d bytes; this job's %d more would pass SLUICE_OWNER_MAX_BYTES (%d)", ErrOwnerLimit, c, u.bytes, bytes, max)
	}
	return nil
}

// counted adds (or, with sign -1, removes) a running job for its owner.
func (s *Service) counted(owner string, files int, bytes int64, sign int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.owners[owner]
	u.jobs += sign
	u.files += sign * files
	u.bytes += int64(sign) * bytes
	if u.jobs <= 0 {
		delete(s.owners, owner)
		return
	}
	s.owners[owner] = u
}

// countOwnersEvery counts the running jobs of every owner again from the job
// records, at start and then every so often (another generator may have
// ended some).
func (s *Service) countOwnersEvery(ctx context.Context, every time.Duration) {
	for {
		if err := s.countOwners(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("cannot count the running jobs of each owner", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

func (s *Service) countOwners(ctx context.Context) error {
	w, err := s.kv.WatchFiltered(ctx, []string{"*"}, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("list jobs: %w", err)
	}
	defer func() { _ = w.Stop() }()
	owners := map[string]ownerUse{}
	for e := range w.Updates() {
		if e == nil {
			break // every job record seen
		}
		var r Record
		if json.Unmarshal(e.Value(), &r) == nil && r.State == api.JobRunning {
			u := owners[r.Job.Owner.DN]
			u.jobs++
			u.files += r.Total
			u.bytes += r.Footprint
			owners[r.Job.Owner.DN] = u
		}
	}
	s.mu.Lock()
	s.owners = owners
	s.mu.Unlock()
	return nil
}
