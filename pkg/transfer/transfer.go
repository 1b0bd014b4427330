// Package transfer performs the operations Sluice's workers need on a
// storage URL: stat, delete, rename, make parent directories, and streaming
// copies that compute checksums on the way and stop at a fenced grant.
//
// Each URL scheme has a protocol (protocol.go), registered in the
// protocols map: file (file.go), http/https/dav/davs (http.go), s3/s3s
// (s3.go) and root (xrootd.go). The scheme's syntax, default port and
// credentials kind are a row of dtr.SchemeTable. One conformance suite
// (conformance_test.go) runs every operation against every protocol, each
// on a real server. Adding a protocol is one file, one map entry, one
// scheme row and one conformance row (docs/architecture.md).
//
// Connections dial through a Guard (guard.go), which refuses addresses the
// site has not allowed, at every redirect hop, and credentials are added
// per hop only for the host they belong to (credentials.go). Local paths
// go through Files (files.go), confined to the allowed roots.
//
// Every failure is an *Error, as os.PathError is, carrying a dtr.ErrorKind,
// so that the scheduler can tell a retryable failure (TEMPORARY_REMOTE)
// from one that is not (PERMANENT_REMOTE, LOCAL_FILE, INTERNAL_LOGIC).
package transfer

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// Client performs operations on URLs. The zero value is not usable; use
// New. A Client is safe for concurrent use.
type Client struct {
	// base is the http.Client given to New, nil for the default one.
	base *http.Client
	// http sends Sluice's HTTP requests: base's settings, with a transport
	// that dials through guard and adds credentials at every hop.
	http *http.Client
	// roundTrip is that transport without the credentials, for S3
	// (minio-go signs its own requests).
	roundTrip http.RoundTripper
	// guard decides which addresses connections may reach; nil is
	// NewGuard(), public addresses only.
	guard *Guard
	files *Files
	// tokens maps a host ("host" or "host:port", as in URLs) to the file
	// that holds its bearer token; tokenSource, if set, gives tokens for
	// other https hosts.
	tokens      map[string]string
	tokenSource TokenSource
	// s3Creds maps an S3 endpoint to the file of its keys; s3 holds the
	// endpoints' clients.
	s3Creds map[string]string
	s3      *s3Clients
	// s3Default signs S3 requests to endpoints without a key file: the
	// AWS_* keys as New found them (envS3Keys).
	s3Default *credentials.Credentials
	// noDigest are the hosts that refuse a request carrying Want-Digest
	// (wantdigest.go), shared by the Client's copies.
	noDigest *hostMemory
	// noExpect are the hosts that refused an upload carrying Expect:
	// 100-continue (417).
	noExpect *hostMemory
}

// New returns a Client that makes HTTP requests with httpClient. A nil
// httpClient gets one with timeouts on connecting (30 s), the TLS handshake
// (10 s) and waiting for response headers (2 min, as storage may compute a
// checksum before answering) but no overall timeout, since a transfer may
// take hours. It keeps connections alive and speaks HTTP/1.1, so that
// concurrent transfers to one server use separate TCP connections.
//
// Redirects are followed up to 10, but a loop, more than 10 and one to
// another scheme (https to http, http to file; http to https is allowed)
// fail at once as PERMANENT_REMOTE (checkRedirect); a given httpClient
// without a CheckRedirect of its own gets that one, on a copy.
//
// Connections reach public addresses only until WithGuard says otherwise.
// The transport of a given httpClient, if it is an *http.Transport, is
// used on a copy that dials through the Guard (see WithGuard).
func New(httpClient *http.Client) *Client {
	c := &Client{base: httpClient, s3: &s3Clients{byHost: map[string]*minio.Client{}}, s3Default: envS3Keys(),
		noDigest: newHostMemory(wantDigestMemory, wantDigestHosts),
		noExpect: newHostMemory(wantDigestMemory, wantDigestHosts)}
	c.build()
	return c
}

// WithGuard returns a copy of c whose connections, on every protocol and
// every redirect hop, reach only what g allows (nil: public addresses
// only). With a default or *http.Transport transport the check is made
// on the address dialled (net.Dialer.ControlContext); a request sent
// through a proxy has its host resolved and checked first as well (the
// proxy resolves it again: a name that changes its answer in between can
// get past, so the proxy should refuse internal addresses too), and the
// proxy's own address must be allowed. Any other http.RoundTripper given
// to New dials on its own: its requests are checked, by resolving their
// host, before they are sent.
func (c *Client) WithGuard(g *Guard) *Client {
	cp := *c
	cp.guard = g
	cp.s3 = &s3Clients{byHost: map[string]*minio.Client{}}
	cp.build()
	return &cp
}

// build makes c's HTTP client from base and guard.
func (c *Client) build() {
	hc := &http.Client{}
	if c.base != nil {
		copied := *c.base
		hc = &copied
	}
	if hc.CheckRedirect == nil {
		hc.CheckRedirect = checkRedirect
	}
	var rt http.RoundTripper
	var proxy func(*http.Request) (*url.URL, error)
	everyRequest := false
	switch tr := hc.Transport.(type) {
	case nil:
		t := newTransport()
		t.DialContext = c.guard.dialer().DialContext
		rt, proxy = t, t.Proxy
	case *http.Transport:
		if tr.DialTLSContext != nil || tr.DialTLS != nil { //nolint:staticcheck // DialTLS bypasses DialContext too
			rt, everyRequest = tr, true
			break
		}
		t := tr.Clone()
		t.Dial = nil //nolint:staticcheck // DialContext replaces it
		t.DialContext = c.guard.dialer().DialContext
		rt, proxy = t, t.Proxy
	default:
		rt, everyRequest = tr, true
	}
	c.roundTrip = &guardedTransport{base: rt, guard: c.guard, proxy: proxy, everyRequest: everyRequest}
	hc.Transport = &sciTagTransport{base: &credentialTransport{base: c.roundTrip}}
	c.http = hc
}

// WithFiles returns a copy of c that reaches local paths only through f.
func (c *Client) WithFiles(f *Files) *Client {
	cp := *c
	cp.files = f
	return &cp
}

// errCredentials marks a failure to read this site's own credentials: a
// local problem, not the remote end's, and not worth a retry.
var errCredentials = errors.New("credentials")

// WithTokens returns a copy of c that sends a bearer token to each host in
// tokens (host or host:port → file holding the token): over https only,
// and only to the scheme, host and port it is configured for (a host
// without a port is the scheme's default port, 443), at every redirect hop
// anew (credentials.go).
func (c *Client) WithTokens(tokens map[string]string) *Client {
	cp := *c
	cp.tokens = tokens
	return &cp
}

// ParseTokens reads "host=file,host:port=file" (SLUICE_HTTP_TOKENS).
func ParseTokens(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		host, file, ok := strings.Cut(item, "=")
		if !ok || host == "" || !filepath.IsAbs(file) {
			return nil, fmt.Errorf("HTTP token %q: want host=/absolute/path/of/the/token/file", item)
		}
		out[host] = file
	}
	return out, nil
}

// Files returns how c reaches local paths.
func (c *Client) Files() *Files { return c.files }

// newTransport is the default transport, before its dialer is guarded.
func newTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 2 * time.Minute,
		ExpectContinueTimeout: time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   16,
		ReadBufferSize:        64 << 10,
		WriteBufferSize:       64 << 10,
	}
}

// Info is what Stat learns about a URL.
type Info struct {
	Exists bool
	// Size is the size in bytes, -1 if unknown.
	Size int64
	// Checksum is "type:value" if the server offers one (HTTP Digest
	// header with adler32, md5 or sha-256), else "".
	Checksum string
}

// wantDigest asks servers that support RFC 3230 for a checksum, adler32
// preferred as that is what ARC records.
const wantDigest = "adler32, md5;q=0.5, sha-256;q=0.4"

// Stat describes the object at rawURL. A missing object is not an error:
// it gives Exists false. A directory is an error. For HTTP it sends HEAD,
// following redirects; a 404 or 410 means missing and any other non-2xx
// status is an error.
func (c *Client) Stat(ctx context.Context, rawURL string) (Info, error) {
	const op = "stat"
	u, err := parseURL(op, rawURL)
	if err != nil {
		return Info{Size: -1}, err
	}
	return c.protocol(u).stat(ctx, op, endpoint{rawURL, u})
}

// Delete removes the object at rawURL. A missing object is not an error
// (for HTTP, DELETE answered with 404 or 410). It refuses to remove a
// local directory.
func (c *Client) Delete(ctx context.Context, rawURL string) error {
	const op = "delete"
	u, err := parseURL(op, rawURL)
	if err != nil {
		return err
	}
	if e := fenced(ctx, op, rawURL); e != nil {
		return e
	}
	return c.protocol(u).remove(ctx, op, endpoint{rawURL, u})
}

// Rename moves from to to, replacing what is there: a local rename, a
// WebDAV MOVE (dav://, davs://, with Overwrite: T) or an xrootd mv. Both
// URLs must have the same scheme and host, and be of a scheme that
// renames (Renames); any other pair is an INTERNAL_LOGIC error.
func (c *Client) Rename(ctx context.Context, from, to string) error {
	const op = "rename"
	fu, err := parseURL(op, from)
	if err != nil {
		return err
	}
	tu, err := parseURL(op, to)
	if err != nil {
		return err
	}
	if !Renames(fu.Scheme) || fu.Scheme != tu.Scheme || fu.Host != tu.Host {
		return &Error{Kind: dtr.ErrInternalLogic, Op: op, URL: from,
			Err: fmt.Errorf("rename to %s: only file, dav, davs and root URLs on one host can be renamed", Redact(to))}
	}
	if ctx.Err() != nil {
		return cancelled(ctx, op, from)
	}
	if e := fenced(ctx, op, from); e != nil {
		return e
	}
	return c.protocol(fu).rename(ctx, op, from, to, fu, tu)
}

// Renames reports whether objects of a URL scheme are written under a
// temporary name and renamed into place (file, dav, davs, root). Plain
// http(s) destinations are written in place with PUT, and S3 objects
// appear whole when their upload completes.
func Renames(scheme string) bool {
	s, _ := dtr.SchemeOf(scheme)
	return s.Renames
}

// AppearsWhole reports whether an object at rawURL, written in place,
// appears only once its upload completes, so that a failed upload leaves
// nothing behind (S3).
func AppearsWhole(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil {
		return false
	}
	s, _ := dtr.SchemeOf(u.Scheme)
	return s.AppearsWhole
}

// MakeParents creates the directories above a file:// URL (mode 0755),
// the WebDAV collections above an HTTP URL (MKCOL, from the top down, once
// PROPFIND finds the parent missing; a server that speaks no WebDAV is left
// to create what it needs on PUT), or the directories above an xrootd
// path. S3 has no directories.
func (c *Client) MakeParents(ctx context.Context, rawURL string) error {
	const op = "mkdir"
	u, err := parseURL(op, rawURL)
	if err != nil {
		return err
	}
	if e := fenced(ctx, op, rawURL); e != nil {
		return e
	}
	return c.protocol(u).makeParents(ctx, op, endpoint{rawURL, u})
}

// TempURL returns the name under which Copy should write a destination
// of a scheme that renames (Renames: file, dav, davs, root) before it is
// verified and renamed into place: "file:///a/b/name" becomes
// "file:///a/b/.name.sluice-<tag>.part", in the same directory so that the
// rename stays on one file system or server. The tag (a grant id) makes
// the name each attempt's own. Other URLs (http(s) destinations written in
// place with PUT, S3 objects) and URLs that do not parse come back
// unchanged.
func TempURL(dst, tag string) string {
	u, err := url.Parse(dst)
	if err != nil || !Renames(u.Scheme) || u.Path == "" || strings.HasSuffix(u.Path, "/") {
		return dst
	}
	tag = strings.ReplaceAll(tag, "/", "_")
	dir, name := path.Split(u.Path)
	// Keep the whole name within the usual 255-byte limit.
	if limit := 255 - len(". .sluice-.part") - len(tag); len(name) > limit {
		name = strings.ToValidUTF8(name[:max(limit, 1)], "")
	}
	u.Path = dir + "." + name + ".sluice-" + tag + ".part"
	u.RawPath = ""
	return u.String()
}

// TempURLOf is where delivery writes a DTR's destination before
// post-processing puts it in place: one name per transfer grant.
func TempURLOf(d *dtr.DTR) string { return TempURL(d.Target(), d.TransferGrant) }

// parseURL parses rawURL and checks it against its scheme's row of
// dtr.SchemeTable. Anything else is an INTERNAL_LOGIC error: the DTR
// should have been validated earlier.
func parseURL(op, rawURL string) (*url.URL, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		err = fmt.Errorf("bad URL: %w", stripURLError(err))
		if Redact(rawURL) != rawURL {
			// The parser's message may quote part of the user information.
			err = errors.New("bad URL (details withheld: it may hold credentials)")
		}
		return nil, &Error{Kind: dtr.ErrInternalLogic, Op: op, URL: rawURL, Err: err}
	}
	if scheme, ok := dtr.SchemeOf(u.Scheme); !ok {
		err = fmt.Errorf("unsupported scheme %q", u.Scheme)
	} else {
		err = scheme.Check(u)
	}
	if err != nil {
		return nil, &Error{Kind: dtr.ErrInternalLogic, Op: op, URL: rawURL, Err: err}
	}
	return u, nil
}
