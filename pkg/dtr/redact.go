package dtr

import (
	"errors"
	"net/url"
	"regexp"
	"strings"
)

// Redacted is what stands for a secret in a URL fit to show.
const Redacted = "xxxxx"

// sensitiveParams are parts of query parameter names that carry
// credentials: OAuth's access_token, dCache's and xrootd's authz, the
// signatures and keys of presigned S3 (X-Amz-Signature, X-Amz-Credential,
// X-Amz-Security-Token, AWSAccessKeyId, Signature), Google Cloud Storage
// (X-Goog-Signature) and Azure SAS (sig), and the usual password names.
var sensitiveParams = []string{"token", "auth", "sig", "credential", "secret", "password", "passwd", "pwd", "key", "session", "code"}

// secretQuery finds a query parameter that SensitiveParam refuses to show,
// in a URL written plainly or in JSON ("&" escaped as \u0026).
var secretQuery = regexp.MustCompile(`(?i)(\?|&|\\u0026)[^=&"\s]*(` + strings.Join(sensitiveParams, "|") + `)[^=&"\s]*=`)

// HoldsSecretQuery reports whether data holds a URL query parameter that
// may carry a credential (access_token=, X-Amz-Signature=, ...).
func HoldsSecretQuery(data []byte) bool { return secretQuery.Match(data) }

// SensitiveParam reports whether a URL query parameter of that name may
// carry a credential, and its value must not be shown.
func SensitiveParam(name string) bool {
	n := strings.ToLower(name)
	for _, s := range sensitiveParams {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// RedactQuery returns a raw URL query with the value of every parameter
// that may carry a credential (SensitiveParam) replaced by xxxxx; the
// others, their order and their encoding are kept.
func RedactQuery(rawQuery string) string {
	if rawQuery == "" {
		return rawQuery
	}
	parts := strings.Split(rawQuery, "&")
	changed := false
	for i, p := range parts {
		k, _, _ := strings.Cut(p, "=")
		name, err := url.QueryUnescape(k)
		if err != nil {
			name = k
		}
		if SensitiveParam(name) {
			parts[i] = k + "=" + Redacted
			changed = true
		}
	}
	if !changed {
		return rawQuery
	}
	return strings.Join(parts, "&")
}

// RedactURL returns rawURL fit to log or show: the password of its user
// information and the values of query parameters that may carry
// credentials are replaced by xxxxx. A URL that does not parse keeps
// nothing after its scheme when it holds an '@', and has its query
// redacted as well as it can be.
func RedactURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		if i := strings.Index(rawURL, "://"); i >= 0 && strings.Contains(rawURL[i:], "@") {
			return rawURL[:i+3] + "(not shown: it does not parse and may hold credentials)"
		}
		if base, q, ok := strings.Cut(rawURL, "?"); ok {
			frag := ""
			if qq, f, ok := strings.Cut(q, "#"); ok {
				q, frag = qq, "#"+f
			}
			return base + "?" + RedactQuery(q) + frag
		}
		return rawURL
	}
	if _, has := u.User.Password(); !has && RedactQuery(u.RawQuery) == u.RawQuery {
		return rawURL // nothing to hide: as written
	}
	return redact(u)
}

// redact is RedactURL of a parsed URL.
func redact(u *url.URL) string {
	if u.User == nil && u.RawQuery == "" {
		return u.String()
	}
	c := *u
	if c.User != nil {
		if _, has := c.User.Password(); has {
			c.User = url.UserPassword(c.User.Username(), Redacted)
		}
	}
	c.RawQuery = RedactQuery(c.RawQuery)
	c.ForceQuery = u.ForceQuery
	return c.String()
}

// stripQuoted drops the *url.Error wrapper of a parse error, which quotes
// the whole URL again.
func stripQuoted(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

var (
	userInText   = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s"'<>]*@`)
	secretInText = regexp.MustCompile(`(?i)((\?|&)[^=&"'\s]*(` + strings.Join(sensitiveParams, "|") + `)[^=&"'\s]*=)[^&"'\s#]*`)
)

// RedactText returns text, such as an error message of another library,
// with the user information of every URL in it, and the values of query
// parameters that may carry credentials, replaced by xxxxx.
func RedactText(text string) string {
	text = userInText.ReplaceAllString(text, "${1}"+Redacted+"@")
	return secretInText.ReplaceAllString(text, "${1}"+Redacted)
}
