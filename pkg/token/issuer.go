package token

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

const (
	// refetchEvery is the least time between two fetches of an issuer's
	// keys (or discovery document).
	refetchEvery = time.Second
	// keysMaxAge is how long fetched keys are used before they are
	// fetched again.
	keysMaxAge = 15 * time.Minute
	// maxDocBytes bounds a discovery document or key set.
	maxDocBytes = 1 << 20
)

// issuer holds what an issuer's discovery document and key set say.
type issuer struct {
	url    string
	client *http.Client
	log    *slog.Logger
	// gate is held by the one goroutine that fetches.
	gate chan struct{}

	mu      sync.RWMutex
	jwksURL string                     // from discovery; "" until discovered
	keys    map[string]jose.JSONWebKey // by kid
	fetched time.Time                  // of keys
	tried   time.Time                  // the last fetch, good or not
	err     error                      // of the last fetch
}

func newIssuer(url string, client *http.Client, log *slog.Logger) *issuer {
	return &issuer{url: url, client: client, log: log, gate: make(chan struct{}, 1)}
}

// key returns the issuer's key kid. If kid is not among the cached keys, or
// they are old, the key set is fetched again, at most once every
// refetchEvery: a caller may wait for that, and callers that waited while
// it was fetched take its outcome.
func (is *issuer) key(ctx context.Context, kid string) (jose.JSONWebKey, error) {
	is.mu.RLock()
	k, ok := is.keys[kid]
	fresh := time.Since(is.fetched) < keysMaxAge
	is.mu.RUnlock()
	if ok && fresh {
		return k, nil
	}
	asked := time.Now()
	select {
	case is.gate <- struct{}{}:
	case <-ctx.Done():
		return jose.JSONWebKey{}, fmt.Errorf("token: waiting for the keys of issuer %q: %w", is.url, ctx.Err())
	}
	defer func() { <-is.gate }()
	is.mu.RLock()
	k, ok = is.keys[kid]
	fresh = time.Since(is.fetched) < keysMaxAge
	tried, err := is.tried, is.err
	is.mu.RUnlock()
	switch {
	case ok && fresh:
		return k, nil
	case tried.After(asked), err != nil && time.Since(tried) < refetchEvery:
		// Fetched while this caller waited, or failed a moment ago.
		return is.found(k, ok, kid, err)
	}
	if wait := refetchEvery - time.Since(tried); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return jose.JSONWebKey{}, fmt.Errorf("token: waiting for the keys of issuer %q: %w", is.url, ctx.Err())
		}
	}
	err = is.fetch(ctx)
	is.mu.RLock()
	k, ok = is.keys[kid]
	is.mu.RUnlock()
	return is.found(k, ok, kid, err)
}

// found is what key returns once the keys are as new as they can be: k if
// ok (old keys are better than none while the issuer cannot be reached),
// else why not.
func (is *issuer) found(k jose.JSONWebKey, ok bool, kid string, err error) (jose.JSONWebKey, error) {
	switch {
	case ok:
		return k, nil
	case err != nil:
		return jose.JSONWebKey{}, fmt.Errorf("%w: %q: %w", ErrUnreachable, is.url, err)
	default:
		return jose.JSONWebKey{}, fmt.Errorf("token: signed by unknown key %q of issuer %q", kid, is.url)
	}
}

// refresh fetches the discovery document, if not yet fetched, and the key
// set, unless another goroutine is fetching them.
func (is *issuer) refresh(ctx context.Context) error {
	select {
	case is.gate <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-is.gate }()
	return is.fetch(ctx)
}

// fetch fetches the discovery document, if not yet fetched, and the key
// set. The caller holds the gate.
func (is *issuer) fetch(ctx context.Context) error {
	is.mu.RLock()
	jwksURL := is.jwksURL
	is.mu.RUnlock()
	var keys map[string]jose.JSONWebKey
	var err error
	if jwksURL == "" {
		var d discovery
		d, err = discover(ctx, is.client, is.url)
		jwksURL = d.JWKSURI
	}
	if err == nil {
		keys, err = fetchKeys(ctx, is.client, jwksURL)
	}
	if err != nil && ctx.Err() != nil {
		// The caller gave up: that says nothing of the issuer.
		return err
	}
	is.mu.Lock()
	defer is.mu.Unlock()
	is.tried, is.err = time.Now(), err
	if err != nil {
		// Discover again next time, in case the key set has moved.
		is.jwksURL = ""
		is.log.Warn("token issuer unreachable; its tokens are refused unless signed by keys fetched before", "issuer", is.url, "err", err)
		return err
	}
	is.jwksURL, is.keys, is.fetched = jwksURL, keys, is.tried
	is.log.Debug("token issuer keys fetched", "issuer", is.url, "keys", len(keys))
	return nil
}

// discovery is the part of an OpenID discovery document Sluice reads.
type discovery struct {
	Issuer        string `json:"issuer"`
	JWKSURI       string `json:"jwks_uri"`
	TokenEndpoint string `json:"token_endpoint"`
}

// discover fetches and checks the discovery document of issuer.
func discover(ctx context.Context, client *http.Client, issuer string) (discovery, error) {
	var d discovery
	u := strings.TrimSuffix(issuer, "/") + "/.well-known/openid-configuration"
	if err := getJSON(ctx, client, u, &d); err != nil {
		return d, fmt.Errorf("discovery: %w", err)
	}
	if d.Issuer != issuer {
		return d, fmt.Errorf("discovery: %s names issuer %q, not %q", u, d.Issuer, issuer)
	}
	if err := checkURL(d.JWKSURI); err != nil {
		return d, fmt.Errorf("discovery: jwks_uri: %w", err)
	}
	return d, nil
}

// fetchKeys fetches a JWK set and returns its public signing keys by kid.
// Keys that are not for signing, have no kid, are symmetric or are of a
// type go-jose does not know are left out.
func fetchKeys(ctx context.Context, client *http.Client, u string) (map[string]jose.JSONWebKey, error) {
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := getJSON(ctx, client, u, &set); err != nil {
		return nil, fmt.Errorf("keys: %w", err)
	}
	keys := map[string]jose.JSONWebKey{}
	for _, raw := range set.Keys {
		var k jose.JSONWebKey
		if err := json.Unmarshal(raw, &k); err != nil || k.KeyID == "" || k.Use != "" && k.Use != "sig" {
			continue
		}
		if pub := k.Public(); pub.Valid() {
			keys[k.KeyID] = pub
		}
	}
	return keys, nil
}

// getJSON GETs u and decodes its JSON body into v.
func getJSON(ctx context.Context, client *http.Client, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxDocBytes+1))
	if err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	if len(body) > maxDocBytes {
		return fmt.Errorf("GET %s: more than %d bytes", u, maxDocBytes)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	return nil
}

// checkURL refuses URLs that are not https, except http ones on a
// loopback host.
func checkURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if u.Host == "" {
		return fmt.Errorf("%q is not an absolute URL", s)
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if loopback(u.Hostname()) {
			return nil
		}
	}
	return fmt.Errorf("%q is not https (http is allowed on 127.0.0.1, ::1 and localhost only)", s)
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
