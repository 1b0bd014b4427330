// Package auth says who sent a message to Sluice, from credentials only.
//
// A caller is established in one of three ways, strongest first:
//
//  1. A bearer token (WLCG / SciTokens JWT) in the message's Authorization
//     header: the caller is the token's issuer and subject, in the groups
//     its wlcg.groups claim names, with the rights its scopes give.
//  2. A NATS user's own subject: a message on <subject>.<user> (dtr.submit.alice,
//     sluice.api.cancel.alice) comes from NATS user <user>, because the NATS
//     server lets only that user publish there (deploy/nats/sluice.conf).
//     The users file (SLUICE_USERS) gives each user a DN and FQANs.
//  3. The plain subject (dtr.submit, sluice.api.cancel): the operator, whom
//     the NATS server's permissions alone decide. The operator is trusted
//     and an administrator.
//
// The text of a message never names its caller. A trusted caller (the
// operator, or a user the users file marks trusted, such as a front end that
// authenticated its own users as ARC's A-REX does) may state the owner of
// the work it submits; any other caller's work is owned by the caller.
package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// The WLCG compute scopes a token caller needs: to submit, to read the
// state of its work, to change its priority and to cancel it.
const (
	ScopeCreate = "compute.create"
	ScopeRead   = "compute.read"
	ScopeModify = "compute.modify"
	ScopeCancel = "compute.cancel"
)

// How a caller was established.
const (
	ViaOperator = "operator"
	ViaUser     = "user"
	ViaToken    = "token"
)

// Caller is who sent a message.
type Caller struct {
	// Identity is the owner the caller's work gets, and the one its
	// requests are checked against.
	Identity dtr.Identity
	// Via is ViaOperator, ViaUser or ViaToken; Name is the NATS user or the
	// token's identity.
	Via  string
	Name string
	// Trusted callers may state the owner of the work they submit.
	Trusted bool
	// Admin callers may see and change every job and DTR, and reconfigure
	// shares.
	Admin bool
	// Scopes are a token's; a caller established otherwise has them all.
	Scopes []string
}

// String names the caller for logs and errors (no secret in it).
func (c Caller) String() string {
	if c.Via == ViaOperator {
		return "the operator"
	}
	return c.Via + " " + c.Name
}

// Owner returns the owner of work the caller submits that states claimed:
// the claim, if the caller is trusted and states one, else the caller.
func (c Caller) Owner(claimed dtr.Identity) dtr.Identity {
	if c.Trusted && (claimed.DN != "" || len(claimed.FQANs) > 0) {
		return claimed
	}
	return dtr.Identity{DN: c.Identity.DN, FQANs: slices.Clone(c.Identity.FQANs)}
}

// Owns says whether the caller may see and change work of owner: an
// administrator may, and so may the owner itself.
func (c Caller) Owns(owner dtr.Identity) bool {
	return c.Admin || owner.DN == c.Identity.DN
}

// ErrForbidden is what a caller gets for a request it has no right to.
var ErrForbidden = errors.New("forbidden")

// Allow returns nil if the caller's scopes include scope, else an
// ErrForbidden that names it.
func (c Caller) Allow(scope string) error {
	if c.Via != ViaToken || slices.Contains(c.Scopes, scope) {
		return nil
	}
	return fmt.Errorf("%w: the token has no %s scope", ErrForbidden, scope)
}

// Token is what a verified bearer token says of its holder.
type Token struct {
	// ID is unique per issuer and subject, and is the holder's DN.
	ID     string
	Groups []string
	Scopes []string
}

// Verifier checks a bearer token.
type Verifier interface {
	Verify(ctx context.Context, raw string) (Token, error)
}

// User is an entry of the users file: what a NATS user's own subjects
// make its caller.
type User struct {
	DN      string   `json:"dn,omitempty"`
	FQANs   []string `json:"fqans,omitempty"`
	Trusted bool     `json:"trusted,omitempty"`
	Admin   bool     `json:"admin,omitempty"`
}

// Config is how callers are established, read from SLUICE_*.
type Config struct {
	UsersFile string   `envconfig:"USERS" desc:"JSON file of NATS users that submit on their own subjects: {\"alice\": {\"dn\": \"/DC=org/CN=Alice\", \"fqans\": [\"/atlas/Role=production\"]}, \"arex\": {\"trusted\": true}, \"ops\": {\"admin\": true}}; a user not in it is the DN user:<name> with no FQANs; trusted users may state the owner of their work"`
	Admins    []string `envconfig:"ADMINS" desc:"comma-separated administrators besides the operator: DNs or token identities, and groups (starting with /, such as /atlas/admin) whose members are administrators; they may see, cancel and reprioritise every job and DTR and reconfigure shares"`
}

// Resolver establishes callers.
type Resolver struct {
	users  map[string]User
	admins []string
	tokens Verifier
}

// NewResolver reads cfg; tokens, if not nil, checks bearer tokens (without
// it a message that carries one is refused).
func NewResolver(cfg Config, tokens Verifier) (*Resolver, error) {
	r := &Resolver{users: map[string]User{}, admins: cfg.Admins, tokens: tokens}
	if cfg.UsersFile != "" {
		b, err := os.ReadFile(cfg.UsersFile)
		if err != nil {
			return nil, fmt.Errorf("SLUICE_USERS: %w", err)
		}
		if err := json.Unmarshal(b, &r.users); err != nil {
			return nil, fmt.Errorf("SLUICE_USERS %s: %w", cfg.UsersFile, err)
		}
		for name, u := range r.users {
			if !ValidUser(name) {
				return nil, fmt.Errorf("SLUICE_USERS %s: user %q: a user name is one NATS subject token (no '.', '*', '>' or space)", cfg.UsersFile, name)
			}
			for _, f := range u.FQANs {
				if !strings.HasPrefix(f, "/") {
					return nil, fmt.Errorf("SLUICE_USERS %s: user %q: FQAN %q does not start with \"/\"", cfg.UsersFile, name, f)
				}
			}
		}
	}
	return r, nil
}

// ValidUser says whether name can be a NATS user's subject token.
func ValidUser(name string) bool {
	return name != "" && !strings.ContainsAny(name, ".*> \t\r\n")
}

// Operator is the caller of the plain subjects.
var Operator = Caller{Via: ViaOperator, Name: ViaOperator, Trusted: true, Admin: true}

// Caller establishes who sent a message on subject, whose plain form is
// base, with header h. A nil Resolver knows no users' DNs, no
// administrators and no token issuers.
func (r *Resolver) Caller(ctx context.Context, base, subject string, h nats.Header) (Caller, error) {
	if r == nil {
		r = &Resolver{}
	}
	var c Caller
	switch {
	case subject == base:
		c = Operator
	case strings.HasPrefix(subject, base+"."):
		name := subject[len(base)+1:]
		if !ValidUser(name) {
			return Caller{}, fmt.Errorf("subject %s: %q is not a user name", subject, name)
		}
		u, ok := r.users[name]
		if !ok {
			u = User{DN: "user:" + name}
		}
		if u.DN == "" {
			u.DN = "user:" + name
		}
		c = Caller{Identity: dtr.Identity{DN: u.DN, FQANs: u.FQANs}, Via: ViaUser, Name: name, Trusted: u.Trusted, Admin: u.Admin}
	default:
		return Caller{}, fmt.Errorf("subject %s is not %s or %s.<user>", subject, base, base)
	}
	if raw, ok := bearer(h); ok {
		return r.tokenCaller(ctx, raw)
	}
	if !c.Admin {
		c.Admin = r.admin(c.Identity)
	}
	return c, nil
}

// ErrNoToken is what a request without a bearer token gets where a token
// is the only way in (the FTS3 REST API): unlike ErrForbidden, the caller
// has not said who it is yet.
var ErrNoToken = errors.New("no bearer token")

// TokenCaller establishes the caller of a request whose only credential
// is its Authorization header, as the FTS3 REST API's requests are: the
// holder of the bearer token in it, checked as Caller checks a message's.
// Without one it is never the operator but an error wrapping ErrNoToken.
func (r *Resolver) TokenCaller(ctx context.Context, authorization string) (Caller, error) {
	if r == nil {
		r = &Resolver{}
	}
	h := nats.Header{}
	h.Set("Authorization", authorization)
	raw, ok := bearer(h)
	if !ok || raw == "" {
		return Caller{}, fmt.Errorf("%w: send Authorization: Bearer <token>", ErrNoToken)
	}
	return r.tokenCaller(ctx, raw)
}

// tokenCaller checks a raw bearer token and returns its holder.
func (r *Resolver) tokenCaller(ctx context.Context, raw string) (Caller, error) {
	if r.tokens == nil {
		return Caller{}, fmt.Errorf("%w: this Sluice takes no bearer tokens (SLUICE_TOKEN_ISSUERS is empty)", ErrForbidden)
	}
	if raw == "" {
		return Caller{}, fmt.Errorf("%w: the Authorization header holds no bearer token", ErrForbidden)
	}
	t, err := r.tokens.Verify(ctx, raw)
	if err != nil {
		return Caller{}, fmt.Errorf("%w: %w", ErrForbidden, err)
	}
	c := Caller{Identity: dtr.Identity{DN: t.ID, FQANs: slices.Clone(t.Groups)}, Via: ViaToken, Name: t.ID, Scopes: t.Scopes}
	c.Admin = r.admin(c.Identity)
	return c, nil
}

// MayTag returns nil if the caller may choose the SciTag (packet marking)
// of its transfers: trusted callers and administrators may; anyone else
// would mark its traffic as another experiment's or activity's, so its
// transfers get the site's mapping.
func (c Caller) MayTag() error {
	if c.Trusted || c.Admin {
		return nil
	}
	return fmt.Errorf("%w: only trusted callers and administrators may choose a SciTag; %s's transfers are marked by the site's mapping of its VO and activity", ErrForbidden, c)
}

// Bearer returns the token of a message's "Authorization: Bearer" header,
// "" if it has none: what a caller established ViaToken sent.
func Bearer(h nats.Header) string {
	tok, _ := bearer(h)
	return tok
}

// bearer returns the token of an "Authorization: Bearer" header.
func bearer(h nats.Header) (string, bool) {
	v := strings.TrimSpace(h.Get("Authorization"))
	if v == "" {
		return "", false
	}
	scheme, tok, _ := strings.Cut(v, " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", true // not a bearer token: refused as no token at all
	}
	return strings.TrimSpace(tok), true
}

// admin says whether id is a configured administrator: its DN is one of
// them, or one of its FQANs is one of them or lies under one (a group
// /atlas/admin takes in /atlas/admin/Role=lead).
func (r *Resolver) admin(id dtr.Identity) bool {
	for _, a := range r.admins {
		if a == "" {
			continue
		}
		if a == id.DN {
			return true
		}
		for _, f := range id.FQANs {
			if f == a || strings.HasPrefix(a, "/") && strings.HasPrefix(f, a+"/") {
				return true
			}
		}
	}
	return false
}

// Namespace is the prefix of the job ids that an owner who is not trusted
// chooses: "u" and ten hex digits of the SHA-256 of the owner's DN.
func Namespace(dn string) string {
	sum := sha256.Sum256([]byte(dn))
	return "u" + hex.EncodeToString(sum[:5])
}

// JobID returns the job id that work c submits for owner under the chosen
// id gets: the id itself from a trusted caller (and "" stays ""), else the
// id in the owner's namespace, "<namespace>-<id>", so that no one can take
// the id of a job another owner will submit, or put work under it. An id
// already in the owner's namespace is kept.
func (c Caller) JobID(owner dtr.Identity, id string) (string, error) {
	if c.Trusted || id == "" {
		return id, nil
	}
	ns := Namespace(owner.DN)
	if strings.HasPrefix(id, ns+"-") {
		return id, nil
	}
	if len(ns)+1+len(id) > 64 {
		return "", fmt.Errorf("job id %q: a job id chosen by %s is given the owner's prefix %s-, and must then fit in 64 characters: use at most %d", id, c, ns, 63-len(ns))
	}
	return ns + "-" + id, nil
}

// Confinement says which local paths (file:// URLs) submitted work may
// name: only those under Roots; with no roots, any path, but only for
// trusted callers.
type Confinement struct {
	Roots []string
}

// ErrConfined refuses a file:// URL outside what Confinement allows.
var ErrConfined = errors.New("file:// URL not allowed")

// Check returns nil if c may name every URL of urls that is file://.
func (f Confinement) Check(c Caller, urls ...string) error {
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil || u.Scheme != "file" {
			continue // not a local path; URLs are validated elsewhere
		}
		if len(f.Roots) == 0 {
			if c.Trusted {
				continue
			}
			return fmt.Errorf("%w: %s: SLUICE_FILE_ROOTS is empty, so only trusted callers may name local paths", ErrConfined, raw)
		}
		if !under(u.Path, f.Roots) {
			return fmt.Errorf("%w: %s is not under SLUICE_FILE_ROOTS (%s)", ErrConfined, raw, strings.Join(f.Roots, ", "))
		}
	}
	return nil
}

// under says whether path, which must be absolute and have no ".."
// element, lies in one of roots.
func under(path string, roots []string) bool {
	if !filepath.IsAbs(path) || slices.Contains(strings.Split(filepath.ToSlash(path), "/"), "..") {
		return false
	}
	path = filepath.Clean(path)
	for _, root := range roots {
		rel, err := filepath.Rel(filepath.Clean(root), path)
		if err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return true
		}
	}
	return false
}
