package generator

// A job submitted to a full store: refused whole, with a clear answer.

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/bus"
)

// fullError is a job refused because JetStream has no space for it. It
// is answered with code 503 and its text.
type fullError struct {
	text string
	err  error // JetStream's refusal
}

func (e *fullError) Error() string { return e.text }
func (e *fullError) Unwrap() error { return e.err }

// refuseFull turns a refusal for want of space into a fullError, after
// removing the keys this submission created (created), so that nothing of
// the job is left behind; any other error is returned as it is.
func (s *Service) refuseFull(ctx context.Context, jobID string, created []string, err error) error {
	if !bus.StoreFull(err) {
		return err
	}
	if s.space.Refused(err) {
		s.log.Warn("JetStream store full: new jobs are refused", "reason", bus.FullReason(err))
	}
	if err := s.remove(ctx, created); err != nil {
		s.log.Error("job refused for want of space, but its records could not be removed", "job", jobID, "err", err)
	}
	return &fullError{err: err, text: fmt.Sprintf("store full: JetStream has no space for new work (%s); try again later", bus.FullReason(err))}
}

// partlyFull is the answer when some of a job's DTR messages were stored
// and others refused: the job stays (the DTRs taken run), and the same
// job submitted again adds the ones missing.
func partlyFull(jobID string, stored, all int, err error) error {
	return &fullError{err: err, text: fmt.Sprintf("store full: JetStream has no space for new work (%s); job %s was taken in part (%d of %d messages of DTRs); submit it again, with the same job id, once there is room",
		bus.FullReason(err), jobID, stored, all)}
}

// remove purges keys of the jobs bucket from its stream: a purge needs no
// room in the store, and leaves no delete marker behind.
func (s *Service) remove(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	st, err := s.js.Stream(ctx, "KV_"+bus.BucketJobs)
	if err != nil {
		return err
	}
	var errs []error
	for _, k := range keys {
		if err := st.Purge(ctx, jetstream.WithPurgeSubject("$KV."+bus.BucketJobs+"."+k)); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", k, err))
		}
	}
	return errors.Join(errs...)
}
