package worker

// The storage tokens of a grant's work: they are to outlive its expected
// end, and carry the rights of the submitter when the DTR was submitted
// with a bearer token, which the scheduler keeps in the bucket
// sluice_subject_tokens under the DTR's token_ref.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/token"
)

// withStorageTokens returns ctx with what the storage tokens of g's work,
// started at start, must be: valid until its expected end (and a margin),
// and the submitter's when g's DTR names a kept token.
func (p *Pool) withStorageTokens(ctx context.Context, g api.Grant, start time.Time) context.Context {
	ctx = token.WithNeededUntil(ctx, start.Add(g.Expected()))
	switch {
	case g.DTR.TokenRef != "":
		ctx = token.WithSubject(ctx, p.subjectToken(g.DTR.TokenRef))
	case g.DTR.SubmittedWithToken:
		// Never Sluice's own rights for work submitted with a token.
		ctx = token.WithSubject(ctx, notKept)
	}
	return ctx
}

// notKept is the Subject of a DTR submitted with a token that the
// scheduler did not keep.
func notKept(context.Context) (string, error) {
	return "", fmt.Errorf("%w: it was not valid when the scheduler took the DTR (expired or unverifiable then), "+
		"it was not the DTR owner's, the bucket %s was full, or the scheduler has no SLUICE_STORAGE_TOKEN_ISSUER; "+
		"the transfer is not made with Sluice's own credentials instead: submit the work again with a valid token",
		token.ErrSubjectNotKept, bus.BucketSubjectTokens)
}

// subjectToken reads the token kept under ref when a storage token is
// first needed (work on local files needs none), once per grant: a
// transfer's requests after the first use what was read.
func (p *Pool) subjectToken(ref string) token.Subject {
	var mu sync.Mutex
	var raw string
	return func(ctx context.Context) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		if raw != "" {
			return raw, nil
		}
		kv, err := p.subjectBucket(ctx)
		if err != nil {
			return "", err
		}
		e, err := kv.Get(ctx, ref)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return "", fmt.Errorf("%w: it is no longer kept (bucket %s keeps tokens for SLUICE_STORAGE_TOKEN_SUBJECT_TTL)",
				token.ErrSubjectExpired, bus.BucketSubjectTokens)
		}
		if err != nil {
			return "", fmt.Errorf("read the submitter's token (bucket %s): %w", bus.BucketSubjectTokens, err)
		}
		raw = string(e.Value())
		return raw, nil
	}
}

// subjectBucket opens the bucket of submitters' tokens once.
func (p *Pool) subjectBucket(ctx context.Context) (jetstream.KeyValue, error) {
	p.mu.Lock()
	kv := p.subjects
	p.mu.Unlock()
	if kv != nil {
		return kv, nil
	}
	kv, err := p.js.KeyValue(ctx, bus.BucketSubjectTokens)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", bus.BucketSubjectTokens, err)
	}
	p.mu.Lock()
	p.subjects = kv
	p.mu.Unlock()
	return kv, nil
}
