package token

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/token/tokentest"
	"github.com/sluice-dtr/sluice/pkg/transfer/xrootdtest"
)

// TestTheRealXrootdTakesAnExchangedTokenForItsOwnPathOnly: a token
// exchanged from alice's for storage.read on one file opens that file on
// the real xrootd (SciTokens plugin), and no other file, even one she may
// read; a token exchanged for another storage is refused.
func TestTheRealXrootdTakesAnExchangedTokenForItsOwnPathOnly(t *testing.T) {
	iss := tokentest.Start(t)
	s := xrootdtest.Start(t, xrootdtest.Options{HTTP: true, Tokens: &xrootdtest.Tokens{Issuer: iss.URL}})
	s.WriteFile(t, "/data/alice/a", []byte("file a"))
	s.WriteFile(t, "/data/alice/b", []byte("file b"))
	src := newStorageSource(t, iss, iss.Client(t))
	subject := iss.Mint(t, tokentest.Mint{Subject: "alice", Audience: []string{sluiceAud}, NotBefore: time.Now().Add(-time.Minute),
		Scopes: []string{"compute.create", "storage.read:/data/alice"}})
	forA, err := src.Exchange(t.Context(), subject, s.HTTPS, "storage.read:/data/alice/a")
	if err != nil {
		t.Fatal(err)
	}
	elsewhere, err := src.Exchange(t.Context(), subject, "https://elsewhere.example:443", "storage.read:/data/alice/a")
	if err != nil {
		t.Fatal(err)
	}
	get := func(path, tok string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, s.HTTPS+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := s.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	cases := []struct {
		name, path, token string
		want              int
	}{
		{"its own path", "/data/alice/a", forA, http.StatusOK},
		{"another file alice may read", "/data/alice/b", forA, http.StatusForbidden},
		{"another storage's token", "/data/alice/a", elsewhere, http.StatusForbidden},
		{"alice's own token, which names Sluice", "/data/alice/a", subject, http.StatusForbidden},
	}
	for _, tc := range cases {
		if got := get(tc.path, tc.token); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
