package transfer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// Credentials are added to each HTTP request at every hop, by the
// transport (credentialTransport), not to the first request only: net/http
// hands an Authorization header on to a redirect to the same host name on
// another port, or to a subdomain, since it compares host names only. Here
// each hop is judged on its own scheme, host and port:
//
//   - a bearer token of SLUICE_HTTP_TOKENS goes to the https hop whose
//     host and port it is configured for (a host without a port: 443);
//   - a hop over plain http whose host and port have a token is refused
//     (insecureTokenError, PERMANENT_REMOTE), rather than sent without: the
//     token must not cross the network in clear text, and a request that
//     quietly goes without the credentials it was configured with would
//     fail later, or read or write as nobody, for reasons harder to see;
//   - otherwise a TokenSource, if set, is asked for the token of the
//     https hop; plain http hops get none.
//
// Redirects from https to http are refused anyway (checkRedirect). S3
// requests are signed by minio-go, which follows no redirect: a signature
// goes to the endpoint of the URL only.

// TokenSource gives the bearer token of one request hop, "" for none. u is
// the URL that hop goes to, always https: its audience is
// scheme://host:port (Audience) and its scope the path with the access
// the request needs (Access: storage.read:/path, storage.create:/path or
// storage.modify:/path; for a WebDAV MOVE, the path is the directory
// holding both names: tokenScopeURL). A TokenSource is asked at every https hop to a
// host and port that SLUICE_HTTP_TOKENS has no token for, so a redirect to
// another host or port gets that one's token or none, never the first
// one's. It is not asked for a hop whose address the Guard refuses. An
// error that TokenRefused made fails the request for good
// (LOCAL_FILE, not retried, like an unreadable token file): asking again
// will not change it. Any other error (an issuer that cannot be reached
// or answers 5xx, a store that cannot be read) fails it as
// TEMPORARY_REMOTE, retried: the token may well come next time. Either
// way the request is not sent.
type TokenSource func(ctx context.Context, u *url.URL, access Access) (string, error)

// Access is what a request does to storage, as a WLCG storage scope names
// it.
type Access string

// The storage accesses of requests.
const (
	AccessRead   Access = "storage.read"
	AccessCreate Access = "storage.create" // a new file or directory
	AccessModify Access = "storage.modify" // anything else that changes what is stored
)

// accessOfMethod is the access each HTTP method needs; a method not here
// needs AccessModify (DELETE, MOVE, PROPPATCH, ...).
var accessOfMethod = map[string]Access{
	http.MethodGet:     AccessRead,
	http.MethodHead:    AccessRead,
	http.MethodOptions: AccessRead,
	"PROPFIND":         AccessRead,
	http.MethodPut:     AccessCreate,
	"MKCOL":            AccessCreate,
}

// AccessOf is the access a request of method needs.
func AccessOf(method string) Access {
	if a, ok := accessOfMethod[method]; ok {
		return a
	}
	return AccessModify
}

// WithTokenSource returns a copy of c that asks ts for the bearer tokens
// of https requests (see TokenSource).
func (c *Client) WithTokenSource(ts TokenSource) *Client {
	cp := *c
	cp.tokenSource = ts
	return &cp
}

// Audience is the scheme://host:port of a URL, with the scheme's default
// port written out: the audience of a token for it.
func Audience(u *url.URL) string {
	return u.Scheme + "://" + net.JoinHostPort(u.Hostname(), portOf(u))
}

// TokenRefused marks err, from a TokenSource, as one that asking again
// will not change (such as a submitter's token that has expired, or an
// issuer's refusal to grant the scope), keeping its text.
func TokenRefused(err error) error { return &tokenRefusedError{err} }

type tokenRefusedError struct{ err error }

func (e *tokenRefusedError) Error() string { return e.err.Error() }
func (e *tokenRefusedError) Unwrap() error { return e.err }

// errTokenUnavailable marks a TokenSource error that a later attempt may
// not meet: the request fails as TEMPORARY_REMOTE.
var errTokenUnavailable = errors.New("no bearer token now")

// insecureTokenError is a plain http request to a host and port that
// have a bearer token: refused, so that the token is never sent in clear.
type insecureTokenError struct{ u *url.URL }

func (e *insecureTokenError) Error() string {
	return fmt.Sprintf("request to %s refused: SLUICE_HTTP_TOKENS has a bearer token for %s, which is sent over https only (use https:// or davs://)",
		Audience(e.u), net.JoinHostPort(e.u.Hostname(), portOf(e.u)))
}

// isInsecureToken reports whether err is an insecureTokenError.
func isInsecureToken(err error) bool {
	var e *insecureTokenError
	return errors.As(err, &e)
}

// clientKey is the context key of the Client whose credentials a request
// carries.
type clientKey struct{}

// credentialTransport adds the credentials of each hop of a request
// (those of the Client in its context) on a copy of the request, so that
// net/http, which builds the redirected request from the first one, never
// sees them.
type credentialTransport struct{ base http.RoundTripper }

func (t *credentialTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var auth string
	if c, ok := req.Context().Value(clientKey{}).(*Client); ok {
		var err error
		if auth, err = c.credential(req); err != nil {
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, err
		}
	}
	// A third-party copy's credential for the remote storage goes only to
	// the storage it was meant for: a redirect elsewhere drops it (tpc.go).
	var transfer string
	if tc, ok := req.Context().Value(transferCredentialKey{}).(transferCredential); ok && Audience(req.URL) == tc.audience {
		transfer = tc.value
	}
	if auth != "" || req.Header.Get("Authorization") != "" || transfer != "" || req.Header.Get(transferAuthorization) != "" {
		req = req.Clone(req.Context())
		req.Header.Del("Authorization")
		req.Header.Del(transferAuthorization)
		delete(req.Header, transferAuthorization)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		if transfer != "" {
			// Spelled as the storages match it: net/http would send the
			// canonical "Transferheaderauthorization", which XrdHttpTPC
			// does not take for a transfer header.
			req.Header[transferAuthorization] = []string{transfer}
		}
	}
	if c, ok := req.Context().Value(clientKey{}).(*Client); ok && req.Header.Get("Want-Digest") != "" && c.noDigest.has(req.URL) {
		// A hop known to refuse the whole request for it (wantdigest.go).
		req = req.Clone(req.Context())
		req.Header.Del("Want-Digest")
	}
	return t.base.RoundTrip(req)
}

func (t *credentialTransport) CloseIdleConnections() { closeIdle(t.base) }

// credential is the Authorization header of one hop, "" for none.
func (c *Client) credential(req *http.Request) (string, error) {
	u := req.URL
	file, ok := lookupHost(c.tokens, u)
	switch {
	case ok && u.Scheme != "https":
		return "", &insecureTokenError{u: u}
	case ok:
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("%w: bearer token for %s: %v", errCredentials, u.Host, err)
		}
		return "Bearer " + strings.TrimSpace(string(b)), nil
	case c.tokenSource != nil && u.Scheme == "https":
		if c.guard != nil {
			// A hop the Guard refuses is not sent, so no token is asked
			// for it: an issuer mints nothing for an address a transfer
			// may not reach.
			port, _ := strconv.ParseUint(portOf(u), 10, 16)
			if _, err := c.guard.resolve(req.Context(), u.Hostname(), uint16(port), false); err != nil {
				return "", err
			}
		}
		tok, err := c.tokenSource(req.Context(), tokenScopeURL(req), accessOfRequest(req))
		var refused *tokenRefusedError
		switch {
		case errors.As(err, &refused):
			return "", fmt.Errorf("%w: bearer token for %s: %w", errCredentials, Audience(u), err)
		case err != nil:
			return "", fmt.Errorf("%w for %s (retried): %w", errTokenUnavailable, Audience(u), err)
		}
		if tok != "" {
			return "Bearer " + tok, nil
		}
	}
	return "", nil
}

// tokenScopeURL is the URL whose path a token for req must cover: the
// request's own, but for a WebDAV MOVE, which changes two names, the
// deepest directory holding both its own and its Destination's. A storage
// checks the token against both (xrootd's SciTokens plugin does), and a
// token scoped to one file cannot name the other; Sluice's renames are
// within one directory (TempURL), so that is the directory of the file.
func tokenScopeURL(req *http.Request) *url.URL {
	hop := *req.URL
	if req.Method != "MOVE" {
		return &hop
	}
	dst, err := url.Parse(req.Header.Get("Destination"))
	if err != nil || dst.Path == "" {
		return &hop
	}
	from := strings.Split(path.Clean("/"+hop.Path), "/")
	to := strings.Split(path.Clean("/"+dst.Path), "/")
	// The last elements are the names moved; what precedes them in
	// common is the directory.
	n := 0
	for n < len(from)-1 && n < len(to)-1 && from[n] == to[n] {
		n++
	}
	hop.Path, hop.RawPath = cmp.Or(strings.Join(from[:n], "/"), "/"), ""
	return &hop
}

// defaultPort is the port of a URL scheme when its URL names none.
func defaultPort(scheme string) string {
	s, _ := dtr.SchemeOf(scheme)
	return cmp.Or(s.DefaultPort, "80")
}

// portOf is the port a URL reaches.
func portOf(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	return defaultPort(u.Scheme)
}

// lookupHost finds the entry of u's host and port among "host" and
// "host:port" keys (SLUICE_HTTP_TOKENS, SLUICE_S3_CREDENTIALS): host:port
// if there is one, else host when u's port is its scheme's default.
func lookupHost(m map[string]string, u *url.URL) (string, bool) {
	host, port := u.Hostname(), portOf(u)
	var hostOnly string
	found := false
	for key, v := range m {
		h, p, err := net.SplitHostPort(key)
		if err != nil {
			h, p = strings.Trim(key, "[]"), ""
		}
		if !strings.EqualFold(h, host) {
			continue
		}
		if p == port {
			return v, true
		}
		if p == "" && port == defaultPort(u.Scheme) {
			hostOnly, found = v, true
		}
	}
	return hostOnly, found
}

// guardedTransport checks the requests that its transport's dialer cannot:
// those sent through a proxy (the dialer sees the proxy's address) and,
// with everyRequest, all of them (a transport of the caller's whose
// dialing is its own).
type guardedTransport struct {
	base         http.RoundTripper
	guard        *Guard
	proxy        func(*http.Request) (*url.URL, error)
	everyRequest bool
}

func (t *guardedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	check := t.everyRequest
	if !check && t.proxy != nil {
		if pu, err := t.proxy(req); err == nil && pu != nil {
			check = true
		}
	}
	if check {
		port, _ := strconv.ParseUint(portOf(req.URL), 10, 16)
		if _, err := t.guard.resolve(req.Context(), req.URL.Hostname(), uint16(port), true); err != nil {
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, err
		}
	}
	return t.base.RoundTrip(req)
}

func (t *guardedTransport) CloseIdleConnections() { closeIdle(t.base) }

func closeIdle(rt http.RoundTripper) {
	if c, ok := rt.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
