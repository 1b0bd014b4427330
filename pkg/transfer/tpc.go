package transfer

// HTTP third-party copy (TPC), as WLCG storages (dCache, XRootD, EOS,
// StoRM) and FTS3 speak it: Sluice sends one COPY request to one storage,
// the active one, which moves the bytes itself from or to the other, the
// remote one, and streams "perf markers" back in the response body while
// it runs. In pull mode the active storage is the destination and the
// request names the source in a Source header; in push mode it is the
// source and the request names the destination in a Destination header.
//
// Credentials: the active storage gets this Client's credentials for it in
// Authorization, at every hop, as every request does (credentials.go). The
// remote storage's credentials, which the active storage presents on
// Sluice's behalf, go in TransferHeaderAuthorization (the storage strips
// the TransferHeader prefix): the same token Sluice would send to the
// remote itself, only if the remote URL is https, and only to hops of the
// request that stay on the active storage's scheme, host and port (a
// redirect elsewhere drops it, as it drops Authorization).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// ThirdPartyMode says which storage a third-party copy asks to move the
// bytes.
type ThirdPartyMode string

// The modes of a third-party copy.
const (
	// ThirdPartyPull asks the destination to fetch from the source.
	ThirdPartyPull ThirdPartyMode = "pull"
	// ThirdPartyPush asks the source to send to the destination.
	ThirdPartyPush ThirdPartyMode = "push"
)

// ErrNoThirdPartyCopy is wrapped by the error of a third-party copy that
// could not be made and moved nothing: a URL whose scheme has no
// third-party copy (file, s3, root), or a storage that refuses COPY (405,
// 501, or a failure line saying it does not do it). The same transfer may
// still be made by streaming the bytes through Sluice.
var ErrNoThirdPartyCopy = errors.New("no third-party copy")

// ThirdPartyOptions tune ThirdPartyCopy.
type ThirdPartyOptions struct {
	// Mode is pull (the default) or push.
	Mode ThirdPartyMode
	// Progress, if set, is called with the bytes moved so far, as the
	// storage's perf markers tell them, whenever the count grows, and
	// once at the end, from the goroutine calling ThirdPartyCopy.
	Progress func(bytes int64)
	// ExpectedSize, if > 0, is the size the source had when it was
	// queried: the destination must have exactly that many bytes after
	// the copy, else the copy fails (TEMPORARY_REMOTE) and the
	// destination is removed.
	ExpectedSize int64
	// MaxSize, if > 0, is the largest source allowed: a copy whose
	// markers pass it is stopped (PERMANENT_REMOTE).
	MaxSize int64
	// ChecksumType is the checksum the copy is verified with (adler32 if
	// empty); Checksum, if set, is the value the job expects. See
	// ThirdPartyResult.
	ChecksumType, Checksum string
	// Header holds more headers for the COPY request (SciTag, say).
	// Authorization and TransferHeaderAuthorization are not taken from it.
	Header http.Header
}

// ThirdPartyResult describes a third-party copy. On failure Bytes,
// Started and Ended are still set.
type ThirdPartyResult struct {
	// Bytes is what the last perf marker said, or on success the size of
	// the destination.
	Bytes int64
	// Checksum is "type:value" of the destination, of ChecksumType when
	// it could be had: from the destination storage (its Digest header)
	// or, when the job expects a checksum the storage does not give, by
	// reading the destination back. Empty when none could be had.
	Checksum string
	// ChecksumUnverified says why no checksum of the copy was compared
	// with anything ("" when one was): neither the job nor the source
	// gave one to compare the destination's with, or the destination
	// gives none.
	ChecksumUnverified string
	// ReadBack is the number of bytes read back from the destination to
	// compute its checksum (0 when the storage gave it).
	ReadBack       int64
	Started, Ended time.Time
}

// CanThirdPartyCopy reports whether a copy from src to dst may be a
// third-party copy: both URLs of a scheme that has one (http, https, dav,
// davs).
func CanThirdPartyCopy(src, dst string) bool {
	return thirdPartyScheme(src) && thirdPartyScheme(dst)
}

func thirdPartyScheme(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil {
		return false
	}
	s, ok := dtr.SchemeOf(u.Scheme)
	return ok && s.ThirdPartyCopy
}

// transferCredentialKey is the context key of the TransferHeaderAuthorization
// of a COPY request: the value and the audience (scheme://host:port) of the
// storage it may be given to.
type transferCredentialKey struct{}

type transferCredential struct {
	audience, value string
}

// ThirdPartyCopy asks a storage to copy src to dst itself, following its
// perf markers until it says it is done. It fails with an error wrapping
// ErrNoThirdPartyCopy, having moved nothing, when a URL's scheme has no
// third-party copy or the storage refuses COPY.
//
// The Guard checks the active storage as for every request, and the
// remote one too, since the active storage connects there on Sluice's
// behalf. The fence of ctx is asked before the COPY is sent and at every
// perf marker. Cancelling ctx, or a fence that refuses, closes the
// connection, which makes the storage abort the copy. On failure the
// destination is removed, unless the storage refused the COPY outright
// (3xx, 4xx: nothing was written) or the fence refused (it may be another
// worker's by now).
func (c *Client) ThirdPartyCopy(ctx context.Context, src, dst string, opt ThirdPartyOptions) (res ThirdPartyResult, err error) {
	const op = "copy"
	res.Started = time.Now()
	defer func() { res.Ended = time.Now() }()
	su, err := parseURL(op, src)
	if err != nil {
		return res, err
	}
	du, err := parseURL(op, dst)
	if err != nil {
		return res, err
	}
	mode := opt.Mode
	if mode == "" {
		mode = ThirdPartyPull
	}
	active, remote, header := dst, src, "Source"
	switch mode {
	case ThirdPartyPull:
	case ThirdPartyPush:
		active, remote, header = src, dst, "Destination"
	default:
		return res, &Error{Kind: dtr.ErrInternalLogic, Op: op, URL: dst, Err: fmt.Errorf("third-party copy mode %q is neither pull nor push", mode)}
	}
	for _, u := range []*url.URL{su, du} {
		if s, _ := dtr.SchemeOf(u.Scheme); !s.ThirdPartyCopy {
			return res, &Error{Kind: dtr.ErrPermanentRemote, Op: op, URL: u.String(),
				Err: fmt.Errorf("%w: %s URLs have none (only http, https, dav and davs)", ErrNoThirdPartyCopy, u.Scheme)}
		}
	}
	typ := opt.ChecksumType
	if typ == "" {
		typ = "adler32"
	}
	if _, err := checksum.New(typ); err != nil {
		return res, &Error{Kind: dtr.ErrInternalLogic, Op: op, URL: dst, Err: err}
	}
	if e := fenced(ctx, op, dst); e != nil {
		return res, e
	}

	n, failure := c.runCopy(ctx, active, remote, header, mode, opt)
	res.Bytes = n
	if failure != nil {
		if failure.cleanup {
			c.removeAfterFailure(ctx, dst, failure.err)
		}
		if opt.Progress != nil {
			opt.Progress(res.Bytes)
		}
		return res, failure.err
	}
	verr := c.verifyThirdParty(ctx, src, dst, typ, opt, &res)
	if opt.Progress != nil {
		opt.Progress(res.Bytes)
	}
	if verr != nil {
		c.removeAfterFailure(ctx, dst, verr)
		return res, verr
	}
	return res, nil
}

// copyFailure is a failed COPY and whether the destination may hold
// something of it.
type copyFailure struct {
	err     *Error
	cleanup bool
}

// runCopy sends the COPY to active and follows its markers. It returns the
// bytes the last marker counted.
func (c *Client) runCopy(ctx context.Context, active, remote, header string, mode ThirdPartyMode, opt ThirdPartyOptions) (int64, *copyFailure) {
	const op = "copy"
	au, _ := url.Parse(httpURL(active))
	ru, _ := url.Parse(httpURL(remote))
	// The active storage connects to the remote one for Sluice: it must be
	// an address Sluice itself may reach.
	port, _ := strconv.ParseUint(portOf(ru), 10, 16)
	if _, err := c.guard.resolve(ctx, ru.Hostname(), uint16(port), true); err != nil {
		return 0, &copyFailure{err: remoteError(ctx, op, remote, err, 0)}
	}
	// The remote storage's credentials, as Sluice would send them there:
	// a read of the source (pull) or a write of the destination (push).
	method := http.MethodGet
	if mode == ThirdPartyPush {
		method = http.MethodPut
	}
	probe, err := http.NewRequestWithContext(ctx, method, ru.String(), nil)
	if err != nil {
		return 0, &copyFailure{err: &Error{Kind: dtr.ErrInternalLogic, Op: op, URL: remote, Err: stripURLError(err)}}
	}
	remoteAuth, err := c.credential(probe)
	if err != nil {
		return 0, &copyFailure{err: remoteError(ctx, op, remote, err, 0)}
	}
	if remoteAuth != "" {
		if refusal := c.mayHandOn(au, ru); refusal != nil {
			return 0, &copyFailure{err: &Error{Kind: dtr.ErrPermanentRemote, Op: op, URL: active,
				Err: fmt.Errorf("%w: %w", ErrNoThirdPartyCopy, refusal)}}
		}
	}

	cctx := context.WithValue(ctx, clientKey{}, c)
	if remoteAuth != "" {
		cctx = context.WithValue(cctx, transferCredentialKey{}, transferCredential{audience: Audience(au), value: remoteAuth})
	}
	req, err := http.NewRequestWithContext(cctx, "COPY", au.String(), nil)
	if err != nil {
		return 0, &copyFailure{err: &Error{Kind: dtr.ErrInternalLogic, Op: op, URL: active, Err: stripURLError(err)}}
	}
	for k, v := range opt.Header {
		req.Header[http.CanonicalHeaderKey(k)] = v
	}
	req.Header.Del("Authorization")
	req.Header.Del(transferAuthorization)
	req.Header.Set(header, ru.String())
	// No proxy certificate is delegated: the remote storage is reached
	// with the token above, or with nothing.
	req.Header.Set("Credential", "none")
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, &copyFailure{err: remoteError(ctx, op, active, err, 0)}
	}
	defer resp.Body.Close()
	if err := checkStatus(resp, "COPY"); err != nil {
		reason := readReason(resp.Body)
		var se *StatusError
		errors.As(err, &se)
		e := remoteError(ctx, op, active, withReason(err, reason), 0)
		if refusesThirdParty(mode, se.Code, reason) {
			e.Kind, e.Err = dtr.ErrPermanentRemote, fmt.Errorf("%w: the storage refuses COPY: %w", ErrNoThirdPartyCopy, e.Err)
			return 0, &copyFailure{err: e}
		}
		// A 3xx or 4xx: the storage took nothing on; a 5xx may have
		// started something.
		return 0, &copyFailure{err: e, cleanup: se.Code >= 500}
	}

	// The markers. A fence that refuses or a copy past the maximum size
	// stops the copy by closing the connection.
	fence, _ := ctx.Value(fenceKey{}).(Fence)
	var stopped *Error
	var last int64
	outcome, err := readMarkers(resp.Body, func(total int64) bool {
		if fence != nil {
			if err := fence(); err != nil {
				stopped = fenceError(op, active, err)
				return false
			}
		}
		if opt.MaxSize > 0 && total > opt.MaxSize {
			stopped = &Error{Kind: dtr.ErrPermanentRemote, Op: op, URL: remote,
				Err: fmt.Errorf("the source is larger than the maximum file size of %d bytes: %d bytes copied so far", opt.MaxSize, total)}
			return false
		}
		if total > last {
			last = total
			if opt.Progress != nil {
				opt.Progress(total)
			}
		}
		return true
	})
	switch {
	case stopped != nil && errors.Is(stopped, ErrLeaseLost):
		return last, &copyFailure{err: stopped}
	case stopped != nil:
		return last, &copyFailure{err: stopped, cleanup: true}
	case ctx.Err() != nil:
		return last, &copyFailure{err: cancelled(ctx, op, active), cleanup: true}
	case err != nil:
		var me *MarkerError
		// A connection lost before the first marker of a storage that
		// accepted the copy (202, as XrdHttpTPC and dCache answer before
		// their markers) is not a refusal: the storage may have begun the
		// copy, and may still be at it until it notices, so the attempt
		// fails (temporary) and what was written is removed, rather than
		// streamed to at once. Any other answer cut short is a server
		// that does not speak third-party copy (one that answers COPY as
		// GET, say).
		accepted := resp.StatusCode == http.StatusAccepted
		if errors.Is(err, errNotThirdParty) || !outcome.spoke && (errors.As(err, &me) || !accepted) {
			// No marker and no final line: a plain WebDAV server that made
			// the COPY within itself (201 or 204, at most a line,
			// "Created"), whose copy is checked as any; or a server that
			// does not speak third-party copy, whatever its status and
			// however its answer ended. (A storage that does, lost before
			// its first marker, is then streamed to.)
			local := errors.As(err, &me) && me.silent && me.Line <= 1 && (resp.StatusCode == http.StatusCreated || resp.StatusCode == http.StatusNoContent)
			if local && c.madeWhole(ctx, mode, active, remote, opt.ExpectedSize) {
				return 0, nil
			}
			return 0, &copyFailure{err: &Error{Kind: dtr.ErrPermanentRemote, Op: op, URL: active,
				Err: fmt.Errorf("%w: the storage answered COPY with %s and no perf markers", ErrNoThirdPartyCopy, resp.Status)}}
		}
		if errors.As(err, &me) {
			return last, &copyFailure{err: &Error{Kind: dtr.ErrTemporaryRemote, Op: op, URL: active, Err: err}, cleanup: true}
		}
		return last, &copyFailure{err: remoteError(ctx, op, active, fmt.Errorf("reading the copy's progress: %w", err), 1), cleanup: true}
	case outcome.success:
		return max(last, outcome.bytes), nil
	}
	reason := redactSecrets(outcome.reason)
	e := &Error{Kind: failureKind(reason), Op: op, URL: active, Err: fmt.Errorf("the storage reports the copy failed: %s", reason)}
	// Only a failure before any marker is a refusal: once bytes moved the
	// copy failed, whatever words its reason uses ("unsupported" appears
	// in many a TLS or encoding error), and what it wrote is removed.
	if !outcome.marked && last == 0 && refusesThirdParty(mode, 0, reason) {
		e.Kind, e.Err = dtr.ErrPermanentRemote, fmt.Errorf("%w: %w", ErrNoThirdPartyCopy, e.Err)
		return last, &copyFailure{err: e}
	}
	return last, &copyFailure{err: e, cleanup: true}
}

// accessOfRequest is the access a request needs: its method's, but a
// third-party COPY's depends on the end it is sent to. A pull (Source)
// creates the file at the destination; a push (Destination) reads the
// source. What the other end needs is asked for that end's URL, as the
// GET or PUT Sluice would send there itself.
func accessOfRequest(req *http.Request) Access {
	if req.Method == "COPY" {
		switch {
		case req.Header.Get("Source") != "":
			return AccessCreate
		case req.Header.Get("Destination") != "":
			return AccessRead
		}
	}
	return AccessOf(req.Method)
}

// madeWhole reports whether a markerless COPY left the destination with
// the size expected (known: a copy of unknown size is not taken on a
// server's word).
func (c *Client) madeWhole(ctx context.Context, mode ThirdPartyMode, active, remote string, expected int64) bool {
	dst := active
	if mode == ThirdPartyPush {
		dst = remote
	}
	info, err := c.Stat(ctx, dst)
	return err == nil && info.Exists && expected > 0 && info.Size == expected
}

// transferAuthorization is the header whose value the active storage
// sends to the remote one as Authorization.
const transferAuthorization = "TransferHeaderAuthorization"

// verifyThirdParty checks what a successful copy left at dst: its size
// against the one expected, and its checksum (see ThirdPartyResult)
// against the job's and the source's.
func (c *Client) verifyThirdParty(ctx context.Context, src, dst, typ string, opt ThirdPartyOptions, res *ThirdPartyResult) *Error {
	const op = "copy"
	info, err := c.Stat(ctx, dst)
	if err != nil {
		return asError(err, op, dst)
	}
	if !info.Exists {
		return &Error{Kind: dtr.ErrTemporaryRemote, Op: op, URL: dst, Err: errors.New("the storage reports the copy succeeded, but the destination is not there")}
	}
	if info.Size >= 0 {
		res.Bytes = info.Size
	}
	if opt.MaxSize > 0 && info.Size > opt.MaxSize {
		// Markers come every few seconds: a copy faster than that is
		// checked here, as a streamed one is at every read.
		return &Error{Kind: dtr.ErrPermanentRemote, Op: op, URL: src,
			Err: fmt.Errorf("the source is larger than the maximum file size of %d bytes: the copy has %d bytes", opt.MaxSize, info.Size)}
	}
	if opt.ExpectedSize > 0 && info.Size >= 0 && info.Size != opt.ExpectedSize {
		return &Error{Kind: dtr.ErrTemporaryRemote, Op: op, URL: src,
			Err: fmt.Errorf("size changed: the source had %d bytes when queried, the destination has %d after the copy", opt.ExpectedSize, info.Size)}
	}
	if strings.HasPrefix(info.Checksum, typ+":") {
		res.Checksum = info.Checksum
	}
	if res.Checksum == "" && opt.Checksum != "" {
		// The job expects a checksum the storage does not give: the
		// bytes are read back once, so that it is verified all the same.
		sum, n, err := c.readChecksum(ctx, dst, typ)
		res.ReadBack = n
		if err != nil {
			return err
		}
		res.Checksum = sum
	}
	switch {
	case res.Checksum == "":
		res.ChecksumUnverified = fmt.Sprintf("the destination storage gives no %s checksum and the job expects none", typ)
	case opt.Checksum != "":
		// Compared by post-processing, as for every transfer.
	default:
		// No checksum from the job: the source's, if it gives one, is
		// compared with the destination's.
		sinfo, err := c.Stat(ctx, src)
		switch {
		case err != nil || !sinfo.Exists || !checksum.SameType(sinfo.Checksum, res.Checksum):
			res.ChecksumUnverified = fmt.Sprintf("the job expects no checksum and the source storage gives no %s checksum to compare with the destination's", typ)
		case !checksum.Equal(sinfo.Checksum, res.Checksum):
			return &Error{Kind: dtr.ErrTemporaryRemote, Op: op, URL: dst,
				Err: fmt.Errorf("checksum mismatch after the copy: the source has %s, the destination %s", sinfo.Checksum, res.Checksum)}
		}
	}
	return nil
}

// readChecksum reads rawURL and returns its checksum of typ and the bytes
// read.
func (c *Client) readChecksum(ctx context.Context, rawURL, typ string) (string, int64, *Error) {
	const op = "checksum"
	u, err := parseURL(op, rawURL)
	if err != nil {
		return "", 0, asError(err, op, rawURL)
	}
	in, err := c.protocol(u).open(ctx, endpoint{rawURL, u})
	if err != nil {
		return "", 0, asError(err, op, rawURL)
	}
	defer in.body.Close()
	h, _ := checksum.New(typ)
	buf, release := copyBuffer(0)
	defer release()
	n, err := io.CopyBuffer(h, in.body, buf[:defaultBufferSize])
	if err != nil {
		return "", n, remoteError(ctx, op, rawURL, fmt.Errorf("reading back the destination: %w", err), n)
	}
	return checksum.Format(typ, h), n, nil
}

// asError returns err as an *Error, wrapping one of another type.
func asError(err error, op, rawURL string) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Kind: dtr.ErrInternalProcess, Op: op, URL: rawURL, Err: err}
}

// removeAfterFailure removes what a failed copy may have left at dst, as
// a failed PUT does: the fence is asked first, and the error says if the
// removal failed.
func (c *Client) removeAfterFailure(ctx context.Context, dst string, failure *Error) {
	timeout := cleanupTimeout
	if ctx.Err() != nil {
		timeout = cleanupTimeoutCancelled
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if err := c.Delete(cctx, dst); err != nil && !IsLeaseLost(err) {
		failure.Err = fmt.Errorf("%w (cleanup: %v)", failure.Err, err)
	}
}

// thirdPartyRefusals are the answers of a storage that will not make a
// third-party copy, as opposed to one that tried and failed: the statuses
// of a COPY it does not know or does not allow, and the phrases of a
// failure that says so. The transfer may then still be streamed, which
// answers for itself (a storage that refused COPY for want of rights
// refuses the PUT too, and says so).
var thirdPartyRefusals = struct {
	// statuses refuse in either mode: 405 and 501 from a server without
	// COPY; 400 from XrdHttp without its third-party-copy handler ("400
	// Unknown", "Request unknown") and from a plain WebDAV server, whose
	// COPY wants a Destination header, to a pull; 401 and 403 from a
	// storage whose authorisation knows no COPY, or allows it to no one.
	statuses map[int]bool
	// pushStatuses refuse a push: a plain WebDAV server answers a COPY to
	// another server with 502 (RFC 4918: the destination is on a server
	// that refuses the resource).
	pushStatuses map[int]bool
	// phrases refuse in a failure line.
	phrases []string
}{
	statuses: map[int]bool{http.StatusBadRequest: true, http.StatusUnauthorized: true, http.StatusForbidden: true,
		http.StatusMethodNotAllowed: true, http.StatusNotImplemented: true},
	pushStatuses: map[int]bool{http.StatusBadGateway: true},
	phrases: []string{"not supported", "unsupported", "not implemented", "no third-party copy",
		"third-party copy is disabled", "tpc is disabled", "request unknown", "unknown method"},
}

// refusesThirdParty reports whether a COPY in mode answered with status
// (0: a failure line) and reason is a storage refusing third-party copy.
func refusesThirdParty(mode ThirdPartyMode, status int, reason string) bool {
	if thirdPartyRefusals.statuses[status] || mode == ThirdPartyPush && thirdPartyRefusals.pushStatuses[status] {
		return true
	}
	if status != 0 {
		return false
	}
	lower := strings.ToLower(reason)
	for _, p := range thirdPartyRefusals.phrases {
		if strings.Contains(lower, p) {
			return true
		}
	}
	return false
}

// remoteStatus finds the HTTP status the remote side answered in a
// failure line ("... status code 404 ...", "HTTP 403").
var remoteStatus = regexp.MustCompile(`(?i)(?:status(?: code)?|HTTP(?:/[0-9.]+)?)[ :=]+([1-5][0-9][0-9])\b`)

// failureKind classifies a failure line: by the remote side's status when
// it names one, else as temporary (a network failure between storages).
func failureKind(reason string) dtr.ErrorKind {
	if m := remoteStatus.FindStringSubmatch(reason); m != nil {
		code, _ := strconv.Atoi(m[1])
		return statusKind(code)
	}
	return dtr.ErrTemporaryRemote
}

// maxReason is how much of a refusal's body an error quotes.
const maxReason = 512

// readReason reads the first line of a refusal's body, for the error.
func readReason(r io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(r, maxReason))
	s := strings.TrimSpace(strings.ToValidUTF8(string(b), "?"))
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		s = strings.TrimSpace(s[:i])
	}
	return redactSecrets(s)
}

// withReason adds a storage's stated reason to err.
func withReason(err error, reason string) error {
	if reason == "" {
		return err
	}
	return fmt.Errorf("%w: %s", err, reason)
}

// secretPatterns match credentials a storage might echo back in a
// message: bearer tokens and JSON web tokens.
var secretPatterns = []*regexp.Regexp{
	regexp.MustCompile(`(?i)(bearer\s+)[^\s,;"']+`),
	regexp.MustCompile(`eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*`),
}

// redactSecrets replaces what looks like a credential in a storage's
// message by xxxxx, so that no token reaches an error, a log or a DTR.
func redactSecrets(s string) string {
	s = secretPatterns[0].ReplaceAllString(s, "${1}xxxxx")
	return secretPatterns[1].ReplaceAllString(s, "xxxxx")
}

// MarkerError is a perf-marker stream that cannot be read: a line too
// long, a number that is not one.
type MarkerError struct {
	Line   int
	Reason string
	// unfinished: the stream ended cleanly without a final line; silent:
	// and without a marker.
	unfinished, silent bool
}

func (e *MarkerError) Error() string {
	return fmt.Sprintf("malformed perf-marker stream at line %d: %s", e.Line, e.Reason)
}

// markerOutcome is how a marker stream ended.
type markerOutcome struct {
	// spoke: the stream held a marker or a final line.
	spoke bool
	// marked: the stream held a perf marker.
	marked  bool
	success bool
	reason  string // of a failure
	bytes   int64  // the last total
}

// maxMarkerLine is the longest line of a marker stream.
const maxMarkerLine = 16 << 10

// maxPreamble is how many lines may come before the first perf marker or
// final line: a server that sends more (a file, a page) does not speak
// third-party copy, whatever its status said.
const maxPreamble = 8

// errNotThirdParty is a 2xx answer to COPY that is no marker stream.
var errNotThirdParty = errors.New("the answer to COPY is not a perf-marker stream")

// readMarkers reads a perf-marker stream: blocks of "Perf Marker", then
// "Key: value" lines, then "End", repeated, and a final "success: ..." or
// "failure: ..." line. Each block gives one stripe's bytes; the total is
// the sum over stripes of their latest count, and marker is called with
// it at the end of every block (it stops the reading by returning false).
// Unknown lines and keys are skipped. A stream that ends without a final
// line is an error, as is a block with a bad number; a failure line
// returns the reason.
func readMarkers(r io.Reader, marker func(total int64) bool) (out markerOutcome, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxMarkerLine)
	stripes := map[int64]int64{}
	var total int64
	in := false
	var index, bytes int64
	var haveBytes bool
	line := 0
	spoke := false // a marker has begun
	defer func() { out.marked, out.spoke = spoke, spoke || out.success || out.reason != "" }()
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		lower := strings.ToLower(text)
		if !spoke && line > maxPreamble && lower != "perf marker" && !strings.HasPrefix(lower, "success") && !strings.HasPrefix(lower, "failure") {
			return markerOutcome{bytes: total}, errNotThirdParty
		}
		switch {
		case lower == "perf marker":
			spoke = true
			if in {
				return markerOutcome{bytes: total}, &MarkerError{Line: line, Reason: "a perf marker starts before the last one ended"}
			}
			in, index, bytes, haveBytes = true, 0, 0, false
		case lower == "end" && in:
			in = false
			if !haveBytes {
				continue
			}
			stripes[index] = bytes
			total = 0
			for _, b := range stripes {
				total += b
			}
			if !marker(total) {
				return markerOutcome{bytes: total}, nil
			}
		case in:
			key, value, ok := strings.Cut(text, ":")
			if !ok {
				continue
			}
			value = strings.TrimSpace(value)
			switch strings.ToLower(strings.TrimSpace(key)) {
			case "stripe index":
				n, err := strconv.ParseInt(value, 10, 64)
				if err != nil || n < 0 {
					return markerOutcome{bytes: total}, &MarkerError{Line: line, Reason: fmt.Sprintf("stripe index %q is not a number", value)}
				}
				index = n
			case "stripe bytes transferred":
				n, err := strconv.ParseInt(value, 10, 64)
				if err != nil || n < 0 {
					return markerOutcome{bytes: total}, &MarkerError{Line: line, Reason: fmt.Sprintf("bytes transferred %q is not a number", value)}
				}
				bytes, haveBytes = n, true
			}
		case strings.HasPrefix(lower, "success"):
			return markerOutcome{success: true, bytes: total}, nil
		case strings.HasPrefix(lower, "failure"):
			_, reason, _ := strings.Cut(text, ":")
			return markerOutcome{reason: strings.TrimSpace(reason), bytes: total}, nil
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			if !spoke {
				return markerOutcome{bytes: total}, errNotThirdParty
			}
			return markerOutcome{bytes: total}, &MarkerError{Line: line + 1, Reason: fmt.Sprintf("a line longer than %d bytes", maxMarkerLine)}
		}
		return markerOutcome{bytes: total}, err
	}
	if !spoke {
		return markerOutcome{bytes: total}, &MarkerError{Line: line, Reason: "the stream ended without a success or failure line", unfinished: true, silent: true}
	}
	return markerOutcome{bytes: total}, &MarkerError{Line: line, Reason: "the stream ended without a success or failure line", unfinished: true}
}

// mayHandOn says whether the active storage may be given the remote
// storage's credential for a third-party copy, nil if so. The active
// storage presents it to the remote one, so it must be reached over https
// (the header would otherwise cross the network in clear). A static token
// of SLUICE_HTTP_TOKENS acts for every submitter on its storage, with no
// path scope: it is handed on only to a storage the site also configured
// a token for, never to any storage a submitter names. (A token exchanged
// for the request is scoped to the one path and to what its submitter may
// do there, so it may go to either end of the submitter's own transfer.)
func (c *Client) mayHandOn(active, remote *url.URL) error {
	if active.Scheme != "https" {
		return fmt.Errorf("the credential for %s would go in clear to %s, which is not https", Audience(remote), Audience(active))
	}
	if _, static := lookupHost(c.tokens, remote); static {
		if _, trusted := lookupHost(c.tokens, active); !trusted {
			return fmt.Errorf("the site's token for %s is handed on only to storages the site configured a token for (SLUICE_HTTP_TOKENS); %s is not one", Audience(remote), Audience(active))
		}
	}
	return nil
}
