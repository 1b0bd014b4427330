package worker

// The storage tokens of a grant's work: they are to outlive its expected
// end, and carry the rights of the submitter when the DTR was submitted
// with a bearer token, which the scheduler keeps in the bucket
// sluice_subject_tokens under the DTR's token_ref.

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/token"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// withStorageTokens returns ctx with what the storage tokens of g's work,
// started at start, must be: valid until its expected end (and a margin),
// and the submitter's when g's DTR names a kept token.
func (p *Pool) withStorageTokens(ctx context.Context, g api.Grant, start time.Time) context.Context {
	ctx = token.WithNeededUntil(ctx, start.Add(g.Expected()))
	ctx = token.WithAudiences(ctx, audiencesOf(g.DTR))
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
// transfer's requests after the first use what was read. It asks
// JetStream for the entry directly, by its key only: a worker may not
// look at the bucket's stream (whose info would list every key).
func (p *Pool) subjectToken(ref string) token.Subject {
	var mu sync.Mutex
	var raw string
	return func(ctx context.Context) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		if raw != "" {
			return raw, nil
		}
		key := bus.SubjectTokenKey(ref)
		reply, err := p.nc.RequestWithContext(ctx,
			"$JS.API.DIRECT.GET.KV_"+bus.BucketSubjectTokens+".$KV."+bus.BucketSubjectTokens+"."+key, nil)
		if err != nil {
			return "", fmt.Errorf("read the submitter's token (bucket %s): %w", bus.BucketSubjectTokens, err)
		}
		switch status := reply.Header.Get("Status"); status {
		case "":
		case "404":
			return "", fmt.Errorf("%w: it is no longer kept (bucket %s keeps a token until it expires, at most SLUICE_STORAGE_TOKEN_SUBJECT_TTL)",
				token.ErrSubjectExpired, bus.BucketSubjectTokens)
		default:
			return "", fmt.Errorf("read the submitter's token (bucket %s): status %s %s", bus.BucketSubjectTokens, status, reply.Header.Get("Description"))
		}
		if op := reply.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" || len(reply.Data) == 0 {
			return "", fmt.Errorf("%w: it is no longer kept (bucket %s)", token.ErrSubjectExpired, bus.BucketSubjectTokens)
		}
		b, err := bus.OpenSubjectToken(ref, reply.Data)
		if err != nil {
			return "", fmt.Errorf("%w: %w", token.ErrSubjectNotKept, err)
		}
		raw = string(b)
		return raw, nil
	}
}

// audiencesOf are the storages of d's own URLs, as storage token audiences
// (https://host:port): its transfers get tokens for these only, not for
// whatever host a storage redirects them to.
func audiencesOf(d *dtr.DTR) []string {
	var auds []string
	add := func(raw string) {
		for from, to := range webDAVSchemes {
			if rest, ok := strings.CutPrefix(raw, from); ok {
				raw = to + rest
			}
		}
		// Only an https URL with a host names an audience: the others
		// (file:// above all) are not parsed.
		if len(raw) < len("https://") || !strings.EqualFold(raw[:len("https://")], "https://") {
			return
		}
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" || u.Scheme != "https" {
			return
		}
		if a := transfer.Audience(u); !slices.Contains(auds, a) {
			auds = append(auds, a)
		}
	}
	add(d.Source)
	add(d.Destination)
	add(d.Target())
	add(d.TURL)
	for _, r := range d.Replicas {
		add(r)
	}
	return auds
}

// webDAVSchemes are the HTTP schemes of WebDAV URLs, as ARC writes them.
var webDAVSchemes = map[string]string{"davs://": "https://", "dav://": "http://"}
