package auth

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// verifier takes the token "good" as carol in /cms with compute.read.
type verifier struct{}

func (verifier) Verify(_ context.Context, raw string) (Token, error) {
	if raw != "good" {
		return Token{}, errors.New("token: not a JWT")
	}
	return Token{ID: "carol@https://issuer", Groups: []string{"/cms"}, Scopes: []string{ScopeRead}}, nil
}

func resolver(t *testing.T, admins ...string) *Resolver {
	t.Helper()
	p := filepath.Join(t.TempDir(), "users.json")
	users := `{"alice": {"dn": "/DC=org/CN=Alice", "fqans": ["/atlas"]}, "arex": {"trusted": true}, "ops": {"admin": true}}`
	if err := os.WriteFile(p, []byte(users), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := NewResolver(Config{UsersFile: p, Admins: admins}, verifier{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestTheCallerComesFromTheSubjectOrTheTokenNeverTheText(t *testing.T) {
	r := resolver(t, "/atlas/admin")
	bearer := func(v string) nats.Header { return nats.Header{"Authorization": []string{v}} }
	tests := []struct {
		name    string
		subject string
		h       nats.Header
		want    Caller
		wantErr string
	}{
		{"plain subject: the operator", "dtr.submit", nil, Operator, ""},
		{"a mapped user", "dtr.submit.alice", nil, Caller{Identity: dtr.Identity{DN: "/DC=org/CN=Alice", FQANs: []string{"/atlas"}}, Via: ViaUser, Name: "alice"}, ""},
		{"an unmapped user", "dtr.submit.bob", nil, Caller{Identity: dtr.Identity{DN: "user:bob"}, Via: ViaUser, Name: "bob"}, ""},
		{"a trusted user", "dtr.submit.arex", nil, Caller{Identity: dtr.Identity{DN: "user:arex"}, Via: ViaUser, Name: "arex", Trusted: true}, ""},
		{"an administrator user", "dtr.submit.ops", nil, Caller{Identity: dtr.Identity{DN: "user:ops"}, Via: ViaUser, Name: "ops", Admin: true}, ""},
		{"a token wins over the subject", "dtr.submit.alice", bearer("Bearer good"),
			Caller{Identity: dtr.Identity{DN: "carol@https://issuer", FQANs: []string{"/cms"}}, Via: ViaToken, Name: "carol@https://issuer", Scopes: []string{ScopeRead}}, ""},
		{"a bad token is refused, not ignored", "dtr.submit", bearer("Bearer bad"), Caller{}, "not a JWT"},
		{"an Authorization that is not Bearer", "dtr.submit", bearer("Basic YWxpY2U6cHc="), Caller{}, "holds no bearer token"},
		{"another subject", "sluice.api.cancel", nil, Caller{}, "is not dtr.submit"},
		{"a subject deeper than a user", "dtr.submit.alice.x", nil, Caller{}, "is not a user name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := r.Caller(context.Background(), "dtr.submit", tt.subject, tt.h)
			if tt.wantErr != "" {
				if err == nil || !contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !same(got, tt.want) {
				t.Fatalf("caller %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestAnUntrustedCallerOwnsWhatItSubmitsWhateverItsTextSays(t *testing.T) {
	claimed := dtr.Identity{DN: "/CN=mallory", FQANs: []string{"/atlas/Role=production"}}
	alice := Caller{Identity: dtr.Identity{DN: "/DC=org/CN=Alice"}, Via: ViaUser}
	if got := alice.Owner(claimed); got.DN != "/DC=org/CN=Alice" || len(got.FQANs) != 0 {
		t.Fatalf("alice's DTR naming mallory is owned by %+v", got)
	}
	if got := Operator.Owner(claimed); got.DN != "/CN=mallory" {
		t.Fatalf("the operator's DTR naming mallory is owned by %+v", got)
	}
	if alice.Owns(claimed) || !alice.Owns(dtr.Identity{DN: "/DC=org/CN=Alice"}) || !Operator.Owns(claimed) {
		t.Fatal("Owns: alice owns mallory's work, or not her own, or the operator not everyone's")
	}
}

func TestAdministratorsAreNamedByDNOrGroup(t *testing.T) {
	r := resolver(t, "/DC=org/CN=Alice", "/cms")
	c, err := r.Caller(context.Background(), "dtr.submit", "dtr.submit.alice", nil)
	if err != nil || !c.Admin {
		t.Fatalf("alice, named by DN: admin %v, %v", c.Admin, err)
	}
	c, err = r.Caller(context.Background(), "dtr.submit", "dtr.submit", nats.Header{"Authorization": []string{"Bearer good"}})
	if err != nil || !c.Admin {
		t.Fatalf("carol, in /cms: admin %v, %v", c.Admin, err)
	}
	if c, _ := resolver(t, "/cm").Caller(context.Background(), "dtr.submit", "dtr.submit", nats.Header{"Authorization": []string{"Bearer good"}}); c.Admin {
		t.Fatal("a group /cm made a member of /cms an administrator")
	}
}

func TestTokenCallersNeedTheScopeOfWhatTheyAsk(t *testing.T) {
	c := Caller{Via: ViaToken, Scopes: []string{ScopeRead}}
	if err := c.Allow(ScopeRead); err != nil {
		t.Fatal(err)
	}
	if err := c.Allow(ScopeCreate); !errors.Is(err, ErrForbidden) || !contains(err.Error(), ScopeCreate) {
		t.Fatalf("create without compute.create: %v", err)
	}
	if err := (Caller{Via: ViaUser}).Allow(ScopeCancel); err != nil {
		t.Fatalf("a NATS user has every scope: %v", err)
	}
}

func TestFileURLsAreConfinedToTheRootsAndWithoutRootsToTrustedCallers(t *testing.T) {
	user := Caller{Via: ViaUser, Name: "bob"}
	tests := []struct {
		name   string
		roots  []string
		caller Caller
		url    string
		ok     bool
	}{
		{"no roots, a user", nil, user, "file:///data/a", false},
		{"no roots, the operator", nil, Operator, "file:///etc/shadow", true},
		{"under a root", []string{"/data"}, user, "file:///data/a/b", true},
		{"the root itself", []string{"/data"}, user, "file:///data", true},
		{"outside", []string{"/data"}, user, "file:///etc/shadow", false},
		{"a sibling with the root as prefix", []string{"/data"}, user, "file:///database/x", false},
		{"climbing out", []string{"/data"}, user, "file:///data/../etc/passwd", false},
		{"the operator is confined by roots too", []string{"/data"}, Operator, "file:///etc/shadow", false},
		{"not a local path", nil, user, "https://example.org/a", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Confinement{Roots: tt.roots}.Check(tt.caller, tt.url)
			if (err == nil) != tt.ok || err != nil && !errors.Is(err, ErrConfined) {
				t.Fatalf("Check(%s) = %v, want ok %v", tt.url, err, tt.ok)
			}
		})
	}
}

func TestAUsersFileWithABadEntryIsRefusedNamingIt(t *testing.T) {
	for _, body := range []string{`{"a.b": {}}`, `{"alice": {"fqans": ["atlas"]}}`, `not json`} {
		p := filepath.Join(t.TempDir(), "users.json")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := NewResolver(Config{UsersFile: p}, nil); err == nil || !contains(err.Error(), "SLUICE_USERS") {
			t.Fatalf("users file %s: %v, want an error naming SLUICE_USERS", body, err)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func same(a, b Caller) bool {
	return a.Identity.DN == b.Identity.DN && slices.Equal(a.Identity.FQANs, b.Identity.FQANs) && a.Via == b.Via &&
		a.Name == b.Name && a.Trusted == b.Trusted && a.Admin == b.Admin && slices.Equal(a.Scopes, b.Scopes)
}

func TestANilResolverKnowsNoUsersAndTakesNoTokens(t *testing.T) {
	var r *Resolver
	if c, err := r.Caller(context.Background(), "dtr.submit", "dtr.submit", nil); err != nil || !same(c, Operator) {
		t.Fatalf("plain subject: %+v, %v; want the operator", c, err)
	}
	if c, err := r.Caller(context.Background(), "dtr.submit", "dtr.submit.bob", nil); err != nil || c.Identity.DN != "user:bob" || c.Trusted {
		t.Fatalf("a user's subject: %+v, %v; want user:bob, not trusted", c, err)
	}
	h := nats.Header{"Authorization": []string{"Bearer x"}}
	if _, err := r.Caller(context.Background(), "dtr.submit", "dtr.submit", h); err == nil || !contains(err.Error(), "takes no bearer tokens") {
		t.Fatalf("a token: %v, want it refused", err)
	}
}
