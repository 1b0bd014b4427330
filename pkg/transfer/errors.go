package transfer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// Error is a failed operation on a URL, classified by the kind the
// scheduler uses to decide whether another attempt is worthwhile.
type Error struct {
	Kind dtr.ErrorKind
	Op   string // "stat", "delete", "rename", "mkdir", "copy"
	URL  string // the URL at fault; Error never prints its user information
	Err  error
}

// Error says what failed, where and why, with any user name and password
// removed from the URL.
func (e *Error) Error() string {
	return fmt.Sprintf("%s %s: %v", e.Op, Redact(e.URL), e.Err)
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// KindOf returns the kind of the first *Error in err's chain: "" for nil,
// and INTERNAL_PROCESS for errors this package did not classify (including
// a bare context.Canceled).
func KindOf(err error) dtr.ErrorKind {
	if err == nil {
		return dtr.ErrNone
	}
	var e *Error
	if errors.As(err, &e) && e.Kind != dtr.ErrNone {
		return e.Kind
	}
	return dtr.ErrInternalProcess
}

// StatusError is a non-2xx HTTP response.
type StatusError struct {
	Code   int
	Status string // as sent, e.g. "503 Service Unavailable"
}

func (e *StatusError) Error() string { return "HTTP " + e.Status }

// Redact returns rawURL without its user information ("user:password@"),
// and with the values of query parameters that may carry credentials
// (access_token, X-Amz-Signature, ...: dtr.SensitiveParam) replaced by
// xxxxx, so that it can be logged or shown. A URL that does not parse
// loses everything between "//" and its last "@".
func Redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err == nil {
		q := dtr.RedactQuery(u.RawQuery)
		if u.User == nil && q == u.RawQuery {
			return rawURL
		}
		u.User, u.RawQuery = nil, q
		return u.String()
	}
	i := strings.Index(rawURL, "//")
	if i < 0 {
		return rawURL
	}
	if at := strings.LastIndex(rawURL[i+2:], "@"); at >= 0 {
		rawURL = rawURL[:i+2] + rawURL[i+2+at+1:]
	}
	if base, q, ok := strings.Cut(rawURL, "?"); ok {
		rawURL = base + "?" + dtr.RedactQuery(q)
	}
	return rawURL
}

// statusKind classifies an HTTP status: 408, 423, 429 and 5xx are worth a
// retry; other 4xx (and unfollowed 3xx) are not.
func statusKind(code int) dtr.ErrorKind {
	// 423 Locked is a file another request is still writing (xrootd's
	// kXR_FileLocked): it is free again once that ends.
	if code == 408 || code == 423 || code == 429 || code >= 500 {
		return dtr.ErrTemporaryRemote
	}
	return dtr.ErrPermanentRemote
}

// networkKind classifies a failure to talk to a server. Once bytes have
// moved the server was reachable, so the failure is temporary; before that
// only a name that does not exist and a certificate that does not verify
// are permanent. Refused and reset connections and timeouts are temporary.
func networkKind(err error, moved int64) dtr.ErrorKind {
	if moved > 0 {
		return dtr.ErrTemporaryRemote
	}
	var dnsErr *net.DNSError
	var certErr *tls.CertificateVerificationError
	if (errors.As(err, &dnsErr) && dnsErr.IsNotFound) || errors.As(err, &certErr) {
		return dtr.ErrPermanentRemote
	}
	return dtr.ErrTemporaryRemote
}

// stripURLError drops the *url.Error wrapper net/http puts around client
// errors: it repeats the request URL, user name included.
func stripURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// cancelled is the error for an operation stopped by ctx. It wraps
// ctx.Err() and, when the canceller gave one, the cause.
func cancelled(ctx context.Context, op, rawURL string) *Error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		err = fmt.Errorf("%w: %w", err, cause)
	}
	return &Error{Kind: dtr.ErrInternalProcess, Op: op, URL: rawURL, Err: err}
}

// remoteError classifies err from an HTTP exchange on rawURL after moved
// bytes. It reports cancellation if ctx has ended.
func remoteError(ctx context.Context, op, rawURL string, err error, moved int64) *Error {
	if ctx.Err() != nil {
		return cancelled(ctx, op, rawURL)
	}
	var se *StatusError
	if errors.As(err, &se) {
		return &Error{Kind: statusKind(se.Code), Op: op, URL: rawURL, Err: err}
	}
	if errors.Is(err, errCredentials) {
		return &Error{Kind: dtr.ErrLocalFile, Op: op, URL: rawURL, Err: err}
	}
	if errors.Is(err, errTokenUnavailable) {
		return &Error{Kind: dtr.ErrTemporaryRemote, Op: op, URL: rawURL, Err: stripURLError(err)}
	}
	if re, ok := isRefused(err); ok {
		// The Guard's refusal says all: the address and why.
		return &Error{Kind: dtr.ErrPermanentRemote, Op: op, URL: rawURL, Err: re}
	}
	err = stripURLError(err)
	if isInsecureToken(err) {
		return &Error{Kind: dtr.ErrPermanentRemote, Op: op, URL: rawURL, Err: err}
	}
	if isRedirectRefused(err) {
		// A loop, too many or another scheme: the same next time.
		return &Error{Kind: dtr.ErrPermanentRemote, Op: op, URL: rawURL, Err: err}
	}
	return &Error{Kind: networkKind(err, moved), Op: op, URL: rawURL, Err: err}
}

// localError is a failure on a local file, or cancellation if ctx has ended.
func localError(ctx context.Context, op, rawURL string, err error) *Error {
	if ctx.Err() != nil {
		return cancelled(ctx, op, rawURL)
	}
	return &Error{Kind: dtr.ErrLocalFile, Op: op, URL: rawURL, Err: err}
}
