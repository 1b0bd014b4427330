package token

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/token/tokentest"
)

// alice is a submitter's token: her rights on storage are those of her
// scopes.
func alice(t *testing.T, iss *tokentest.Issuer, expiry time.Time) string {
	return iss.Mint(t, tokentest.Mint{
		Subject:  "alice",
		Audience: []string{sluiceAud},
		Groups:   []string{"/atlas"},
		Scopes:   []string{"compute.create", "storage.read:/atlas/data", "storage.create:/atlas/user/alice"},
		Expiry:   expiry,
	})
}

func TestAnExchangedStorageTokenIsTheSubmittersScopedToTheStorageAndPath(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t)
	client := iss.Client(t)
	src := newStorageSource(t, iss, client)
	subject := alice(t, iss, time.Time{})
	tests := []struct{ scope string }{
		{"storage.read:/atlas/data/run1/file1"},
		{"storage.create:/atlas/user/alice/out/file1"},
		{"storage.read:/atlas/data"},
	}
	for _, tt := range tests {
		t.Run(tt.scope, func(t *testing.T) {
			raw, err := src.Exchange(t.Context(), subject, storageAud, tt.scope)
			if err != nil {
				t.Fatal(err)
			}
			if raw == subject {
				t.Fatal("the submitter's own token came back")
			}
			c, err := newVerifier(t, iss, func(c *Config) { c.Audience = []string{storageAud} }).Verify(t.Context(), raw)
			if err != nil {
				t.Fatal(err)
			}
			if c.Subject != "alice" {
				t.Errorf("subject %q, want alice's (the storage sees her, not Sluice's client)", c.Subject)
			}
			if len(c.Scopes) != 1 || c.Scopes[0] != tt.scope {
				t.Errorf("scopes %q, want exactly %q", c.Scopes, tt.scope)
			}
			if len(c.Groups) != 1 || c.Groups[0] != "/atlas" {
				t.Errorf("groups %q, want alice's", c.Groups)
			}
		})
	}
	if n := iss.Exchanges(); n != len(tests) {
		t.Fatalf("%d exchanges, want %d", n, len(tests))
	}
	// The same subject, audience and scope again: the token exchanged is
	// reused.
	if _, err := src.Exchange(t.Context(), subject, storageAud, tests[0].scope); err != nil {
		t.Fatal(err)
	}
	if n := iss.Exchanges(); n != len(tests) {
		t.Fatalf("%d exchanges after asking again, want %d", n, len(tests))
	}
}

func TestTheIssuerRefusesToExchangeForRightsBeyondTheSubmitters(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t)
	src := newStorageSource(t, iss, iss.Client(t))
	subject := alice(t, iss, time.Time{})
	tests := []struct {
		name, audience, scope, want string
	}{
		{"another path", storageAud, "storage.read:/cms/data/file1", "storage.read:/cms/data/file1 is beyond"},
		{"a sibling whose name starts alike", storageAud, "storage.read:/atlas/database/file1", "beyond the subject token's rights"},
		{"out by dot-dot", storageAud, "storage.read:/atlas/data/../secret", "beyond the subject token's rights"},
		{"out by encoded dot-dot", storageAud, "storage.read:/atlas/data/%2e%2e/user/bob/secret", "beyond the subject token's rights"},
		{"out by encoded dot-dot in capitals", storageAud, "storage.read:/atlas/data/%2E%2E/user/bob/secret", "beyond the subject token's rights"},
		{"out by an encoded slash", storageAud, "storage.read:/atlas/data%2f..%2fsecret", "beyond the subject token's rights"},
		{"out by a backslash", storageAud, `storage.read:/atlas/data/..\secret`, "beyond the subject token's rights"},
		{"a dot segment", storageAud, "storage.read:/atlas/data/./f", "beyond the subject token's rights"},
		{"write where she may only read", storageAud, "storage.create:/atlas/data/file1", "beyond the subject token's rights"},
		{"modify where she may only create", storageAud, "storage.modify:/atlas/user/alice/f", "beyond the subject token's rights"},
		{"no audience", "", "storage.read:/atlas/data/f", "needs an audience"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := src.Exchange(t.Context(), subject, tt.audience, tt.scope)
			refused(t, err, tt.want, subject)
			if tt.audience != "" && !errors.Is(err, ErrExchangeRefused) {
				t.Fatalf("error %v is not ErrExchangeRefused", err)
			}
		})
	}
	if n := iss.Exchanges(); n != 0 {
		t.Fatalf("%d exchanges granted, want none", n)
	}
}

func TestAnExpiredSubmittersTokenFailsWithAnErrorNamingTheExpiryNotTheToken(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t)
	src := newStorageSource(t, iss, iss.Client(t))
	expired := alice(t, iss, time.Now().Add(-time.Minute))
	_, err := src.Exchange(t.Context(), expired, storageAud, "storage.read:/atlas/data/f")
	refused(t, err, "the submitter's token has expired", expired)
	if !errors.Is(err, ErrSubjectExpired) {
		t.Fatalf("error %v is not ErrSubjectExpired", err)
	}
	if iss.TokenRequests() != 0 {
		t.Fatal("the issuer was asked to exchange a token known to have expired")
	}

	// One that the issuer finds expired while Sluice's clock, an hour
	// behind, does not: the issuer's refusal, in its words.
	src.now = func() time.Time { return time.Now().Add(-time.Hour) }
	_, err = src.Exchange(t.Context(), expired, storageAud, "storage.read:/atlas/data/f")
	refused(t, err, "refused to exchange the submitter's token (invalid_request: subject_token is invalid)", expired)
	if !errors.Is(err, ErrExchangeRefused) {
		t.Fatalf("error %v is not ErrExchangeRefused", err)
	}
}

func TestAnExchangedTokenIsNotReusedForAnotherSubmitter(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t)
	src := newStorageSource(t, iss, iss.Client(t))
	a := alice(t, iss, time.Time{})
	b := iss.Mint(t, tokentest.Mint{Subject: "bob", Scopes: []string{"storage.read:/atlas/data"}})
	ta, err := src.Exchange(t.Context(), a, storageAud, "storage.read:/atlas/data/f")
	if err != nil {
		t.Fatal(err)
	}
	tb, err := src.Exchange(t.Context(), b, storageAud, "storage.read:/atlas/data/f")
	if err != nil {
		t.Fatal(err)
	}
	if ta == tb {
		t.Fatal("bob got alice's storage token")
	}
	c, err := newVerifier(t, iss, func(c *Config) { c.Audience = []string{storageAud} }).Verify(t.Context(), tb)
	if err != nil || c.Subject != "bob" {
		t.Fatalf("bob's token: subject %q, %v", c.Subject, err)
	}
	if strings.Contains(tb, "alice") {
		t.Fatal("bob's token names alice")
	}
}

func TestAnIssuerThatFailsAnExchangeIsNamedWithItsStatusNotItsAnswer(t *testing.T) {
	t.Parallel()
	iss := tokentest.Start(t)
	src := newStorageSource(t, iss, iss.Client(t))
	subject := alice(t, iss, time.Time{})
	if _, err := src.Exchange(t.Context(), subject, storageAud, "storage.read:/atlas/data/a"); err != nil {
		t.Fatal(err) // the issuer's endpoints are known from now on
	}
	iss.SetDown(true)
	_, err := src.Exchange(t.Context(), subject, storageAud, "storage.read:/atlas/data/b")
	refused(t, err, "the issuer answered the token exchange with HTTP 503 Service Unavailable", subject)
	if errors.Is(err, ErrExchangeRefused) || errors.Is(err, ErrSubjectExpired) {
		t.Fatalf("an issuer that is down is taken for a refusal: %v", err)
	}
	if strings.Contains(err.Error(), "the issuer is down") {
		t.Fatalf("the error quotes the issuer's answer: %v", err)
	}
}

// TestATokenOfAnotherIssuerIsNeverSentToTheStorageTokenIssuer: with
// several issuers of submitters' tokens, a user of issuer B must not have
// their token POSTed to the storage token issuer A: the exchange fails at
// once, naming both issuers, and A is never asked.
func TestATokenOfAnotherIssuerIsNeverSentToTheStorageTokenIssuer(t *testing.T) {
	t.Parallel()
	a, b := tokentest.Start(t), tokentest.Start(t)
	src := newStorageSource(t, a, a.Client(t))
	for _, tt := range []struct{ name, subject string }{
		{"a token of another issuer", alice(t, b, time.Time{})},
		{"no JWT at all", "an-opaque-token-of-some-issuer"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := src.Exchange(t.Context(), tt.subject, storageAud, "storage.read:/atlas/data/f")
			refused(t, err, "is not of the storage token issuer", tt.subject)
			if !errors.Is(err, ErrForeignIssuer) {
				t.Fatalf("error %v is not ErrForeignIssuer", err)
			}
		})
	}
	if n := a.TokenRequests(); n != 0 {
		t.Fatalf("the storage token issuer was sent %d token requests, want none", n)
	}
	// Its own users' tokens are exchanged as before.
	if _, err := src.Exchange(t.Context(), alice(t, a, time.Time{}), storageAud, "storage.read:/atlas/data/f"); err != nil {
		t.Fatal(err)
	}
}
