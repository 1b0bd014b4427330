package token

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
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
	Issuer           string        `envconfig:"ISSUER" desc:"URL of the issuer of storage tokens (https, or http on 127.0.0.1, ::1 or localhost); its token endpoint comes from <issuer>/.well-known/openid-configuration; empty: no storage tokens"`
	ClientID         string        `envconfig:"CLIENT_ID" desc:"OAuth2 client of Sluice at that issuer, allowed the client-credentials grant for the storage audiences and storage.read/storage.modify scopes it asks for"`
	ClientSecretFile string        `envconfig:"CLIENT_SECRET_FILE" desc:"file holding that client's secret (read at every token request; white space around it is ignored)"`
	RenewBefore      time.Duration `envconfig:"RENEW_BEFORE" default:"2m" desc:"a cached storage token is renewed this long before it expires, or after half its lifetime if that comes first"`
}

// StorageSource obtains tokens for storage endpoints from an issuer by the
// OAuth2 client-credentials grant: a token whose aud is the storage and
// whose scope is what is to be done there, such as storage.read:/data/file1
// or storage.modify:/data/dir. Each token is cached until shortly before it
// expires. It is safe for concurrent use.
type StorageSource struct {
	cfg    StorageConfig
	client *http.Client
	now    func() time.Time
	flight singleflight.Group

	mu       sync.Mutex
	tokenURL string // from discovery; "" until discovered
	cache    map[string]cachedToken
}

// cachedToken is a token and the time to renew it.
type cachedToken struct {
	token   string
	renewAt time.Time
}

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
	if cfg.RenewBefore < 0 {
		return nil, fmt.Errorf("token: storage token renewal %v is negative (SLUICE_STORAGE_TOKEN_RENEW_BEFORE)", cfg.RenewBefore)
	}
	return &StorageSource{
		cfg:    cfg,
		client: &http.Client{Timeout: 30 * time.Second},
		now:    time.Now,
		cache:  map[string]cachedToken{},
	}, nil
}

// Token returns a token for the storage audience (such as
// "https://storage.example.org:8443") with scope (one or more
// space-separated scopes, such as "storage.read:/data/file1"): a cached one
// if it is not about to expire, or else a new one from the issuer.
func (s *StorageSource) Token(ctx context.Context, audience, scope string) (string, error) {
	if audience == "" || strings.TrimSpace(scope) == "" {
		return "", fmt.Errorf("token: a storage token needs an audience and a scope (got %q and %q)", audience, scope)
	}
	key := audience + "\x00" + scope
	s.mu.Lock()
	c, ok := s.cache[key]
	s.mu.Unlock()
	if ok && s.now().Before(c.renewAt) {
		return c.token, nil
	}
	// One request for a token at a time, whatever the callers: the first
	// one's ctx does not end the others' wait.
	ch := s.flight.DoChan(key, func() (any, error) {
		return s.fetch(context.WithoutCancel(ctx), key, audience, scope)
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

// fetch obtains a token from the issuer and caches it under key.
func (s *StorageSource) fetch(ctx context.Context, key, audience, scope string) (string, error) {
	tokenURL, err := s.endpoint(ctx)
	if err != nil {
		return "", fmt.Errorf("token: storage token issuer %q: %w", s.cfg.Issuer, err)
	}
	secret, err := os.ReadFile(s.cfg.ClientSecretFile)
	if err != nil {
		return "", fmt.Errorf("token: storage token client secret (SLUICE_STORAGE_TOKEN_CLIENT_SECRET_FILE): %w", err)
	}
	if len(strings.TrimSpace(string(secret))) == 0 {
		return "", fmt.Errorf("token: storage token client secret file %s is empty", s.cfg.ClientSecretFile)
	}
	cc := clientcredentials.Config{
		ClientID:       s.cfg.ClientID,
		ClientSecret:   strings.TrimSpace(string(secret)),
		TokenURL:       tokenURL,
		Scopes:         strings.Fields(scope),
		EndpointParams: url.Values{"audience": {audience}},
		AuthStyle:      oauth2.AuthStyleInHeader,
	}
	start := s.now()
	tok, err := cc.Token(context.WithValue(ctx, oauth2.HTTPClient, s.client))
	if err != nil {
		return "", fmt.Errorf("token: storage token for %q with scope %q: %w", audience, scope, err)
	}
	if tok.AccessToken == "" {
		return "", fmt.Errorf("token: storage token for %q with scope %q: the issuer sent none", audience, scope)
	}
	var expiry time.Time
	if !tok.Expiry.IsZero() {
		expiry = start.Add(time.Until(tok.Expiry))
	} else {
		// Without expires_in, the token's own exp says.
		var h header
		var p struct {
			Exp *float64 `json:"exp"`
		}
		if parseUnverified(tok.AccessToken, &h, &p) == nil && p.Exp != nil {
			expiry = time.Unix(int64(*p.Exp), 0)
		}
	}
	if lifetime := expiry.Sub(start); lifetime > 0 {
		renewAt := expiry.Add(-min(s.cfg.RenewBefore, lifetime/2))
		s.mu.Lock()
		for k, c := range s.cache {
			if !start.Before(c.renewAt) {
				delete(s.cache, k)
			}
		}
		s.cache[key] = cachedToken{token: tok.AccessToken, renewAt: renewAt}
		s.mu.Unlock()
	}
	return tok.AccessToken, nil
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
