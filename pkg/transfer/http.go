package transfer

// The HTTP protocol: http, https and WebDAV (dav, davs). Reads are GET,
// writes are PUT with the parent collections made first (MKCOL), renames
// are WebDAV MOVE. Every request goes through the Client's transport, which
// dials through the guard and adds credentials hop by hop.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// httpProtocol speaks HTTP(S) and WebDAV.
type httpProtocol struct{ c *Client }

func (h httpProtocol) stat(ctx context.Context, op string, e endpoint) (Info, error) {
	missing := Info{Size: -1}
	resp, err := h.c.do(ctx, http.MethodHead, e.raw, nil)
	if err != nil {
		return missing, remoteError(ctx, op, e.raw, err, 0)
	}
	discard(resp)
	if err := checkStatus(resp, http.MethodHead); isMissing(err) {
		return missing, nil
	} else if err != nil {
		return missing, remoteError(ctx, op, e.raw, err, 0)
	}
	return Info{Exists: true, Size: resp.ContentLength, Checksum: digestChecksum(resp.Header)}, nil
}

func (h httpProtocol) remove(ctx context.Context, op string, e endpoint) error {
	resp, err := h.c.do(ctx, http.MethodDelete, e.raw, nil)
	if err != nil {
		return remoteError(ctx, op, e.raw, err, 0)
	}
	discard(resp)
	if err := checkStatus(resp, http.MethodDelete); err != nil && !isMissing(err) {
		return remoteError(ctx, op, e.raw, err, 0)
	}
	return nil
}

func (h httpProtocol) makeParents(ctx context.Context, _ string, e endpoint) error {
	return h.c.makeCollections(ctx, e.raw, e.url)
}

func (h httpProtocol) open(ctx context.Context, e endpoint) (*source, error) {
	return h.c.openHTTP(ctx, e)
}

func (h httpProtocol) write(ctx context.Context, in *source, p *pump, src string, dst endpoint, _ CopyOptions) (int64, *Error) {
	return h.c.copyToHTTP(ctx, in, p, src, dst.raw)
}

// rename is WebDAV's MOVE (dav, davs).
func (h httpProtocol) rename(ctx context.Context, op, from, to string, _, _ *url.URL) error {
	return h.c.davMove(ctx, op, from, to)
}

// openHTTP sends GET.
func (c *Client) openHTTP(ctx context.Context, src endpoint) (*source, error) {
	const op = "copy"
	rawURL := src.raw
	resp, err := c.do(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return nil, remoteError(ctx, op, rawURL, err, 0)
	}
	if err := checkStatus(resp, http.MethodGet); err != nil {
		discard(resp)
		if isMissing(err) {
			err = fmt.Errorf("source not found: %w", err)
		}
		return nil, remoteError(ctx, op, rawURL, err, 0)
	}
	return &source{body: resp.Body, size: resp.ContentLength, checksum: digestChecksum(resp.Header)}, nil
}

// errEarlyAnswer is what the pump sees if the server answers a PUT before
// taking the whole body.
var errEarlyAnswer = errors.New("server answered before receiving the whole body")

// copyToHTTP PUTs the source to dst. The request body is a pipe fed by the
// pump in this goroutine, so hashing, counting and progress stay here and
// are finished before Copy returns, whatever the transport does.
func (c *Client) copyToHTTP(ctx context.Context, in *source, p *pump, src, dst string) (int64, *Error) {
	const op = "copy"
	pr, pw := io.Pipe()
	// The Client in the context gives each hop its credentials (credentials.go).
	req, err := http.NewRequestWithContext(context.WithValue(ctx, clientKey{}, c), http.MethodPut, httpURL(dst), pr)
	if err != nil {
		return 0, &Error{Kind: dtr.ErrInternalLogic, Op: op, URL: dst, Err: stripURLError(err)}
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.ContentLength = in.size // -1: chunked
	var w io.Writer = pw
	switch {
	case in.size == 0:
		// A zero ContentLength with a real body would be sent chunked.
		req.Body, w = http.NoBody, io.Discard
	case in.size < 0 && !c.noExpect.has(req.URL):
		// A chunked body waits for the server's 100 Continue, as curl
		// sends it: xrootd 5.5 reads one sent without waiting as
		// "Invalid chunked encoding" (400). A server that answers no 100
		// gets the body after the transport's ExpectContinueTimeout (1 s);
		// one that refuses the expectation (417) is remembered, and the
		// attempt fails as temporary so the next one sends the body
		// without waiting (the source is read once: it cannot be sent
		// again within this attempt).
		req.Header.Set("Expect", "100-continue")
	}
	done := make(chan error, 1)
	go func() {
		resp, err := c.http.Do(req)
		if err == nil {
			discard(resp)
			err = checkStatus(resp, http.MethodPut)
		}
		pr.CloseWithError(cmp.Or(err, errEarlyAnswer)) // unblock the pump
		done <- err
	}()

	n, side, err := p.run(ctx, in.body, w)
	pw.CloseWithError(err) // nil ends the body; an error aborts the PUT
	putErr := <-done

	var failure *Error
	switch {
	case side == sideFence:
		// The body was cut short; whatever the server kept is left to the
		// cleanup that the scheduler grants.
		return n, fenceError(op, dst, err)
	case ctx.Err() != nil:
		failure = cancelled(ctx, op, src)
	case side == sideSource:
		failure = sourceError(ctx, in, src, err, n)
	case putErr != nil:
		failure = remoteError(ctx, op, dst, putErr, n)
	case err != nil: // the server said 2xx before reading everything
		failure = remoteError(ctx, op, dst, err, n)
	default:
		return n, nil
	}
	var se *StatusError
	if errors.As(putErr, &se) && se.Code == http.StatusExpectationFailed && req.Header.Get("Expect") != "" {
		c.noExpect.add(req.URL)
		failure.Kind = dtr.ErrTemporaryRemote
		failure.Err = fmt.Errorf("%w (the storage refuses Expect: 100-continue; the next attempt sends the body without waiting)", failure.Err)
	}
	if se != nil && se.Code < 500 {
		// Refused (4xx) or sent elsewhere (3xx): nothing of ours was
		// stored here, and whatever is there is not ours to delete.
		return n, failure
	}
	if _, refused := isRefused(putErr); refused || isInsecureToken(putErr) || errors.Is(putErr, errCredentials) || errors.Is(putErr, errTokenUnavailable) {
		// Not sent (the Guard refused the address, or the credentials
		// were refused or missing): there is nothing to delete.
		return n, failure
	}
	timeout := cleanupTimeout
	if ctx.Err() != nil {
		timeout = cleanupTimeoutCancelled
	}
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer ccancel()
	// Delete asks the fence again: a worker that lost its grant while the
	// PUT failed deletes nothing, since the name may hold another
	// attempt's finished file by now.
	if err := c.Delete(cctx, dst); err != nil && !IsLeaseLost(err) {
		failure.Err = fmt.Errorf("%w (cleanup: %v)", failure.Err, err)
	}
	return n, failure
}

// davMove sends a WebDAV MOVE of from to to, replacing to.
func (c *Client) davMove(ctx context.Context, op, from, to string) error {
	resp, err := c.send(ctx, "MOVE", from, nil, http.Header{"Destination": {httpURL(to)}, "Overwrite": {"T"}})
	if err != nil {
		return remoteError(ctx, op, from, err, 0)
	}
	discard(resp)
	if err := checkStatus(resp, "MOVE"); err != nil {
		if isMissing(err) {
			err = fmt.Errorf("nothing to move: %w", err)
		}
		return remoteError(ctx, op, from, err, 0)
	}
	return nil
}

// httpURL turns a WebDAV URL (dav://, davs://, as ARC writes them) into
// the HTTP URL it is reached at.
func httpURL(rawURL string) string {
	switch {
	case strings.HasPrefix(rawURL, "dav://"):
		return "http://" + strings.TrimPrefix(rawURL, "dav://")
	case strings.HasPrefix(rawURL, "davs://"):
		return "https://" + strings.TrimPrefix(rawURL, "davs://")
	}
	return rawURL
}

// do sends one request. It asks for the identity encoding, so that sizes
// and checksums are those of the stored bytes, and for a Digest header.
func (c *Client) do(ctx context.Context, method, rawURL string, body io.Reader) (*http.Response, error) {
	return c.send(ctx, method, rawURL, body, nil)
}

// send is do with extra request headers.
func (c *Client) send(ctx context.Context, method, rawURL string, body io.Reader, header http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(context.WithValue(ctx, clientKey{}, c), method, httpURL(rawURL), body)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Accept-Encoding", "identity")
	// Credentials are added by the transport, at every hop (credentials.go).
	req.Header.Del("Authorization")
	asked := (method == http.MethodGet || method == http.MethodHead) && body == nil
	if asked {
		// Left out by the transport at a hop that refuses it (wantdigest.go).
		req.Header.Set("Want-Digest", wantDigest)
	}
	resp, err := c.http.Do(req)
	if err != nil || !asked {
		return resp, err
	}
	refused, retried := wantDigestRefusals[resp.StatusCode], wantDigestRetried[resp.StatusCode]
	hop := resp.Request.URL // the hop that answered
	if !refused && !retried || c.noDigest.has(hop) {
		return resp, nil // answered, or refused without Want-Digest
	}
	// Once more without Want-Digest: its answer is the one that counts.
	discard(resp)
	again := req.Clone(req.Context())
	again.Header.Del("Want-Digest")
	resp2, err := c.http.Do(again)
	// Remembered only if the same host answered without the header:
	// behind a redirector the retry may reach another pool, and one
	// pool's refusal must not stop the checksums of another.
	if err == nil && refused && resp2.StatusCode != resp.StatusCode && hostKey(resp2.Request.URL) == hostKey(hop) {
		c.noDigest.add(hop)
	}
	return resp2, err
}

// checkStatus turns a non-2xx response to a method request into a
// *StatusError. net/http follows a 301, 302 or 303 answer to anything but
// GET or HEAD with a GET; such a response is not an answer to the request
// made, so the redirect itself is reported.
func checkStatus(resp *http.Response, method string) error {
	if r := resp.Request; r != nil && r.Method != method && r.Response != nil {
		return &StatusError{Code: r.Response.StatusCode, Status: r.Response.Status}
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	return &StatusError{Code: resp.StatusCode, Status: resp.Status}
}

// isMissing reports whether err is a 404 or 410 answer.
func isMissing(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && (se.Code == http.StatusNotFound || se.Code == http.StatusGone)
}

// discard reads a little of the body, so the connection can be reused for
// a short answer, and closes it.
func discard(resp *http.Response) {
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

// makeCollections makes the WebDAV collections above u, if the server has
// WebDAV and they are missing.
func (c *Client) makeCollections(ctx context.Context, rawURL string, u *url.URL) error {
	const op = "mkdir"
	parent := path.Dir(strings.TrimSuffix(u.Path, "/"))
	if parent == "/" || parent == "." {
		return nil
	}
	exists, err := c.collectionExists(ctx, rawURL, u, parent)
	if err != nil || exists {
		return err
	}
	// Top down: /a/, /a/b/, ... A 405 is a collection that exists already.
	parts := strings.Split(strings.Trim(parent, "/"), "/")
	for i := range parts {
		cu := *u
		cu.Path = "/" + strings.Join(parts[:i+1], "/") + "/"
		cu.RawPath, cu.RawQuery, cu.Fragment = "", "", ""
		resp, err := c.do(ctx, "MKCOL", cu.String(), nil)
		if err != nil {
			return remoteError(ctx, op, rawURL, err, 0)
		}
		discard(resp)
		if resp.StatusCode != http.StatusMethodNotAllowed {
			if err := checkStatus(resp, "MKCOL"); err != nil {
				return remoteError(ctx, op, rawURL, fmt.Errorf("MKCOL %s: %w", cu.Path, err), 0)
			}
		}
	}
	return nil
}

// collectionExists asks with PROPFIND (depth 0) whether dir exists; a
// server without WebDAV counts as having it.
func (c *Client) collectionExists(ctx context.Context, rawURL string, u *url.URL, dir string) (bool, error) {
	cu := *u
	cu.Path = dir + "/"
	cu.RawPath, cu.RawQuery, cu.Fragment = "", "", ""
	resp, err := c.send(ctx, "PROPFIND", cu.String(), strings.NewReader(
		`<?xml version="1.0" encoding="utf-8"?><propfind xmlns="DAV:"><prop><resourcetype/></prop></propfind>`),
		http.Header{"Depth": {"0"}, "Content-Type": {"application/xml"}})
	if err != nil {
		return false, remoteError(ctx, "mkdir", rawURL, err, 0)
	}
	discard(resp)
	switch {
	case resp.StatusCode == http.StatusMultiStatus || resp.StatusCode/100 == 2:
		return true, nil
	case resp.StatusCode == http.StatusNotFound:
		return false, nil
	case resp.StatusCode == http.StatusMethodNotAllowed || resp.StatusCode == http.StatusNotImplemented:
		return true, nil // no WebDAV here: PUT creates what it needs, or fails
	}
	return false, remoteError(ctx, "mkdir", rawURL, &StatusError{Code: resp.StatusCode, Status: resp.Status}, 0)
}
