package scheduler

// Storage tokens with the submitter's rights: the scheduler keeps the
// bearer token a DTR was submitted with where only the workers can read
// it, under a random reference the DTR carries, and tells each grant how
// long its work is expected to take, so that the storage tokens the worker
// gets outlive it.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/token"
)

// StorageTokens says what the scheduler does for storage tokens; internal/app
// sets it from SLUICE_STORAGE_TOKEN_*.
type StorageTokens struct {
	// Keep keeps the tokens DTRs are submitted with, for their transfers
	// to exchange (storage tokens are issued).
	Keep bool
	// TTL is how long a token is kept (bus.Setup.SubjectTokenTTL).
	TTL time.Duration
	// FloorRate, in bytes/s, is the rate a transfer is expected to reach
	// on a link not seen lately.
	FloorRate float64
}

// maxKeptRefs bounds the references remembered; past it they are
// forgotten, and a token seen again is kept again under a new one.
const maxKeptRefs = 10000

// tokenKeeper puts submitters' tokens in the bucket sluice_subject_tokens,
// each under a random reference, once per token (a job's worth of DTRs
// sent with one token shares one entry). Each entry lives until its
// token expires (it is of no use after), and at most ttl.
type tokenKeeper struct {
	kv  jetstream.KeyValue
	ttl time.Duration

	mu   sync.Mutex
	refs map[[32]byte]keptRef // by the token's SHA-256: the token is not kept here
	// held counts, by reference, the unfinished DTRs that this scheduler
	// admitted with it: when the last finishes, the entry is deleted.
	// Those of a scheduler that led before are not counted, and their
	// entries go when their tokens expire.
	held map[string]int
}

// keptRef is a reference in the bucket and when its entry ends.
type keptRef struct {
	ref string
	end time.Time
}

func newTokenKeeper(kv jetstream.KeyValue, ttl time.Duration) *tokenKeeper {
	if ttl <= 0 {
		ttl = bus.DefaultSubjectTokenTTL
	}
	return &tokenKeeper{kv: kv, ttl: ttl, refs: map[[32]byte]keptRef{}, held: map[string]int{}}
}

// hold counts one more unfinished DTR holding ref.
func (k *tokenKeeper) hold(ref string) {
	if k == nil {
		return
	}
	k.mu.Lock()
	k.held[ref]++
	k.mu.Unlock()
}

// release counts one DTR holding ref less, and deletes the entry of ref
// when none is left: no DTR needs the token any more, so it is not kept.
// A failed delete is left to the entry's time to live.
func (k *tokenKeeper) release(ctx context.Context, ref string) {
	k.mu.Lock()
	n, ok := k.held[ref]
	if !ok {
		k.mu.Unlock()
		return
	}
	if n > 1 {
		k.held[ref] = n - 1
		k.mu.Unlock()
		return
	}
	delete(k.held, ref)
	for sum, r := range k.refs {
		if r.ref == ref {
			delete(k.refs, sum) // a DTR sent with the token again gets a new entry
		}
	}
	k.mu.Unlock()
	_ = k.kv.Purge(ctx, bus.SubjectTokenKey(ref))
}

// errTokenExpired: a token that has expired is not kept.
var errTokenExpired = errors.New("the token has expired")

// life is how long raw, put now, is kept: ttl, or less if it expires
// sooner; 0 if it has expired. JetStream counts a message's time to live
// in whole seconds, from one up.
func (k *tokenKeeper) life(raw string, now time.Time) time.Duration {
	life := k.ttl
	if exp := token.ExpiryOf(raw); !exp.IsZero() {
		life = min(life, exp.Sub(now).Truncate(time.Second))
	}
	if life < time.Second {
		return 0
	}
	return life
}

// keep returns the reference of raw in the bucket. An entry put before
// is reused while it has at least half the life left that a new entry
// would have (so a DTR never gets an entry much shorter lived than
// possible); otherwise raw is put again, under a new reference.
func (k *tokenKeeper) keep(ctx context.Context, raw string, now time.Time) (string, error) {
	life := k.life(raw, now)
	if life == 0 {
		return "", errTokenExpired
	}
	sum := sha256.Sum256([]byte(raw))
	k.mu.Lock()
	r, ok := k.refs[sum]
	k.mu.Unlock()
	if ok && r.end.Sub(now) >= life/2 {
		return r.ref, nil
	}
	ref := "t" + rand.Text() // 130 random bits
	sealed, err := bus.SealSubjectToken(ref, []byte(raw))
	if err != nil {
		return "", err
	}
	if _, err := k.kv.Create(ctx, bus.SubjectTokenKey(ref), sealed, jetstream.KeyTTL(life)); err != nil {
		return "", fmt.Errorf("keep the submitter's token for its transfers (bucket %s): %w", bus.BucketSubjectTokens, err)
	}
	k.mu.Lock()
	if len(k.refs) >= maxKeptRefs {
		clear(k.refs)
	}
	k.refs[sum] = keptRef{ref: ref, end: now.Add(life)}
	k.mu.Unlock()
	return ref, nil
}

// keepToken keeps the token of a message on dtr.submit for the DTRs it
// brings: the caller's own bearer token, or the token a trusted caller
// (the generator) sends on behalf of the work's submitter
// (api.HeaderSubjectToken), verified here, for the DTRs its holder owns.
//
// Either way the DTRs are marked as submitted with a token, so that they
// never run with Sluice's own storage credentials. A token the trusted
// caller sent that no longer verifies (it expired after the generator
// took the job, or its issuer cannot be reached now) does not refuse the
// message: the generator has answered "submitted" already and reads no
// rejections, so its DTRs would never exist. They are admitted without
// the token instead, and their transfers fail, visibly, saying so. So are
// those whose token cannot be put in the bucket (it is full, say): a full
// store of tokens must not stop all scheduling.
func (s *Service) keepToken(ctx context.Context, now time.Time, h nats.Header, sub *submitted) {
	var raw string
	switch {
	case sub.caller.Via == auth.ViaToken:
		raw = auth.Bearer(h)
	case sub.caller.Trusted && h.Get(api.HeaderSubjectToken) != "":
		sub.withToken = true
		if s.keeper == nil {
			return
		}
		raw = h.Get(api.HeaderSubjectToken)
		holder, err := s.caller(ctx, api.SubjectSubmit, api.SubjectSubmit, nats.Header{"Authorization": {"Bearer " + raw}})
		if err != nil {
			s.log.Warn("the submitter's token sent with DTRs does not verify now: they are admitted without it",
				"header", api.HeaderSubjectToken, "reason", err)
			return
		}
		sub.tokenOwner = holder.Identity.DN
	}
	if raw == "" {
		return
	}
	sub.withToken = true
	if s.keeper == nil {
		return
	}
	ref, err := s.keeper.keep(ctx, raw, now)
	if err != nil {
		s.log.Warn("the token DTRs were submitted with is not kept: they are admitted without it", "reason", err)
		return
	}
	sub.tokenRef = ref
}

// maxLinks bounds the links whose throughput is remembered.
const maxLinks = 10000

// linkRates learns each link's recent throughput from the transfers that
// finish: an exponentially weighted average, each new transfer counting
// for a third.
type linkRates struct {
	mu    sync.Mutex
	rates map[string]float64 // bytes/s by link
}

func newLinkRates() *linkRates { return &linkRates{rates: map[string]float64{}} }

// linkOf names the link a DTR's transfer takes: from its source's host to
// its target's.
func linkOf(d *dtr.DTR) string {
	return hostOf(d.Source) + " -> " + hostOf(d.Target())
}

// hostOf names the endpoint of a URL: "scheme://host[:port]", "" if it
// does not parse.
func hostOf(raw string) string {
	if h, ok := plainHostOf(raw); ok {
		return h
	}
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Scheme + "://" + u.Host
}

// plainHostOf is hostOf without url.Parse (which costs more than the rest
// of a small file's grant) for the URLs nearly all are: printable ASCII
// without escapes, a lower-case scheme, and a host of letters, digits,
// dots and hyphens with at most a numeric port, without user information.
// ok is false for any other URL.
func plainHostOf(raw string) (host string, ok bool) {
	for _, c := range []byte(raw) {
		if c <= ' ' || c >= 0x7f || c == '%' {
			return "", false
		}
	}
	scheme, rest, found := strings.Cut(raw, "://")
	if !found || scheme == "" || scheme[0] < 'a' || scheme[0] > 'z' {
		return "", false
	}
	for _, c := range []byte(scheme) {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '+' || c == '-' || c == '.') {
			return "", false
		}
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	name, port, hasPort := strings.Cut(rest[:end], ":")
	for _, c := range []byte(name) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-') {
			return "", false
		}
	}
	if hasPort {
		for _, c := range []byte(port) {
			if c < '0' || c > '9' {
				return "", false
			}
		}
	}
	return raw[:len(scheme)+3+end], true
}

// observe learns from a DTR that finished.
func (l *linkRates) observe(d *dtr.DTR) {
	took := d.Ended.Sub(d.Started).Seconds()
	if d.State != dtr.Done || d.Bytes <= 0 || took <= 0 {
		return
	}
	rate := float64(d.Bytes) / took
	link := linkOf(d)
	l.mu.Lock()
	defer l.mu.Unlock()
	if old, ok := l.rates[link]; ok {
		rate = old + (rate-old)/3
	} else if len(l.rates) >= maxLinks {
		clear(l.rates)
	}
	l.rates[link] = rate
}

// expected is how long d's transfer is expected to take: its size at half
// its link's recent throughput (a transfer may well go at half the pace of
// those before it), or at floor bytes/s on a link not seen lately. 0 when
// its size is not known.
func (l *linkRates) expected(d *dtr.DTR, floor float64) time.Duration {
	if d.Size <= 0 {
		return 0
	}
	l.mu.Lock()
	rate, ok := l.rates[linkOf(d)]
	l.mu.Unlock()
	if ok {
		rate /= 2
	} else {
		rate = floor
	}
	if rate <= 0 {
		return 0
	}
	return time.Duration(float64(d.Size) / rate * float64(time.Second))
}
