package token

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"
	"golang.org/x/sync/singleflight"
)

// StorageConfig is read from the environment with the prefix
// SLUICE_STORAGE_TOKEN (SLUICE_STORAGE_TOKEN_ISSUER, ...).
type StorageConfig struct {
	Issuer           string `envconfig:"ISSUER" desc:"URL of the issuer of storage tokens (https, or http on 127.0.0.1, ::1 or localhost); its token endpoint comes from <issuer>/.well-known/openid-configuration; empty: no storage tokens"`
	ClientID         string `envconfig:"CLIENT_ID" desc:"OAuth2 client of Sluice at that issuer: allowed the client-credentials grant for the storage audiences and storage.read/storage.create/storage.modify scopes it asks for (work submitted without a token), and the token-exchange grant (RFC 8693) for work submitted with one"`
	ClientSecretFile string `envconfig:"CLIENT_SECRET_FILE" desc:"file holding that client's secret (read at every token request; white space around it is ignored)"`
	// FloorRate and SubjectTTL are the scheduler's: it says how long each
	// transfer is expected to take, and keeps the submitters' tokens.
	FloorRate  float64       `envconfig:"FLOOR_RATE" default:"1000000" desc:"bytes/s a transfer is expected to move at least on a link whose recent throughput the scheduler has not seen (else half that throughput): with the DTR's size it gives the grant's expected duration, which storage tokens must outlive"`
	SubjectTTL time.Duration `envconfig:"SUBJECT_TTL" default:"24h" desc:"the longest the scheduler keeps the bearer token a DTR was submitted with (bucket sluice_subject_tokens), for its transfers to exchange; each entry goes when its token expires, if sooner; a DTR that waits longer fails as if the token had expired"`
	Margin     time.Duration `envconfig:"MARGIN" default:"2m" desc:"a storage token is used for a transfer only if it stays valid this long past the transfer's expected end (the grant's expected duration); a cached token that does not is replaced by a new one, when a transfer asks, never before"`
}

// StorageSource obtains tokens for storage endpoints from an issuer: a
// token whose aud is the storage and whose scope is what is to be done
// there, such as storage.read:/data/file1 or storage.create:/data/dir.
// Work submitted with a bearer token gets the submitter's rights, by
// exchanging that token (Exchange); other work gets Sluice's own, by the
// client-credentials grant (Token).
//
// Tokens are fetched just in time: a cached token is reused only while it
// outlives the end of the work that asks for it (NeededUntil of the
// caller's context) by Margin; otherwise a new one is fetched then. Nothing
// is renewed in the background. It is safe for concurrent use.
type StorageSource struct {
	cfg    StorageConfig
	client *http.Client
	now    func() time.Time
	flight singleflight.Group

	mu       sync.Mutex
	tokenURL string // from discovery; "" until discovered
	cache    map[string]cachedToken
	maxCache int // entries; past it the soonest to expire go first
}

// cachedToken is a token, when it expires and how long it lived when
// fetched (the issuer's lifetime for it).
type cachedToken struct {
	token    string
	expiry   time.Time
	lifetime time.Duration
}

// defaultMaxCache bounds the tokens cached: a token per submitter's
// token, storage and path lives an hour or so, and thousands of
// transfers' worth fit in a few MiB.
const defaultMaxCache = 10000

// freshShare is the share of its lifetime a cached token may have used
// and still count as fresh: a new one would live at most that much
// longer, so it is reused even for work it does not outlive (a HEAD and
// then a GET of a long transfer make one exchange, not two).
const freshShare = 20 // 1/20: 5%

// Errors of token exchange, for errors.Is. None is worth a retry: the
// submitter's token will not become valid again, nor gain rights.
var (
	// ErrSubjectExpired: the submitter's token has expired, so it cannot
	// be exchanged for a storage token any more.
	ErrSubjectExpired = errors.New("the submitter's token has expired")
	// ErrExchangeRefused: the issuer would not exchange the submitter's
	// token for the storage token asked for (rights beyond the
	// submitter's, an audience it does not serve, a token it does not
	// accept).
	ErrExchangeRefused = errors.New("the issuer refused to exchange the submitter's token")
	// ErrSubjectNotKept: the work was submitted with a token that was not
	// kept for its transfers, which then get no storage token at all.
	ErrSubjectNotKept = errors.New("the token the work was submitted with was not kept for its transfers")
	// ErrForeignIssuer: the submitter's token is not of the storage token
	// issuer, which is then not sent it: an issuer is handed only its
	// own tokens.
	ErrForeignIssuer = errors.New("the submitter's token is not of the storage token issuer")
)

// NewStorageSource checks cfg. The issuer is first asked for its token
// endpoint when a token is wanted.
func NewStorageSource(cfg StorageConfig) (*StorageSource, error) {
	if err := checkURL(cfg.Issuer); err != nil {
		return nil, fmt.Errorf("token: storage token issuer (SLUICE_STORAGE_TOKEN_ISSUER): %w", err)
	}
	if cfg.ClientID == "" {
		return nil, errors.New("token: no storage token client is configured (SLUICE_STORAGE_TOKEN_CLIENT_ID)")
	}
	if cfg.ClientSecretFile == "" {
		return nil, errors.New("token: no storage token client secret file is configured (SLUICE_STORAGE_TOKEN_CLIENT_SECRET_FILE)")
	}
	if cfg.Margin < 0 {
		return nil, fmt.Errorf("token: storage token margin %v is negative (SLUICE_STORAGE_TOKEN_MARGIN)", cfg.Margin)
	}
	if cfg.FloorRate < 0 {
		return nil, fmt.Errorf("token: floor rate %v bytes/s is negative (SLUICE_STORAGE_TOKEN_FLOOR_RATE)", cfg.FloorRate)
	}
	if cfg.SubjectTTL < 0 {
		return nil, fmt.Errorf("token: submitters' tokens kept for %v, which is negative (SLUICE_STORAGE_TOKEN_SUBJECT_TTL)", cfg.SubjectTTL)
	}
	return &StorageSource{
		cfg:      cfg,
		client:   &http.Client{Timeout: 30 * time.Second},
		now:      time.Now,
		cache:    map[string]cachedToken{},
		maxCache: defaultMaxCache,
	}, nil
}

// neededUntilKey is the context key of the time a storage token must stay
// valid until.
type neededUntilKey struct{}

// WithNeededUntil returns a context whose storage tokens must stay valid
// until end (the expected end of the work that runs in it), plus Margin.
func WithNeededUntil(ctx context.Context, end time.Time) context.Context {
	return context.WithValue(ctx, neededUntilKey{}, end)
}

// NeededUntil is the time of WithNeededUntil; zero if none was set (then
// a token is needed from now, for Margin).
func NeededUntil(ctx context.Context) time.Time {
	t, _ := ctx.Value(neededUntilKey{}).(time.Time)
	return t
}

// Token returns a token for the storage audience (such as
// "https://storage.example.org:8443") with scope (one or more
// space-separated scopes, such as "storage.read:/data/file1") by Sluice's
// own client credentials: a cached one if it outlives the work of ctx,
// or else a new one from the issuer.
func (s *StorageSource) Token(ctx context.Context, audience, scope string) (string, error) {
	if audience == "" || strings.TrimSpace(scope) == "" {
		return "", fmt.Errorf("token: a storage token needs an audience and a scope (got %q and %q)", audience, scope)
	}
	return s.get(ctx, "client\x00"+audience+"\x00"+scope, func(ctx context.Context) (*oauth2.Token, error) {
		return s.request(ctx, audience, scope, nil)
	}, audience)
}

// Exchange returns a token for the storage audience with scope obtained by
// exchanging subject, the access token of the submitter of the work
// (RFC 8693 token exchange), so that the storage sees the submitter's
// rights. Sluice authenticates to the issuer as its client. A token
// already obtained from the same subject for the same audience and scope
// is reused while it outlives the work of ctx. A subject whose iss is not
// the storage token issuer is not sent and fails with ErrForeignIssuer,
// an expired one with ErrSubjectExpired, a refusal with
// ErrExchangeRefused; no error quotes a token.
func (s *StorageSource) Exchange(ctx context.Context, subject, audience, scope string) (string, error) {
	if audience == "" || strings.TrimSpace(scope) == "" {
		return "", fmt.Errorf("token: a storage token needs an audience and a scope (got %q and %q)", audience, scope)
	}
	if subject == "" {
		return "", errors.New("token: no submitter's token to exchange")
	}
	// The cache key holds a digest of the subject, never the token.
	sum := sha256.Sum256([]byte(subject))
	key := "exchange\x00" + hex.EncodeToString(sum[:]) + "\x00" + audience + "\x00" + scope
	expired := func() error {
		if exp := expiryOf(subject); !exp.IsZero() && !s.now().Before(exp) {
			return fmt.Errorf("token: storage token for %q with scope %q: %w (at %s): submit the work again with a valid token",
				audience, scope, ErrSubjectExpired, exp.UTC().Format(time.RFC3339))
		}
		return nil
	}
	if iss := issuerOf(subject); !sameIssuer(iss, s.cfg.Issuer) {
		// Checked before the cache too: no token of another issuer's is
		// ever sent, nor matched.
		return "", fmt.Errorf("token: storage token for %q with scope %q: %w (%q, not %q): its holder's work cannot get storage tokens here",
			audience, scope, ErrForeignIssuer, iss, s.cfg.Issuer)
	}
	return s.get(ctx, key, func(ctx context.Context) (*oauth2.Token, error) {
		if err := expired(); err != nil {
			return nil, err // the issuer is not asked
		}
		tok, err := s.request(ctx, audience, scope, url.Values{
			"grant_type":           {"urn:ietf:params:oauth:grant-type:token-exchange"},
			"subject_token":        {subject},
			"subject_token_type":   {"urn:ietf:params:oauth:token-type:access_token"},
			"requested_token_type": {"urn:ietf:params:oauth:token-type:access_token"},
		})
		var re *oauth2.RetrieveError
		if !errors.As(err, &re) {
			return tok, err
		}
		if err := expired(); err != nil {
			return nil, err // it expired on the way
		}
		// The issuer's own words, never its whole answer, which a
		// non-conforming issuer might make an echo of the request.
		if re.ErrorCode == "" {
			status := "no answer"
			if re.Response != nil {
				status = "HTTP " + re.Response.Status
			}
			return nil, fmt.Errorf("token: storage token for %q with scope %q: the issuer answered the token exchange with %s", audience, scope, status)
		}
		why := re.ErrorCode
		if re.ErrorDescription != "" {
			why += ": " + re.ErrorDescription
		}
		return nil, fmt.Errorf("token: storage token for %q with scope %q: %w (%s)", audience, scope, ErrExchangeRefused, why)
	}, audience)
}

// issuerOf is the iss of a JWT, read without checking it (the issuer
// checks); "" if it has none or is no JWT.
func issuerOf(raw string) string {
	var h header
	var p struct {
		Iss string `json:"iss"`
	}
	if parseUnverified(raw, &h, &p) != nil {
		return ""
	}
	return p.Iss
}

// sameIssuer reports whether two issuer URLs are the same, a trailing
// '/' aside.
func sameIssuer(a, b string) bool {
	return a != "" && strings.TrimSuffix(a, "/") == strings.TrimSuffix(b, "/")
}

// ExpiryOf is the exp of a JWT, read without checking its signature
// (for how long to keep it: whoever uses it checks it); zero if it has
// none or is no JWT.
func ExpiryOf(raw string) time.Time { return expiryOf(raw) }

// expiryOf is the exp of a JWT, read without checking it (the issuer
// checks); zero if it has none or is no JWT.
func expiryOf(raw string) time.Time {
	var h header
	var p struct {
		Exp *float64 `json:"exp"`
	}
	if parseUnverified(raw, &h, &p) != nil || p.Exp == nil {
		return time.Time{}
	}
	return time.Unix(int64(*p.Exp), 0)
}

// get returns the token cached under key if it outlives the work of ctx
// by Margin, or else fetches one with fetch and caches it.
func (s *StorageSource) get(ctx context.Context, key string, fetch func(context.Context) (*oauth2.Token, error), audience string) (string, error) {
	need := s.neededUntil(ctx)
	s.mu.Lock()
	c, ok := s.cache[key]
	s.mu.Unlock()
	if ok && (c.expiry.After(need) || c.fresh(s.now())) {
		return c.token, nil
	}
	// One request for a token at a time, whatever the callers: the first
	// one's ctx does not end the others' wait. A new token is the longest
	// lived the issuer gives, whoever asked.
	ch := s.flight.DoChan(key, func() (any, error) {
		// A request that ended between the look above and this flight
		// has cached its token: it is not asked for again.
		s.mu.Lock()
		c, ok := s.cache[key]
		s.mu.Unlock()
		if ok && (c.expiry.After(need) || c.fresh(s.now())) {
			return c.token, nil
		}
		fctx := context.WithoutCancel(ctx)
		start := s.now()
		tok, err := fetch(fctx)
		if err != nil {
			return "", err
		}
		s.store(key, tok, start)
		return tok.AccessToken, nil
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return "", r.Err
		}
		return r.Val.(string), nil
	case <-ctx.Done():
		return "", fmt.Errorf("token: storage token for %q: %w", audience, ctx.Err())
	}
}

// neededUntil is how long a token handed out in ctx must stay valid: the
// end of its work (or now) plus Margin.
func (s *StorageSource) neededUntil(ctx context.Context) time.Time {
	end := NeededUntil(ctx)
	if now := s.now(); end.Before(now) {
		end = now
	}
	return end.Add(s.cfg.Margin)
}

// request asks the issuer for a token: by the client-credentials grant,
// or by the grant and parameters of params.
func (s *StorageSource) request(ctx context.Context, audience, scope string, params url.Values) (*oauth2.Token, error) {
	tokenURL, err := s.endpoint(ctx)
	if err != nil {
		return nil, fmt.Errorf("token: storage token issuer %q: %w", s.cfg.Issuer, err)
	}
	secret, err := os.ReadFile(s.cfg.ClientSecretFile)
	if err != nil {
		return nil, fmt.Errorf("token: storage token client secret (SLUICE_STORAGE_TOKEN_CLIENT_SECRET_FILE): %w", err)
	}
	if len(strings.TrimSpace(string(secret))) == 0 {
		return nil, fmt.Errorf("token: storage token client secret file %s is empty", s.cfg.ClientSecretFile)
	}
	endpointParams := url.Values{"audience": {audience}}
	for k, v := range params {
		endpointParams[k] = v
	}
	cc := clientcredentials.Config{
		ClientID:       s.cfg.ClientID,
		ClientSecret:   strings.TrimSpace(string(secret)),
		TokenURL:       tokenURL,
		Scopes:         strings.Fields(scope),
		EndpointParams: endpointParams,
		AuthStyle:      oauth2.AuthStyleInHeader,
	}
	tok, err := cc.Token(context.WithValue(ctx, oauth2.HTTPClient, s.client))
	if err != nil {
		return nil, fmt.Errorf("token: storage token for %q with scope %q: %w", audience, scope, err)
	}
	if tok.AccessToken == "" {
		return nil, fmt.Errorf("token: storage token for %q with scope %q: the issuer sent none", audience, scope)
	}
	return tok, nil
}

// fresh reports whether c has used at most 1/freshShare of its lifetime
// at now: a new token would not outlive it by more.
func (c cachedToken) fresh(now time.Time) bool {
	return c.expiry.Sub(now) >= c.lifetime-c.lifetime/freshShare
}

// store caches tok under key, fetched at start. A full cache drops the
// expired first, then the eighth of its tokens that expire soonest: an
// O(n log n) sweep once per n/8 tokens stored, not a scan each time.
func (s *StorageSource) store(key string, tok *oauth2.Token, start time.Time) {
	var expiry time.Time
	if !tok.Expiry.IsZero() {
		// On s's clock: expires_in counts from the answer.
		expiry = start.Add(time.Until(tok.Expiry))
	} else {
		expiry = expiryOf(tok.AccessToken) // without expires_in, the token's own exp says
	}
	if !expiry.After(start) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.cache[key]; !ok && len(s.cache) >= s.maxCache {
		s.evict(start)
	}
	s.cache[key] = cachedToken{token: tok.AccessToken, expiry: expiry, lifetime: expiry.Sub(start)}
}

// evict makes room in the cache, s.mu held.
func (s *StorageSource) evict(now time.Time) {
	for k, c := range s.cache {
		if !now.Before(c.expiry) {
			delete(s.cache, k)
		}
	}
	if len(s.cache) < s.maxCache {
		return
	}
	keys := make([]string, 0, len(s.cache))
	for k := range s.cache {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return s.cache[a].expiry.Compare(s.cache[b].expiry) })
	for _, k := range keys[:max(1, len(keys)/8)] {
		delete(s.cache, k)
	}
}

// endpoint returns the issuer's token endpoint, discovering it first.
func (s *StorageSource) endpoint(ctx context.Context) (string, error) {
	s.mu.Lock()
	u := s.tokenURL
	s.mu.Unlock()
	if u != "" {
		return u, nil
	}
	d, err := discover(ctx, s.client, s.cfg.Issuer)
	if err != nil {
		return "", err
	}
	if err := checkURL(d.TokenEndpoint); err != nil {
		return "", fmt.Errorf("discovery: token_endpoint: %w", err)
	}
	s.mu.Lock()
	s.tokenURL = d.TokenEndpoint
	s.mu.Unlock()
	return d.TokenEndpoint, nil
}

// Subject gives the bearer token that the work running in a context was
// submitted with, read when a storage token is first needed (from where
// the scheduler keeps it, never from the work's record).
type Subject func(ctx context.Context) (string, error)

// subjectKey is the context key of a Subject.
type subjectKey struct{}

// WithSubject returns a context whose storage tokens are obtained by
// exchanging the token that s gives: the submitter's rights, not Sluice's.
func WithSubject(ctx context.Context, s Subject) context.Context {
	return context.WithValue(ctx, subjectKey{}, s)
}

// SubjectOf is the Subject of WithSubject; nil for work submitted without
// a token, which gets Sluice's own storage tokens.
func SubjectOf(ctx context.Context) Subject {
	s, _ := ctx.Value(subjectKey{}).(Subject)
	return s
}

// audiencesKey is the context key of the audiences a work's storage
// tokens may be for.
type audiencesKey struct{}

// WithAudiences returns a context whose storage tokens are only for the
// given audiences (the storages of its work's own URLs): a request to
// another, where a storage redirected it, gets no token. A storage's
// redirect must not make Sluice mint, for the storage it names, a token
// with the submitter's rights (or Sluice's) on a path of its choosing.
func WithAudiences(ctx context.Context, audiences []string) context.Context {
	return context.WithValue(ctx, audiencesKey{}, slices.Clone(audiences))
}

// ForRequest returns the storage token of a request to audience with
// scope, for the work of ctx: the submitter's, by Exchange, when ctx has a
// Subject; else Sluice's own, by Token. None ("") for an audience that
// WithAudiences did not name.
func (s *StorageSource) ForRequest(ctx context.Context, audience, scope string) (string, error) {
	if auds, ok := ctx.Value(audiencesKey{}).([]string); ok && !slices.Contains(auds, audience) {
		return "", nil
	}
	sub := SubjectOf(ctx)
	if sub == nil {
		return s.Token(ctx, audience, scope)
	}
	raw, err := sub(ctx)
	if err != nil {
		return "", fmt.Errorf("token: storage token for %q: %w", audience, err)
	}
	return s.Exchange(ctx, raw, audience, scope)
}
