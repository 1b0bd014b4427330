package token

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/token/tokentest"
)

const storageAud = "https://storage.example.org:8443"

func newStorageSource(t *testing.T, iss *tokentest.Issuer, c tokentest.Client) *StorageSource {
	t.Helper()
	s, err := NewStorageSource(StorageConfig{Issuer: iss.URL, ClientID: c.ID, ClientSecretFile: c.SecretFile, Margin: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestStorageTokenCarriesTheAudienceAndScope(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t)
	client := iss.Client(t)
	src := newStorageSource(t, iss, client)
	tests := []struct {
		audience, scope string
		wantScopes      []string
	}{
		{storageAud, "storage.read:/data/file1", []string{"storage.read:/data/file1"}},
		{storageAud, "storage.modify:/data/dir", []string{"storage.modify:/data/dir"}},
		{"https://other-storage.example.org", "storage.read:/a storage.modify:/b", []string{"storage.read:/a", "storage.modify:/b"}},
	}
	for _, tt := range tests {
		t.Run(tt.audience+" "+tt.scope, func(t *testing.T) {
			raw, err := src.Token(t.Context(), tt.audience, tt.scope)
			if err != nil {
				t.Fatal(err)
			}
			v := newVerifier(t, iss, func(c *Config) { c.Audience = []string{tt.audience} })
			c, err := v.Verify(t.Context(), raw)
			if err != nil {
				t.Fatal(err)
			}
			if c.Subject != client.ID {
				t.Errorf("subject %q, want the client %q", c.Subject, client.ID)
			}
			for _, s := range tt.wantScopes {
				if !c.HasScope(s) {
					t.Errorf("scopes %q lack %q", c.Scopes, s)
				}
			}
			if len(c.Scopes) != len(tt.wantScopes) {
				t.Errorf("scopes %q, want %q", c.Scopes, tt.wantScopes)
			}
			if d := time.Until(c.Expiry); d < 55*time.Minute || d > time.Hour+time.Minute {
				t.Errorf("expires in %v, want an hour", d)
			}
		})
	}
	// The token of one storage is not good for Sluice.
	raw, err := src.Token(t.Context(), storageAud, "storage.read:/data/file1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = newVerifier(t, iss, nil).Verify(t.Context(), raw)
	refused(t, err, "does not name this Sluice", raw)
}

func TestACachedStorageTokenIsReusedOnlyWhileItOutlivesTheTransferThatAsks(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t) // tokens live an hour; the margin is 2 minutes
	src := newStorageSource(t, iss, iss.Client(t))
	now := time.Now()
	src.now = func() time.Time { return now }
	steps := []struct {
		name         string
		after        time.Duration // clock moved on by this
		expected     time.Duration // the transfer's expected duration; 0: none said
		audience     string
		scope        string
		wantRequests int
		wantSame     bool // the token the last step with this audience and scope got
	}{
		{"first", 0, 0, storageAud, "storage.read:/data/file1", 1, false},
		{"again", 0, 0, storageAud, "storage.read:/data/file1", 1, true},
		{"a transfer of 50 minutes", 0, 50 * time.Minute, storageAud, "storage.read:/data/file1", 1, true},
		{"another scope", 0, 0, storageAud, "storage.create:/data/file1", 2, false},
		{"another audience", 0, 0, "https://b.example.org", "storage.create:/data/file1", 3, false},
		// 40 minutes on, 20 left: a 10-minute transfer still fits with
		// its margin, a 19-minute one does not and gets a new token.
		{"40 minutes on, a 10-minute transfer", 40 * time.Minute, 10 * time.Minute, "https://b.example.org", "storage.create:/data/file1", 3, true},
		{"a 19-minute transfer", 0, 19 * time.Minute, "https://b.example.org", "storage.create:/data/file1", 4, false},
		{"the new token serves the next", 0, 19 * time.Minute, "https://b.example.org", "storage.create:/data/file1", 4, true},
		// Nothing was renewed early: the first token served a short
		// transfer 57 minutes after it was fetched.
		{"57 minutes on, a short transfer", 17 * time.Minute, 0, storageAud, "storage.read:/data/file1", 4, true},
		{"58 minutes on, inside the margin", time.Minute + time.Second, 0, storageAud, "storage.read:/data/file1", 5, false},
	}
	last := map[string]string{}
	for _, s := range steps {
		now = now.Add(s.after)
		ctx := t.Context()
		if s.expected > 0 {
			ctx = WithNeededUntil(ctx, now.Add(s.expected))
		}
		tok, err := src.Token(ctx, s.audience, s.scope)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if n := iss.TokenRequests(); n != s.wantRequests {
			t.Fatalf("%s: %d token requests, want %d", s.name, n, s.wantRequests)
		}
		key := s.audience + " " + s.scope
		if (tok == last[key]) != s.wantSame {
			t.Fatalf("%s: same token as before: %v, want %v", s.name, tok == last[key], s.wantSame)
		}
		last[key] = tok
	}
}

func TestStorageTokenIsRequestedOnceForConcurrentCallers(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t)
	src := newStorageSource(t, iss, iss.Client(t))
	var wg sync.WaitGroup
	toks := make([]string, 8)
	for i := range toks {
		wg.Go(func() {
			tok, err := src.Token(t.Context(), storageAud, "storage.read:/data")
			if err != nil {
				t.Error(err)
			}
			toks[i] = tok
		})
	}
	wg.Wait()
	if n := iss.TokenRequests(); n != 1 {
		t.Fatalf("%d token requests, want 1", n)
	}
	for _, tok := range toks[1:] {
		if tok != toks[0] {
			t.Fatal("callers got different tokens")
		}
	}
}

func TestStorageTokenErrors(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t)
	client := iss.Client(t)
	wrong := filepath.Join(t.TempDir(), "wrong")
	if err := os.WriteFile(wrong, []byte("not-the-secret-7f3a"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		cfg        StorageConfig
		audience   string
		scope      string
		wantErr    string
		wantRemote bool // the issuer was asked
	}{
		{"wrong secret", StorageConfig{Issuer: iss.URL, ClientID: client.ID, ClientSecretFile: wrong}, storageAud, "storage.read:/a", "invalid_client", true},
		{"unknown client", StorageConfig{Issuer: iss.URL, ClientID: "nobody", ClientSecretFile: client.SecretFile}, storageAud, "storage.read:/a", "invalid_client", true},
		{"no secret file", StorageConfig{Issuer: iss.URL, ClientID: client.ID, ClientSecretFile: filepath.Join(t.TempDir(), "none")}, storageAud, "storage.read:/a", "no such file", false},
		{"empty secret file", StorageConfig{Issuer: iss.URL, ClientID: client.ID, ClientSecretFile: empty}, storageAud, "storage.read:/a", "is empty", false},
		{"no audience", StorageConfig{Issuer: iss.URL, ClientID: client.ID, ClientSecretFile: client.SecretFile}, "", "storage.read:/a", "needs an audience and a scope", false},
		{"no scope", StorageConfig{Issuer: iss.URL, ClientID: client.ID, ClientSecretFile: client.SecretFile}, storageAud, " ", "needs an audience and a scope", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := iss.TokenRequests()
			src, err := NewStorageSource(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = src.Token(t.Context(), tt.audience, tt.scope)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one saying %q", err, tt.wantErr)
			}
			if msg := err.Error(); strings.Contains(msg, client.Secret) || strings.Contains(msg, "not-the-secret") {
				t.Fatal("the error holds a secret")
			}
			if asked := iss.TokenRequests() > before; asked != tt.wantRemote {
				t.Fatalf("issuer asked: %v, want %v", asked, tt.wantRemote)
			}
		})
	}
}

func TestNewStorageSourceRefusesBadConfigurations(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     StorageConfig
		wantErr string
	}{
		{"no issuer", StorageConfig{ClientID: "c", ClientSecretFile: "/s"}, "SLUICE_STORAGE_TOKEN_ISSUER"},
		{"plain http", StorageConfig{Issuer: "http://iam.example.org", ClientID: "c", ClientSecretFile: "/s"}, "is not https"},
		{"no client", StorageConfig{Issuer: "https://iam.example.org", ClientSecretFile: "/s"}, "SLUICE_STORAGE_TOKEN_CLIENT_ID"},
		{"no secret file", StorageConfig{Issuer: "https://iam.example.org", ClientID: "c"}, "SLUICE_STORAGE_TOKEN_CLIENT_SECRET_FILE"},
		{"negative floor rate", StorageConfig{Issuer: "https://iam.example.org", ClientID: "c", ClientSecretFile: "/s", FloorRate: -1}, "SLUICE_STORAGE_TOKEN_FLOOR_RATE"},
		{"negative subject TTL", StorageConfig{Issuer: "https://iam.example.org", ClientID: "c", ClientSecretFile: "/s", SubjectTTL: -time.Hour}, "SLUICE_STORAGE_TOKEN_SUBJECT_TTL"},
		{"negative margin", StorageConfig{Issuer: "https://iam.example.org", ClientID: "c", ClientSecretFile: "/s", Margin: -time.Second}, "SLUICE_STORAGE_TOKEN_MARGIN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewStorageSource(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one saying %q", err, tt.wantErr)
			}
		})
	}
}

// TestAFreshTokenIsReusedForWorkItCannotOutliveRatherThanFetchedAgain: the
// issuer gives tokens of 10 minutes, a transfer is expected to take an
// hour. Its HEAD and its GET get one token: a second would live no longer.
// A minute on (a tenth of its life used), a new one is fetched.
func TestAFreshTokenIsReusedForWorkItCannotOutliveRatherThanFetchedAgain(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t)
	iss.SetTokenLifetime(10 * time.Minute)
	src := newStorageSource(t, iss, iss.Client(t))
	now := time.Now()
	src.now = func() time.Time { return now }
	long := func() context.Context { return WithNeededUntil(t.Context(), now.Add(time.Hour)) }
	for _, step := range []struct {
		name  string
		after time.Duration
		want  int
	}{
		{"the HEAD", 0, 1},
		{"the GET just after", time.Second, 1},
		{"a minute on", time.Minute, 2},
	} {
		now = now.Add(step.after)
		if _, err := src.Token(long(), storageAud, "storage.read:/data/big"); err != nil {
			t.Fatal(err)
		}
		if n := iss.TokenRequests(); n != step.want {
			t.Fatalf("%s: %d token requests, want %d", step.name, n, step.want)
		}
	}
}

// TestTheTokenCacheIsBoundedAndDropsTheTokensThatExpireSoonest: past its
// size the cache forgets the tokens that would expire first, keeping the
// newest.
func TestTheTokenCacheIsBoundedAndDropsTheTokensThatExpireSoonest(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t)
	src := newStorageSource(t, iss, iss.Client(t))
	src.maxCache = 8
	now := time.Now()
	src.now = func() time.Time { return now }
	scope := func(i int) string { return fmt.Sprintf("storage.read:/data/f%d", i) }
	for i := range 20 {
		if _, err := src.Token(t.Context(), storageAud, scope(i)); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Second) // each expires a second after the one before
		src.mu.Lock()
		n := len(src.cache)
		src.mu.Unlock()
		if n > src.maxCache {
			t.Fatalf("%d tokens cached, more than %d", n, src.maxCache)
		}
	}
	before := iss.TokenRequests()
	if _, err := src.Token(t.Context(), storageAud, scope(19)); err != nil {
		t.Fatal(err)
	}
	if iss.TokenRequests() != before {
		t.Error("the newest token was fetched again: it was dropped")
	}
	if _, err := src.Token(t.Context(), storageAud, scope(0)); err != nil {
		t.Fatal(err)
	}
	if iss.TokenRequests() != before+1 {
		t.Error("the first token, the soonest to expire, was still cached")
	}
}

// TestAWorksStorageTokensAreOnlyForTheStoragesOfItsOwnURLs: a request
// that a storage redirected to another storage gets no token, neither the
// submitter's nor Sluice's, and the issuer is not asked.
func TestAWorksStorageTokensAreOnlyForTheStoragesOfItsOwnURLs(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t)
	src := newStorageSource(t, iss, iss.Client(t))
	ctx := WithAudiences(t.Context(), []string{storageAud})
	for _, sub := range []Subject{nil, func(context.Context) (string, error) { return alice(t, iss, time.Time{}), nil }} {
		c := ctx
		if sub != nil {
			c = WithSubject(ctx, sub)
		}
		tok, err := src.ForRequest(c, "https://elsewhere.example.org:443", "storage.read:/atlas/data/f")
		if err != nil || tok != "" {
			t.Fatalf("a token for a storage the work does not name: %q, %v; want none", tok, err)
		}
		if tok, err := src.ForRequest(c, storageAud, "storage.read:/atlas/data/f"); err != nil || tok == "" {
			t.Fatalf("a token for the work's own storage: %q, %v", tok, err)
		}
	}
	if n := iss.TokenRequests(); n != 2 {
		t.Fatalf("%d token requests, want 2 (one for each of the work's own)", n)
	}
}
