// Package tokentest runs, for a test, a real OpenID provider on 127.0.0.1:
// zitadel/oidc's op, on the in-memory storage its module ships as an
// example. The provider serves discovery (/.well-known/openid-configuration)
// and its keys (/keys) over plain http, and issues JWT access tokens by the
// client-credentials grant (/oauth/token) whose aud is the form parameter
// audience and whose scope is the scopes asked for, as WLCG storage tokens
// are. The same endpoint exchanges a user's token for a storage token
// (RFC 8693 token exchange) within that user's rights.
//
// WLCG tokens with chosen claims (wlcg.groups, scope, aud, nbf, a past exp)
// cannot be asked of the provider through its protocol, so Mint signs them
// with the provider's own current signing key, the one its /keys serve.
//
// The token package's Verifier allows such an http issuer because its host
// is a loopback address.
package tokentest

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/subtle"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/example/server/storage"
	zcrypto "github.com/zitadel/oidc/v3/pkg/crypto"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// Issuer is a running OpenID provider.
type Issuer struct {
	// URL is the issuer, as the iss of its tokens: http://127.0.0.1:<port>.
	URL string

	store         *store
	tokenRequests atomic.Int64
	keyRequests   atomic.Int64
	down          atomic.Bool
}

// Start starts an issuer that lives as long as the test.
func Start(t testing.TB) *Issuer {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	is := &Issuer{URL: "http://" + srv.Listener.Addr().String()}
	is.store = &store{
		Storage:  storage.NewStorageWithClients(storage.NewUserStore(is.URL), map[string]*storage.Client{}),
		clients:  map[string]string{},
		lifetime: time.Hour,
	}
	is.store.keys = []*signingKey{newKey(t, jose.RS256)}
	var cryptoKey [32]byte
	if _, err := rand.Read(cryptoKey[:]); err != nil {
		t.Fatal(err)
	}
	provider, err := op.NewProvider(&op.Config{CryptoKey: cryptoKey}, is.store, op.StaticIssuer(is.URL), op.WithAllowInsecure())
	if err != nil {
		t.Fatalf("tokentest: OpenID provider: %v", err)
	}
	tokenPath := provider.TokenEndpoint().Relative()
	keysPath := provider.KeysEndpoint().Relative()
	srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if is.down.Load() {
			http.Error(w, "tokentest: the issuer is down", http.StatusServiceUnavailable)
			return
		}
		switch r.URL.Path {
		case tokenPath:
			is.tokenRequests.Add(1)
			// The op hands the storage the scopes of a client-credentials
			// request, not its audience: the context carries it there.
			if err := r.ParseForm(); err == nil {
				r = r.WithContext(context.WithValue(r.Context(), audienceKey{}, r.PostForm["audience"]))
			}
		case keysPath:
			is.keyRequests.Add(1)
		}
		provider.ServeHTTP(w, r)
	})
	srv.Start()
	t.Cleanup(srv.Close)
	return is
}

// Mint says what a minted token claims.
type Mint struct {
	Subject  string   // sub; "": none
	Audience []string // aud; nil: none
	// Groups are wlcg.groups, such as "/atlas/production"; nil: none.
	Groups []string
	// Scopes are scope (space-separated), such as "compute.create"; nil:
	// none.
	Scopes    []string
	Expiry    time.Time // exp; zero: an hour from now
	NotBefore time.Time // nbf; zero: none
	IssuedAt  time.Time // iat; zero: now
	// Claims are set after the others, and may replace them; a nil value
	// removes that claim (such as "exp").
	Claims map[string]any
}

// Mint returns a WLCG token of the issuer, signed with its current key.
func (is *Issuer) Mint(t testing.TB, m Mint) string {
	t.Helper()
	now := time.Now()
	if m.Expiry.IsZero() {
		m.Expiry = now.Add(time.Hour)
	}
	if m.IssuedAt.IsZero() {
		m.IssuedAt = now
	}
	claims := map[string]any{
		"iss":      is.URL,
		"exp":      m.Expiry.Unix(),
		"iat":      m.IssuedAt.Unix(),
		"jti":      rand.Text(),
		"wlcg.ver": "1.0",
	}
	if m.Subject != "" {
		claims["sub"] = m.Subject
	}
	if m.Audience != nil {
		claims["aud"] = m.Audience
	}
	if m.Groups != nil {
		claims["wlcg.groups"] = m.Groups
	}
	if m.Scopes != nil {
		claims["scope"] = strings.Join(m.Scopes, " ")
	}
	if !m.NotBefore.IsZero() {
		claims["nbf"] = m.NotBefore.Unix()
	}
	for k, v := range m.Claims {
		if v == nil {
			delete(claims, k)
		} else {
			claims[k] = v
		}
	}
	key, _ := is.store.SigningKey(context.Background())
	signer, err := op.SignerFromKey(key)
	if err != nil {
		t.Fatalf("tokentest: signer: %v", err)
	}
	tok, err := zcrypto.Sign(claims, signer)
	if err != nil {
		t.Fatalf("tokentest: sign: %v", err)
	}
	return tok
}

// Rotate makes the issuer sign with a new RS256 key from now on; its /keys
// serve the new key beside the old ones.
func (is *Issuer) Rotate(t testing.TB) { is.RotateTo(t, "RS256") }

// RotateTo is Rotate to a key for alg: "RS256" or "ES256".
func (is *Issuer) RotateTo(t testing.TB, alg string) {
	t.Helper()
	k := newKey(t, jose.SignatureAlgorithm(alg))
	is.store.mu.Lock()
	is.store.keys = append(is.store.keys, k)
	is.store.mu.Unlock()
}

// KeyID is the kid of the issuer's current signing key.
func (is *Issuer) KeyID() string {
	is.store.mu.Lock()
	defer is.store.mu.Unlock()
	return is.store.keys[len(is.store.keys)-1].id
}

// Client is an OAuth2 client of the issuer allowed the client-credentials
// grant.
type Client struct {
	ID         string
	Secret     string
	SecretFile string // holds Secret
}

// Client registers a new client, with its secret in a file of the test's
// temporary directory.
func (is *Issuer) Client(t testing.TB) Client {
	t.Helper()
	c := Client{ID: "sluice-" + rand.Text()[:8], Secret: rand.Text()}
	c.SecretFile = filepath.Join(t.TempDir(), c.ID+".secret")
	if err := os.WriteFile(c.SecretFile, []byte(c.Secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	is.store.mu.Lock()
	is.store.clients[c.ID] = c.Secret
	is.store.mu.Unlock()
	return c
}

// SetTokenLifetime sets the lifetime of the tokens the issuer grants
// clients from now on (an hour at the start).
func (is *Issuer) SetTokenLifetime(d time.Duration) {
	is.store.mu.Lock()
	is.store.lifetime = d
	is.store.mu.Unlock()
}

// SetDown makes the issuer answer every request with 503 Service
// Unavailable (down) or serve again (!down).
func (is *Issuer) SetDown(down bool) { is.down.Store(down) }

// TokenRequests is how many requests the token endpoint has had (while
// up).
func (is *Issuer) TokenRequests() int { return int(is.tokenRequests.Load()) }

// Exchanges is how many token exchanges the issuer has granted.
func (is *Issuer) Exchanges() int {
	is.store.mu.Lock()
	defer is.store.mu.Unlock()
	return is.store.exchanges
}

// KeyRequests is how many requests the key set (jwks_uri) has had (while
// up).
func (is *Issuer) KeyRequests() int { return int(is.keyRequests.Load()) }

// audienceKey is the context key of the audiences of a token request.
type audienceKey struct{}

// store is the example storage with rotating keys and clients that get
// JWT access tokens by the client-credentials grant.
type store struct {
	*storage.Storage

	mu       sync.Mutex
	keys     []*signingKey     // the last one signs
	clients  map[string]string // secrets by id
	lifetime time.Duration
	// exchanges counts the token exchanges granted.
	exchanges int
}

var _ op.ClientCredentialsStorage = (*store)(nil)

func (s *store) SigningKey(context.Context) (op.SigningKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keys[len(s.keys)-1], nil
}

func (s *store) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var algs []jose.SignatureAlgorithm
	for _, k := range s.keys {
		algs = append(algs, k.alg)
	}
	return algs, nil
}

func (s *store) KeySet(context.Context) ([]op.Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []op.Key
	for _, k := range s.keys {
		keys = append(keys, publicKey{k})
	}
	return keys, nil
}

func (s *store) ClientCredentials(_ context.Context, clientID, clientSecret string) (op.Client, error) {
	s.mu.Lock()
	secret, ok := s.clients[clientID]
	s.mu.Unlock()
	if !ok || subtle.ConstantTimeCompare([]byte(secret), []byte(clientSecret)) != 1 {
		return nil, errors.New("wrong client or secret")
	}
	return jwtClient{storage.WebClient(clientID, secret)}, nil
}

func (s *store) ClientCredentialsTokenRequest(ctx context.Context, clientID string, scopes []string) (op.TokenRequest, error) {
	aud, _ := ctx.Value(audienceKey{}).([]string)
	return &oidc.JWTTokenRequest{Subject: clientID, Audience: aud, Scopes: scopes}, nil
}

func (s *store) CreateAccessToken(ctx context.Context, req op.TokenRequest) (string, time.Time, error) {
	s.mu.Lock()
	lifetime := s.lifetime
	s.mu.Unlock()
	return rand.Text(), time.Now().Add(lifetime), nil
}

// GetPrivateClaimsFromScopes gives the access tokens the op makes their
// scope, which it leaves out, and the WLCG profile's version.
func (s *store) GetPrivateClaimsFromScopes(_ context.Context, _, _ string, scopes []string) (map[string]any, error) {
	return map[string]any{"scope": strings.Join(scopes, " "), "wlcg.ver": "1.0"}, nil
}

// jwtClient is a client that gets JWT access tokens by the
// client-credentials grant.
type jwtClient struct{ *storage.Client }

func (jwtClient) AccessTokenType() op.AccessTokenType { return op.AccessTokenTypeJWT }
func (jwtClient) GrantTypes() []oidc.GrantType {
	return []oidc.GrantType{oidc.GrantTypeClientCredentials, oidc.GrantTypeTokenExchange}
}

// signingKey is a key of the issuer; it is the op's SigningKey.
type signingKey struct {
	id   string
	alg  jose.SignatureAlgorithm
	priv crypto.Signer
}

func newKey(t testing.TB, alg jose.SignatureAlgorithm) *signingKey {
	t.Helper()
	var priv crypto.Signer
	var err error
	switch alg {
	case jose.RS256:
		priv, err = rsa.GenerateKey(rand.Reader, 2048)
	case jose.ES256:
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	default:
		t.Fatalf("tokentest: no keys for %s", alg)
	}
	if err != nil {
		t.Fatal(err)
	}
	return &signingKey{id: rand.Text()[:12], alg: alg, priv: priv}
}

func (k *signingKey) SignatureAlgorithm() jose.SignatureAlgorithm { return k.alg }
func (k *signingKey) Key() any                                    { return k.priv }
func (k *signingKey) ID() string                                  { return k.id }

// publicKey is the public part of a signingKey, as /keys serve it.
type publicKey struct{ k *signingKey }

func (p publicKey) ID() string                         { return p.k.id }
func (p publicKey) Algorithm() jose.SignatureAlgorithm { return p.k.alg }
func (p publicKey) Use() string                        { return "sig" }
func (p publicKey) Key() any                           { return p.k.priv.Public() }

// Token exchange (RFC 8693), as a WLCG issuer does it: a client of the
// issuer (Sluice) hands in a user's access token (subject_token) and asks
// for a token for one storage (audience) with storage scopes. The new
// token is the user's (its sub), names the client as its actor (act), and
// holds only rights the user's token holds: a storage scope is granted
// only under a path the subject token has the same or a wider right on
// (storage.modify also covers storage.create), so a user cannot get
// through Sluice what the user could not get alone.

var _ op.TokenExchangeStorage = (*store)(nil)

// covers says which subject-token scopes grant a requested storage scope
// verb: a verb is covered by itself and by the verbs listed.
var covers = map[string][]string{
	"storage.read":   {"storage.read"},
	"storage.stage":  {"storage.stage"},
	"storage.create": {"storage.create", "storage.modify"},
	"storage.modify": {"storage.modify"},
}

// underPath reports whether path p is dir or inside it, segment by
// segment (/atlas/database is not inside /atlas/data).
func underPath(p, dir string) bool {
	ps, ds := strings.Split(strings.Trim(p, "/"), "/"), strings.Split(strings.Trim(dir, "/"), "/")
	if dir == "/" {
		return true
	}
	return len(ps) >= len(ds) && slices.Equal(ps[:len(ds)], ds)
}

// scopePath is the path of a storage scope as a storage that decodes it
// sees it; false for one that could name another path than it seems to:
// not absolute, badly escaped, an encoded '/', a backslash, or a '.' or
// '..' segment, written plainly or percent-encoded.
func scopePath(raw string) (string, bool) {
	if strings.Contains(strings.ToLower(raw), "%2f") {
		return "", false
	}
	p, err := url.PathUnescape(raw)
	if err != nil || !strings.HasPrefix(p, "/") || strings.Contains(p, `\`) {
		return "", false
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "." || seg == ".." {
			return "", false
		}
	}
	return p, true
}

// allowedBy reports whether the scope want ("storage.read:/a/b") is
// within the scopes held.
func allowedBy(want string, held []string) bool {
	verb, raw, ok := strings.Cut(want, ":")
	if !ok {
		return false
	}
	p, ok := scopePath(raw)
	if !ok {
		return false
	}
	for _, h := range held {
		hverb, hraw, ok := strings.Cut(h, ":")
		if !ok {
			continue
		}
		hpath, ok := scopePath(hraw)
		if !ok {
			continue
		}
		for _, v := range covers[verb] {
			if hverb == v && underPath(p, hpath) {
				return true
			}
		}
	}
	return false
}

func (s *store) ValidateTokenExchangeRequest(_ context.Context, req op.TokenExchangeRequest) error {
	switch req.GetRequestedTokenType() {
	case "":
		req.SetRequestedTokenType(oidc.AccessTokenType)
	case oidc.AccessTokenType:
	default:
		return oidc.ErrInvalidRequest().WithDescription("only access tokens are issued by exchange")
	}
	if req.GetExchangeSubjectTokenType() != oidc.AccessTokenType {
		return oidc.ErrInvalidRequest().WithDescription("subject_token_type must be an access token")
	}
	if len(req.GetAudience()) != 1 || req.GetAudience()[0] == "" {
		return oidc.ErrInvalidTarget().WithDescription("exactly one audience, the storage, is required")
	}
	claims := req.GetExchangeSubjectTokenClaims()
	scope, _ := claims["scope"].(string)
	held := strings.Fields(scope)
	if len(req.GetScopes()) == 0 {
		return oidc.ErrInvalidScope().WithDescription("no scope asked for")
	}
	for _, want := range req.GetScopes() {
		if !allowedBy(want, held) {
			return oidc.ErrInvalidScope().WithDescription("scope %s is beyond the subject token's rights", want)
		}
	}
	s.mu.Lock()
	s.exchanges++
	s.mu.Unlock()
	return nil
}

func (s *store) CreateTokenExchangeRequest(context.Context, op.TokenExchangeRequest) error {
	return nil
}

// GetPrivateClaimsFromTokenExchangeRequest gives the exchanged token its
// scope, the subject's groups and the client that acts for the subject.
func (s *store) GetPrivateClaimsFromTokenExchangeRequest(_ context.Context, req op.TokenExchangeRequest) (map[string]any, error) {
	claims := map[string]any{
		"scope":    strings.Join(req.GetScopes(), " "),
		"wlcg.ver": "1.0",
		"act":      map[string]any{"sub": req.GetClientID()},
	}
	if g, ok := req.GetExchangeSubjectTokenClaims()["wlcg.groups"]; ok {
		claims["wlcg.groups"] = g
	}
	return claims, nil
}

func (s *store) SetUserinfoFromTokenExchangeRequest(context.Context, *oidc.UserInfo, op.TokenExchangeRequest) error {
	return nil
}

// AuthorizeClientIDSecret and GetClientByClientID know the clients of
// Client, which the token-exchange grant authenticates this way.
func (s *store) AuthorizeClientIDSecret(ctx context.Context, clientID, clientSecret string) error {
	_, err := s.ClientCredentials(ctx, clientID, clientSecret)
	return err
}

func (s *store) GetClientByClientID(ctx context.Context, clientID string) (op.Client, error) {
	s.mu.Lock()
	secret, ok := s.clients[clientID]
	s.mu.Unlock()
	if !ok {
		return s.Storage.GetClientByClientID(ctx, clientID)
	}
	return jwtClient{storage.WebClient(clientID, secret)}, nil
}
