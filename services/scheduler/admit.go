package scheduler

// Who is asking (pkg/auth): the caller of every message on dtr.submit and
// sluice.api.*, the owner of the DTRs it submits, the file:// paths it may
// name and how much one owner may have queued.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// OwnerLimits bound what one owner may have queued, so that no submitter
// can fill the scheduler's memory or the store for everyone.
type OwnerLimits struct {
	OwnerMaxDTRs  int   `envconfig:"OWNER_MAX_DTRS" default:"200000" desc:"most unfinished DTRs one owner may have; one more from a caller who is not trusted is refused (sluice.event.rejected says so); the generator holds jobs to the same limit; 0: no limit"`
	OwnerMaxBytes int64 `envconfig:"OWNER_MAX_BYTES" default:"268435456" desc:"most bytes the records of one owner's unfinished DTRs may take (about 600 bytes and its URLs each); past it, as SLUICE_OWNER_MAX_DTRS; 0: no limit"`
}

// ErrOwnerLimit refuses a DTR that would take its owner past a limit.
var ErrOwnerLimit = errors.New("owner limit reached")

// tokenWait bounds how long a bearer token's check may hold the scheduling
// loop: one signed by a key the scheduler has not seen makes it fetch the
// issuer's keys.
const tokenWait = 250 * time.Millisecond

// caller establishes who sent a message on base or base.<user>, in the
// scheduling loop.
func (s *Service) caller(ctx context.Context, base, subject string, h nats.Header) (auth.Caller, error) {
	ctx, cancel := context.WithTimeout(ctx, tokenWait)
	defer cancel()
	return s.cfg.Callers.Caller(ctx, base, subject, h)
}

// admit makes a submitted DTR its caller's, and refuses it if the caller
// may not submit it: no compute.create scope, a file:// URL outside the
// roots, or an owner past its limits. It runs in the scheduling loop.
func (s *Service) admit(c auth.Caller, d *dtr.DTR) error {
	if err := c.Allow(auth.ScopeCreate); err != nil {
		return err
	}
	d.Owner = c.Owner(d.Owner)
	id, err := c.JobID(d.Owner, d.JobID)
	if err != nil {
		return err
	}
	d.JobID = id
	if d.Options.SciTag != 0 {
		if err := c.MayTag(); err != nil {
			return err
		}
	}
	urls := append([]string{d.Source, d.Destination}, d.Replicas...)
	if err := (auth.Confinement{Roots: s.cfg.FileRoots}).Check(c, urls...); err != nil {
		return err
	}
	if c.Trusted {
		return nil // the operator, the generator or a front end answers for its users
	}
	use := s.core.Owner(d.Owner.DN)
	if max := s.cfg.OwnerMaxDTRs; max > 0 && use.DTRs+1 > max {
		return fmt.Errorf("%w: %s has %d unfinished DTRs, the most SLUICE_OWNER_MAX_DTRS allows", ErrOwnerLimit, c, use.DTRs)
	}
	if max := s.cfg.OwnerMaxBytes; max > 0 && use.Bytes+dtr.Footprint(d) > max {
		return fmt.Errorf("%w: %s's unfinished DTRs take %d bytes; this one would take them past SLUICE_OWNER_MAX_BYTES (%d)", ErrOwnerLimit, c, use.Bytes, max)
	}
	return nil
}

// requester establishes the caller of an API request, answering the
// request itself (403) when it cannot.
func (s *Service) requester(r micro.Request, base, scope string) (auth.Caller, bool) {
	// Not in the scheduling loop: a token's check may take its time (the
	// issuer's keys fetched), up to a request's own timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := s.cfg.Callers.Caller(ctx, base, r.Subject(), nats.Header(r.Headers()))
	if err == nil {
		err = c.Allow(scope)
	}
	if err != nil {
		_ = r.Error("403", err.Error(), nil)
		return c, false
	}
	return c, true
}

// unknown answers a request about something that does not exist, or that
// the caller does not own: to one who is not an administrator both get the
// same answer, so that no one learns what others have.
func unknown(r micro.Request, c auth.Caller, what string) {
	text := "unknown " + what
	if !c.Admin {
		text += ", or not yours"
	}
	_ = r.Error("404", text, nil)
}
