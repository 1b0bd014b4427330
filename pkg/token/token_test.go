package token

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/sluice-dtr/sluice/pkg/token/tokentest"
)

const sluiceAud = "https://sluice.example.org"

// newVerifier makes a Verifier that trusts iss and whose audience is
// sluiceAud; change, if not nil, changes its configuration first.
func newVerifier(t *testing.T, iss *tokentest.Issuer, change func(*Config)) *Verifier {
	t.Helper()
	cfg := Config{
		Issuers:  []string{iss.URL},
		Audience: []string{sluiceAud},
		Leeway:   time.Minute,
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if change != nil {
		change(&cfg)
	}
	v, err := NewVerifier(t.Context(), cfg)
	if err != nil {
		t.Fatalf("NewVerifier: %v", err)
	}
	return v
}

// refused checks that err says want and gives away neither the token nor
// its signature.
func refused(t *testing.T, err error, want, raw string) {
	t.Helper()
	if err == nil {
		t.Fatalf("the token was accepted; want an error saying %q", want)
	}
	msg := err.Error()
	if sig := raw[strings.LastIndex(raw, ".")+1:]; len(raw) > 20 && strings.Contains(msg, raw) || len(sig) > 8 && strings.Contains(msg, sig) {
		t.Fatal("the error holds the token or its signature")
	}
	if !strings.Contains(msg, want) {
		t.Fatalf("error %q does not say %q", msg, want)
	}
}

func TestVerifyReturnsTheClaimsOfAGoodToken(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t)
	v := newVerifier(t, iss, nil)
	exp := time.Now().Add(30 * time.Minute).Truncate(time.Second)
	raw := iss.Mint(t, tokentest.Mint{
		Subject:  "e3a8c1f2-user",
		Audience: []string{"https://other.example.org", sluiceAud},
		Groups:   []string{"/atlas", "/atlas/production"},
		Scopes:   []string{"compute.create", "compute.read", "storage.read:/data"},
		Expiry:   exp,
	})
	c, err := v.Verify(t.Context(), raw)
	if err != nil {
		t.Fatal(err)
	}
	want := Claims{
		Issuer:  iss.URL,
		Subject: "e3a8c1f2-user",
		Groups:  []string{"/atlas", "/atlas/production"},
		Scopes:  []string{"compute.create", "compute.read", "storage.read:/data"},
	}
	if c.Issuer != want.Issuer || c.Subject != want.Subject || !slices.Equal(c.Groups, want.Groups) || !slices.Equal(c.Scopes, want.Scopes) || !c.Expiry.Equal(exp) {
		t.Fatalf("claims %+v, want %+v expiring %v", c, want, exp)
	}
	if c.ID() != "e3a8c1f2-user@"+iss.URL {
		t.Fatalf("ID %q", c.ID())
	}
	for s, want := range map[string]bool{"compute.create": true, "compute.read": true, "compute.modify": false, "compute.cancel": false, "compute": false, "storage.read:/data": true} {
		if c.HasScope(s) != want {
			t.Errorf("HasScope(%q) = %v", s, !want)
		}
	}
}

func TestVerifyChecksTheClaims(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t)
	now := time.Now()
	aud := []string{sluiceAud}
	tests := []struct {
		name       string
		mint       tokentest.Mint
		anyAud     bool
		wantErr    string // "": accepted
		wantGroups []string
		wantScopes []string
	}{
		{name: "expired", mint: tokentest.Mint{Subject: "u", Audience: aud, Expiry: now.Add(-2 * time.Minute)},
			wantErr: "token: expired at " + now.Add(-2*time.Minute).UTC().Format("2006-01-02T15:04")},
		{name: "expired within the leeway", mint: tokentest.Mint{Subject: "u", Audience: aud, Expiry: now.Add(-30 * time.Second)}},
		{name: "no expiry", mint: tokentest.Mint{Subject: "u", Audience: aud, Claims: map[string]any{"exp": nil}},
			wantErr: "token: has no expiry (exp)"},
		{name: "not yet valid", mint: tokentest.Mint{Subject: "u", Audience: aud, NotBefore: now.Add(2 * time.Minute)},
			wantErr: "token: not valid before "},
		{name: "not yet valid within the leeway", mint: tokentest.Mint{Subject: "u", Audience: aud, NotBefore: now.Add(30 * time.Second)}},
		{name: "issued in the future", mint: tokentest.Mint{Subject: "u", Audience: aud, IssuedAt: now.Add(5 * time.Minute)},
			wantErr: "token: issued in the future"},
		{name: "wrong audience", mint: tokentest.Mint{Subject: "u", Audience: []string{"https://fts.example.org"}},
			wantErr: `token: audience ["https://fts.example.org"] does not name this Sluice (want one of ["https://sluice.example.org"])`},
		{name: "no audience", mint: tokentest.Mint{Subject: "u"},
			wantErr: "does not name this Sluice"},
		{name: "audience as a string", mint: tokentest.Mint{Subject: "u", Claims: map[string]any{"aud": sluiceAud}}},
		{name: "any audience refused unless configured", mint: tokentest.Mint{Subject: "u", Audience: []string{AnyAudience}},
			wantErr: "does not name this Sluice"},
		{name: "any audience accepted when configured", mint: tokentest.Mint{Subject: "u", Audience: []string{AnyAudience}}, anyAud: true},
		{name: "no subject", mint: tokentest.Mint{Audience: aud},
			wantErr: "token: has no subject (sub)"},
		{name: "empty subject", mint: tokentest.Mint{Audience: aud, Claims: map[string]any{"sub": ""}},
			wantErr: "token: has no subject (sub)"},
		{name: "wlcg.groups", mint: tokentest.Mint{Subject: "u", Audience: aud, Groups: []string{"/cms", "/cms/users"}},
			wantGroups: []string{"/cms", "/cms/users"}},
		{name: "wlcg.groups before groups", mint: tokentest.Mint{Subject: "u", Audience: aud, Groups: []string{"/cms"}, Claims: map[string]any{"groups": []string{"/lhcb"}}},
			wantGroups: []string{"/cms"}},
		{name: "groups without wlcg.groups", mint: tokentest.Mint{Subject: "u", Audience: aud, Claims: map[string]any{"groups": []string{"/lhcb"}}},
			wantGroups: []string{"/lhcb"}},
		{name: "group not starting with a slash", mint: tokentest.Mint{Subject: "u", Audience: aud, Groups: []string{"/atlas", "atlas-admins"}},
			wantErr: `token: group "atlas-admins" in wlcg.groups does not start with /`},
		{name: "wlcg.groups not a list", mint: tokentest.Mint{Subject: "u", Audience: aud, Claims: map[string]any{"wlcg.groups": "/atlas"}},
			wantErr: "token: wlcg.groups: not a list of strings"},
		{name: "scope", mint: tokentest.Mint{Subject: "u", Audience: aud, Claims: map[string]any{"scope": " compute.read  compute.cancel "}},
			wantScopes: []string{"compute.read", "compute.cancel"}},
		{name: "scp as a list", mint: tokentest.Mint{Subject: "u", Audience: aud, Claims: map[string]any{"scp": []string{"compute.modify"}}},
			wantScopes: []string{"compute.modify"}},
		{name: "scope not strings", mint: tokentest.Mint{Subject: "u", Audience: aud, Claims: map[string]any{"scope": 7}},
			wantErr: "token: scope: neither a string nor a list of strings"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := newVerifier(t, iss, func(c *Config) { c.AcceptAnyAudience = tt.anyAud })
			raw := iss.Mint(t, tt.mint)
			c, err := v.Verify(t.Context(), raw)
			if tt.wantErr != "" {
				refused(t, err, tt.wantErr, raw)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.Groups, tt.wantGroups) || !slices.Equal(c.Scopes, tt.wantScopes) {
				t.Fatalf("groups %q and scopes %q, want %q and %q", c.Groups, c.Scopes, tt.wantGroups, tt.wantScopes)
			}
		})
	}
}

// sign returns a JWS of claims signed with key, named kid, by alg.
func sign(t *testing.T, alg jose.SignatureAlgorithm, key any, kid string, claims map[string]any) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: jose.JSONWebKey{Key: key, KeyID: kid}}, (&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	jws, err := s.Sign(body)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func TestVerifyRefusesForgedAndMalformedTokens(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t)
	other := tokentest.Start(t)
	v := newVerifier(t, iss, nil)
	claims := map[string]any{"iss": iss.URL, "sub": "u", "aud": sluiceAud, "exp": time.Now().Add(time.Hour).Unix()}
	body, _ := json.Marshal(claims)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	good := iss.Mint(t, tokentest.Mint{Subject: "u", Audience: []string{sluiceAud}})
	dot := strings.LastIndex(good, ".")
	tests := []struct {
		name    string
		raw     string
		wantErr string
	}{
		{"untrusted issuer", other.Mint(t, tokentest.Mint{Subject: "u", Audience: []string{sluiceAud}}),
			`token: issuer "` + other.URL + `" is not trusted`},
		{"issuer claimed by another issuer's token", other.Mint(t, tokentest.Mint{Subject: "u", Audience: []string{sluiceAud}, Claims: map[string]any{"iss": iss.URL}}),
			"token: signed by unknown key"},
		{"another key with the issuer's kid", sign(t, jose.RS256, rsaKey, iss.KeyID(), claims),
			`token: signature does not verify with key "` + iss.KeyID() + `"`},
		{"an EC key with the issuer's RSA kid", sign(t, jose.ES256, ecKey, iss.KeyID(), claims),
			"token: signed with ES256, but key"},
		{"unknown kid", sign(t, jose.RS256, rsaKey, "not-a-key-of-the-issuer", claims),
			`token: signed by unknown key "not-a-key-of-the-issuer" of issuer "` + iss.URL + `"`},
		{"no kid", sign(t, jose.RS256, rsaKey, "", claims),
			"token: its header names no key (kid)"},
		{"alg none", b64(`{"alg":"none","kid":"`+iss.KeyID()+`"}`) + "." + b64(string(body)) + ".",
			`token: signature algorithm "none" is not allowed`},
		{"HS256", sign(t, jose.HS256, []byte("a shared secret of thirty-two by"), iss.KeyID(), claims),
			`token: signature algorithm "HS256" is not allowed`},
		{"tampered payload", good[:strings.Index(good, ".")] + "." + b64(strings.Replace(string(body), `"sub":"u"`, `"sub":"root"`, 1)) + good[dot:],
			"token: signature does not verify"},
		{"garbage", "not a token at all", "token: not a JWT: 1 dot-separated parts, want 3"},
		{"empty", "", "token: not a JWT"},
		{"five parts (JWE)", "a.b.c.d.e", "token: not a JWT: 5 dot-separated parts, want 3"},
		{"header not base64url", "%%%." + b64(string(body)) + ".c2ln", "token: not a JWT: header is not base64url"},
		{"payload not JSON", b64(`{"alg":"RS256"}`) + "." + b64("[1,2") + ".c2ln", "token: not a JWT: payload is not a JSON object"},
		{"too long", strings.Repeat("a", 70000), "token: not a JWT: 70000 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := v.Verify(t.Context(), tt.raw)
			refused(t, err, tt.wantErr, tt.raw)
		})
	}
}

func TestVerifyFollowsKeyRotation(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t)
	v := newVerifier(t, iss, nil)
	if n := iss.KeyRequests(); n != 1 {
		t.Fatalf("%d key set requests at the start, want 1", n)
	}
	mint := func() string {
		return iss.Mint(t, tokentest.Mint{Subject: "u", Audience: []string{sluiceAud}})
	}
	old := mint()
	oldKid := iss.KeyID()
	steps := []struct {
		name     string
		rotate   string // alg of a new key; "": none
		raw      func() string
		wantKeys int // key set requests after Verify
	}{
		{"a token of the current key", "", func() string { return old }, 1},
		{"a token of a new RSA key", "RS256", mint, 2},
		{"a token of the old key, still served", "", func() string { return old }, 2},
		{"a token of a new EC key", "ES256", mint, 3},
		{"a token of the EC key again", "", mint, 3},
	}
	for _, s := range steps {
		if s.rotate != "" {
			iss.RotateTo(t, s.rotate)
		}
		if _, err := v.Verify(t.Context(), s.raw()); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if n := iss.KeyRequests(); n != s.wantKeys {
			t.Fatalf("%s: %d key set requests, want %d", s.name, n, s.wantKeys)
		}
	}
	if iss.KeyID() == oldKid {
		t.Fatal("the key id did not change")
	}
}

func TestVerifyWaitsForAnIssuerUnreachableAtStart(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t)
	iss.SetDown(true)
	v := newVerifier(t, iss, nil)
	raw := iss.Mint(t, tokentest.Mint{Subject: "u", Audience: []string{sluiceAud}})
	_, err := v.Verify(t.Context(), raw)
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("error %v, want one wrapping ErrUnreachable", err)
	}
	refused(t, err, `token: issuer unreachable: "`+iss.URL+`": discovery: GET `+iss.URL+"/.well-known/openid-configuration: 503", raw)

	iss.SetDown(false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := v.Verify(t.Context(), raw)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrUnreachable) || time.Now().After(deadline) {
			t.Fatalf("after the issuer came up: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestVerifyUsesOldKeysWhileTheIssuerIsDown(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t)
	var logged strings.Builder
	v := newVerifier(t, iss, func(c *Config) { c.Log = slog.New(slog.NewTextHandler(&logged, nil)) })
	raw := iss.Mint(t, tokentest.Mint{Subject: "u", Audience: []string{sluiceAud}})
	iss.SetDown(true)
	// The keys are old: Verify fetches them again, in vain.
	for _, is := range v.issuers {
		is.mu.Lock()
		is.fetched = is.fetched.Add(-keysMaxAge)
		is.tried = is.fetched
		is.mu.Unlock()
	}
	if _, err := v.Verify(t.Context(), raw); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logged.String(), "token issuer unreachable") {
		t.Fatalf("the failed fetch is not logged: %q", logged.String())
	}
	if strings.Contains(logged.String(), raw[strings.LastIndex(raw, ".")+1:]) {
		t.Fatal("the log holds the token")
	}
}

func TestClaimsIDIsUniquePerIssuerAndSubject(t *testing.T) {
	t.Parallel()
	ids := map[string]Claims{}
	for _, c := range []Claims{
		{Issuer: "https://iam.example.org/", Subject: "alice"},
		{Issuer: "https://iam.example.org", Subject: "alice"},
		{Issuer: "https://other.example.org/", Subject: "alice"},
		{Issuer: "https://iam.example.org/", Subject: "alice@https://other.example.org/"},
		{Issuer: "https://other.example.org/", Subject: "alice@https://iam.example.org/"},
	} {
		if d, ok := ids[c.ID()]; ok {
			t.Fatalf("%+v and %+v have the same ID %q", c, d, c.ID())
		}
		ids[c.ID()] = c
	}
	if id := (Claims{Issuer: "https://iam.example.org/", Subject: "alice"}).ID(); id != "alice@https://iam.example.org/" {
		t.Fatalf("ID %q", id)
	}
}

func TestNewVerifierRefusesBadConfigurations(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"no issuers", Config{Audience: []string{sluiceAud}}, "SLUICE_TOKEN_ISSUERS"},
		{"no audience", Config{Issuers: []string{"https://iam.example.org/"}}, "SLUICE_TOKEN_AUDIENCE"},
		{"empty audience", Config{Issuers: []string{"https://iam.example.org/"}, Audience: []string{""}}, "an empty audience"},
		{"plain http", Config{Issuers: []string{"http://iam.example.org/"}, Audience: []string{sluiceAud}}, "is not https"},
		{"not absolute", Config{Issuers: []string{"iam.example.org"}, Audience: []string{sluiceAud}}, "not an absolute URL"},
		{"@ in the issuer", Config{Issuers: []string{"https://a@iam.example.org/"}, Audience: []string{sluiceAud}}, "contains @"},
		{"negative leeway", Config{Issuers: []string{"https://iam.example.org/"}, Audience: []string{sluiceAud}, Leeway: -time.Second}, "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewVerifier(context.Background(), tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one saying %q", err, tt.wantErr)
			}
		})
	}
}
