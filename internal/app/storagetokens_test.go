package app

import (
	"net/url"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/token"
	"github.com/sluice-dtr/sluice/pkg/token/tokentest"
)

// TestStorageTokensNameTheStorageAndThePathOfEachRequest: with
// SLUICE_STORAGE_TOKEN_* set, the token a transfer sends to a storage has
// that storage (scheme, host and port) as its audience and the request's
// path in its scope, storage.read for reads and storage.modify for writes.
func TestStorageTokensNameTheStorageAndThePathOfEachRequest(t *testing.T) {
	is := tokentest.Start(t)
	client := is.Client(t)
	cfg := Config{StorageTokens: token.StorageConfig{Issuer: is.URL, ClientID: client.ID, ClientSecretFile: client.SecretFile, RenewBefore: time.Minute}}
	source, err := cfg.storageTokens()
	if err != nil || source == nil {
		t.Fatalf("storage tokens: %v, %v", source, err)
	}
	tests := []struct {
		url       string
		write     bool
		audience  string
		wantScope string
	}{
		{"https://storage.example.org/data/f1", false, "https://storage.example.org:443", "storage.read:/data/f1"},
		{"https://storage.example.org:8443/data/dir/f2", true, "https://storage.example.org:8443", "storage.modify:/data/dir/f2"},
		// A space in the path cannot add a scope (the issuer splits scopes
		// on white space).
		{"https://storage.example.org/pub/a%20storage.modify:/", false, "https://storage.example.org:443", "storage.read:/pub/a%20storage.modify:/"},
	}
	for _, tt := range tests {
		u, _ := url.Parse(tt.url)
		raw, err := source(t.Context(), u, tt.write)
		if err != nil {
			t.Fatal(err)
		}
		v, err := token.NewVerifier(t.Context(), token.Config{Issuers: []string{is.URL}, Audience: []string{tt.audience}, Leeway: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		c, err := v.Verify(t.Context(), raw)
		if err != nil {
			t.Fatalf("%s: the token is not for %s: %v", tt.url, tt.audience, err)
		}
		if !c.HasScope(tt.wantScope) || len(c.Scopes) != 1 {
			t.Fatalf("%s: scopes %q, want [%s]", tt.url, c.Scopes, tt.wantScope)
		}
	}
	if none, err := (Config{}).storageTokens(); none != nil || err != nil {
		t.Fatalf("no issuer set: %v, %v; want no storage tokens", none, err)
	}
}
