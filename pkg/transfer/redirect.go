package transfer

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// maxRedirects is how many redirects one request follows, as net/http's
// default.
const maxRedirects = 10

// RedirectError is a redirect that Sluice does not follow: a loop, too
// many, or one to another scheme than https, or than http or https from
// http. It is a PERMANENT_REMOTE error: the server will send the same
// answer next time, so a retry would only repeat it for an hour.
type RedirectError struct {
	Reason string
}

func (e *RedirectError) Error() string { return e.Reason }

// checkRedirect is the http.Client's CheckRedirect: it refuses, with a
// *RedirectError, a redirect to a URL already visited (a loop), past
// maxRedirects, or to another scheme, except from http to https (an
// upgrade: the same request over TLS). It drops an Authorization header
// on a redirect to another scheme, host or port. Which addresses a
// redirect may reach is the Guard's to say, at the connection.
func checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) == 0 {
		return nil
	}
	chain := func() string {
		urls := make([]string, 0, len(via)+1)
		for _, r := range via {
			urls = append(urls, Redact(r.URL.String()))
		}
		return strings.Join(append(urls, Redact(req.URL.String())), " → ")
	}
	next := req.URL.String()
	for _, r := range via {
		if r.URL.String() == next {
			return &RedirectError{Reason: "redirect loop: " + chain()}
		}
	}
	if len(via) >= maxRedirects {
		return &RedirectError{Reason: fmt.Sprintf("too many redirects: stopped after %d (%s)", maxRedirects, chain())}
	}
	from, to := via[len(via)-1].URL.Scheme, req.URL.Scheme
	if from != to && !(from == "http" && to == "https") {
		return &RedirectError{Reason: fmt.Sprintf("redirect from %s to %s refused: %s", from, to, chain())}
	}
	// Credentials are added at each hop for that hop (credentials.go); an
	// Authorization header of the first request, which net/http would
	// copy to another port of its host, goes no further than its origin.
	if Audience(req.URL) != Audience(via[0].URL) {
		req.Header.Del("Authorization")
	}
	return nil
}

// isRedirectRefused reports whether err is a redirect checkRedirect
// refused.
func isRedirectRefused(err error) bool {
	var re *RedirectError
	return errors.As(err, &re)
}
