// Package token verifies WLCG / SciTokens bearer tokens and obtains tokens
// for storage endpoints.
//
// A token is a JWT (RFC 7519) in compact form, signed by one of the issuers
// Sluice trusts. Verify accepts it only if all of these hold:
//
//   - it is a signed JWT (three base64url parts) of at most 64 KiB whose
//     algorithm is one of RS256, RS384, RS512, PS256, PS384, PS512, ES256,
//     ES384 or ES512: "none" and the HMAC algorithms (HS*) are refused;
//   - its header names a key id (kid), as the WLCG profile requires;
//   - its iss is exactly one of Config.Issuers; the issuer's keys come from
//     the jwks_uri of its OpenID discovery document
//     (<issuer>/.well-known/openid-configuration), which must name the same
//     issuer. A kid not among the cached keys makes the key set be fetched
//     again (at most once a second an issuer), so an issuer may rotate its
//     keys; a kid still unknown then is refused. Cached keys are refetched
//     when 15 minutes old, so keys an issuer withdraws stop verifying;
//   - the signature verifies with that key (a different key under a known
//     kid is refused: the key set is not fetched again for it);
//   - exp is present and not past, nbf (if any) is not in the future and iat
//     (if any) is not in the future, each give or take Config.Leeway;
//   - aud (a string or a list) contains one of Config.Audience, or
//     "https://wlcg.cern.ch/jwt/v1/any" when Config.AcceptAnyAudience is set;
//   - sub is not empty;
//   - every group, from wlcg.groups or, without it, from groups, is a string
//     starting with "/".
//
// Issuers and the URLs their discovery names must be https, except on a
// loopback host (127.0.0.0/8, ::1, localhost), where http is allowed, for
// tests. An issuer that cannot be reached when the Verifier is made is tried
// again when one of its tokens comes (at most once a second); meanwhile its
// tokens are refused with an error wrapping ErrUnreachable.
//
// Neither a token nor its signature, nor a client secret, is ever put into
// an error or a log record.
package token

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// AnyAudience is the WLCG audience of a token meant for any service.
const AnyAudience = "https://wlcg.cern.ch/jwt/v1/any"

// maxTokenBytes bounds the size of a token Verify reads.
const maxTokenBytes = 64 << 10

// algorithms are the signature algorithms a token may use.
var algorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512,
	jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512,
}

// ErrUnreachable is wrapped by the errors of Verify that say a trusted
// issuer's discovery document or keys could not be fetched: the token may
// well be good (a server answers 503 rather than 401).
var ErrUnreachable = errors.New("token: issuer unreachable")

// Config is read from the environment with the prefix SLUICE_TOKEN
// (SLUICE_TOKEN_ISSUERS, ...).
type Config struct {
	Issuers           []string      `envconfig:"ISSUERS" desc:"comma-separated URLs of the token issuers trusted (each exactly as the iss of its tokens, without @; https, or http on 127.0.0.1, ::1 or localhost); their keys come from <issuer>/.well-known/openid-configuration"`
	Audience          []string      `envconfig:"AUDIENCE" desc:"comma-separated audiences that name this Sluice: a token's aud must contain one of them"`
	AcceptAnyAudience bool          `envconfig:"ACCEPT_ANY_AUDIENCE" default:"false" desc:"also accept tokens whose aud is WLCG's https://wlcg.cern.ch/jwt/v1/any"`
	Leeway            time.Duration `envconfig:"LEEWAY" default:"60s" desc:"clock skew allowed when checking a token's exp, nbf and iat"`
	// Log, if set, receives what the Verifier reports: an issuer that
	// cannot be reached, keys fetched again. Nil logs to slog.Default.
	Log *slog.Logger `ignored:"true"`
}

// Claims are what a verified token says of its bearer.
type Claims struct {
	Issuer  string
	Subject string
	// Groups are the token's wlcg.groups (or groups), such as "/atlas"
	// and "/atlas/production", each starting with "/".
	Groups []string
	// Scopes are the token's scope (space-separated) or scp claim, such
	// as "compute.create" or "storage.read:/data".
	Scopes []string
	Expiry time.Time
}

// ID is the key of the bearer's identity: "<sub>@<iss>". Issuers may not
// contain "@" (NewVerifier refuses them), so the issuer is everything after
// the last "@": two tokens have the same ID exactly when they have the
// same issuer and subject.
func (c Claims) ID() string { return c.Subject + "@" + c.Issuer }

// HasScope reports whether the token grants scope s, compared exactly
// (such as the WLCG compute scopes compute.create, compute.read,
// compute.modify and compute.cancel).
func (c Claims) HasScope(s string) bool { return slices.Contains(c.Scopes, s) }

// Verifier checks tokens against the configured issuers. It is safe for
// concurrent use.
type Verifier struct {
	issuers  map[string]*issuer
	audience []string
	anyAud   bool
	leeway   time.Duration
	now      func() time.Time
}

// NewVerifier checks cfg and fetches each issuer's discovery document and
// keys, for at most ten seconds and while ctx lasts. An issuer that cannot
// be reached does not make it fail: it is logged, and tried again when a
// token of that issuer comes.
func NewVerifier(ctx context.Context, cfg Config) (*Verifier, error) {
	if len(cfg.Issuers) == 0 {
		return nil, errors.New("token: no issuers are configured (SLUICE_TOKEN_ISSUERS)")
	}
	if len(cfg.Audience) == 0 {
		return nil, errors.New("token: no audience is configured (SLUICE_TOKEN_AUDIENCE)")
	}
	if cfg.Leeway < 0 {
		return nil, fmt.Errorf("token: leeway %v is negative (SLUICE_TOKEN_LEEWAY)", cfg.Leeway)
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	v := &Verifier{
		issuers:  map[string]*issuer{},
		audience: slices.Clone(cfg.Audience),
		anyAud:   cfg.AcceptAnyAudience,
		leeway:   cfg.Leeway,
		now:      time.Now,
	}
	client := &http.Client{Timeout: 10 * time.Second}
	for _, a := range cfg.Audience {
		if a == "" {
			return nil, errors.New("token: an empty audience is configured (SLUICE_TOKEN_AUDIENCE)")
		}
	}
	for _, iss := range cfg.Issuers {
		if strings.Contains(iss, "@") {
			return nil, fmt.Errorf("token: issuer %q contains @ (SLUICE_TOKEN_ISSUERS)", iss)
		}
		if err := checkURL(iss); err != nil {
			return nil, fmt.Errorf("token: issuer (SLUICE_TOKEN_ISSUERS): %w", err)
		}
		v.issuers[iss] = newIssuer(iss, client, log)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, is := range v.issuers {
		wg.Go(func() {
			// fetch logs what the issuer answers, not the wait cut short.
			if err := is.refresh(ctx); err != nil && ctx.Err() != nil {
				log.Warn("token issuer did not answer at start; its tokens will make it be asked again", "issuer", is.url, "err", err)
			}
		})
	}
	wg.Wait()
	return v, nil
}

// header is the part of a JWT header Verify reads before it trusts it.
type header struct {
	Alg string `json:"alg"`
	Kid string `json:"kid"`
}

// payload are the claims Verify reads.
type payload struct {
	jwt.Claims
	Scope      json.RawMessage `json:"scope"`
	Scp        json.RawMessage `json:"scp"`
	WLCGGroups json.RawMessage `json:"wlcg.groups"`
	Groups     json.RawMessage `json:"groups"`
}

// Verify checks the raw token (without "Bearer ") as the package
// documentation says and returns its claims.
func (v *Verifier) Verify(ctx context.Context, raw string) (Claims, error) {
	var h header
	var unverified struct {
		Issuer string `json:"iss"`
	}
	if err := parseUnverified(raw, &h, &unverified); err != nil {
		return Claims{}, err
	}
	if !slices.Contains(algorithms, jose.SignatureAlgorithm(h.Alg)) {
		return Claims{}, fmt.Errorf("token: signature algorithm %q is not allowed (want one of %v)", h.Alg, algorithms)
	}
	is, ok := v.issuers[unverified.Issuer]
	if !ok {
		return Claims{}, fmt.Errorf("token: issuer %q is not trusted", unverified.Issuer)
	}
	if h.Kid == "" {
		return Claims{}, errors.New("token: its header names no key (kid)")
	}
	key, err := is.key(ctx, h.Kid)
	if err != nil {
		return Claims{}, err
	}
	if key.Algorithm != "" && key.Algorithm != h.Alg {
		return Claims{}, fmt.Errorf("token: signed with %s, but key %q of issuer %q is for %s", h.Alg, h.Kid, is.url, key.Algorithm)
	}
	jws, err := jose.ParseSignedCompact(raw, []jose.SignatureAlgorithm{jose.SignatureAlgorithm(h.Alg)})
	if err != nil {
		return Claims{}, fmt.Errorf("token: not a JWT: %w", err)
	}
	body, err := jws.Verify(key.Key)
	if err != nil {
		return Claims{}, fmt.Errorf("token: signature does not verify with key %q of issuer %q", h.Kid, is.url)
	}
	var p payload
	if err := json.Unmarshal(body, &p); err != nil {
		return Claims{}, fmt.Errorf("token: claims: %w", err)
	}
	return v.check(p)
}

// parseUnverified splits a compact JWT and decodes its header and payload
// into h and p, without checking the signature.
func parseUnverified(raw string, h, p any) error {
	if len(raw) > maxTokenBytes {
		return fmt.Errorf("token: not a JWT: %d bytes, more than %d", len(raw), maxTokenBytes)
	}
	parts := strings.Split(raw, ".")
	if len(parts) != 3 {
		return fmt.Errorf("token: not a JWT: %d dot-separated parts, want 3", len(parts))
	}
	for i, dst := range []any{h, p} {
		name := [...]string{"header", "payload"}[i]
		b, err := base64.RawURLEncoding.DecodeString(parts[i])
		if err != nil {
			return fmt.Errorf("token: not a JWT: %s is not base64url", name)
		}
		if err := json.Unmarshal(b, dst); err != nil {
			return fmt.Errorf("token: not a JWT: %s is not a JSON object", name)
		}
	}
	return nil
}

// check checks verified claims and converts them.
func (v *Verifier) check(p payload) (Claims, error) {
	now := v.now()
	if p.Expiry == nil {
		return Claims{}, errors.New("token: has no expiry (exp)")
	}
	if exp := p.Expiry.Time(); now.After(exp.Add(v.leeway)) {
		return Claims{}, fmt.Errorf("token: expired at %s", exp.UTC().Format(time.RFC3339))
	}
	if p.NotBefore != nil {
		if nbf := p.NotBefore.Time(); now.Add(v.leeway).Before(nbf) {
			return Claims{}, fmt.Errorf("token: not valid before %s", nbf.UTC().Format(time.RFC3339))
		}
	}
	if p.IssuedAt != nil {
		if iat := p.IssuedAt.Time(); now.Add(v.leeway).Before(iat) {
			return Claims{}, fmt.Errorf("token: issued in the future, at %s", iat.UTC().Format(time.RFC3339))
		}
	}
	if !slices.ContainsFunc(p.Audience, v.names) {
		return Claims{}, fmt.Errorf("token: audience %q does not name this Sluice (want one of %q)", []string(p.Audience), v.audience)
	}
	if p.Subject == "" {
		return Claims{}, errors.New("token: has no subject (sub)")
	}
	c := Claims{Issuer: p.Issuer, Subject: p.Subject, Expiry: p.Expiry.Time()}
	var err error
	groups, claim := p.WLCGGroups, "wlcg.groups"
	if groups == nil {
		groups, claim = p.Groups, "groups"
	}
	if c.Groups, err = stringList(groups, false); err != nil {
		return Claims{}, fmt.Errorf("token: %s: %w", claim, err)
	}
	for _, g := range c.Groups {
		if !strings.HasPrefix(g, "/") {
			return Claims{}, fmt.Errorf("token: group %q in %s does not start with /", g, claim)
		}
	}
	scopes, claim := p.Scope, "scope"
	if scopes == nil {
		scopes, claim = p.Scp, "scp"
	}
	if c.Scopes, err = stringList(scopes, true); err != nil {
		return Claims{}, fmt.Errorf("token: %s: %w", claim, err)
	}
	return c, nil
}

// names reports whether aud names this Sluice.
func (v *Verifier) names(aud string) bool {
	return slices.Contains(v.audience, aud) || v.anyAud && aud == AnyAudience
}

// stringList decodes a claim that is a list of strings or, if spaced, a
// string of space-separated items too. An absent or null claim is no
// items.
func stringList(raw json.RawMessage, spaced bool) ([]string, error) {
	if raw == nil || string(raw) == "null" {
		return nil, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err == nil {
		return list, nil
	}
	var s string
	if spaced && json.Unmarshal(raw, &s) == nil {
		return strings.Fields(s), nil
	}
	if spaced {
		return nil, errors.New("neither a string nor a list of strings")
	}
	return nil, errors.New("not a list of strings")
}
