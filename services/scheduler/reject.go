package scheduler

import (
	"encoding/json"
	"fmt"
	"regexp"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// maxQuoted is how much of a refused message its rejection event quotes.
const maxQuoted = 512

// urlPassword finds a URL whose user information may hold a password,
// "scheme://user:password@", also with JSON's escaped slashes. A password
// that is not percent-encoded may hold any of "/?# " (the URL is then
// refused as malformed, and must not be quoted either), so any ':' after
// "scheme://" with an '@' later in the same string counts: a port followed
// by an '@' in the path is taken for one too, and the message is not quoted.
var urlPassword = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*:(//|\\/\\/)[^"\n]*:[^"\n]*@`)

// rejectionPayload is what a rejection event quotes of a refused message:
// its first 512 bytes, for the publisher's logs, or nothing when the
// message holds a URL with a password or a query parameter that may carry
// a credential (dtr.HoldsSecretQuery), written plainly or with JSON
// escapes. Rejection events are kept for 7 days and read by anyone who may
// read events; credentials never go there.
func rejectionPayload(data []byte) string {
	if holdsPassword(data) || dtr.HoldsSecretQuery(data) {
		return ""
	}
	if len(data) > maxQuoted {
		data = data[:maxQuoted]
	}
	return string(data)
}

// holdsPassword reports whether data, or any string in it if it is JSON,
// holds a URL with a password.
func holdsPassword(data []byte) bool {
	if urlPassword.Match(data) {
		return true
	}
	var v any
	if json.Unmarshal(data, &v) != nil {
		return false
	}
	var walk func(v any) bool
	walk = func(v any) bool {
		switch v := v.(type) {
		case string:
			return urlPassword.MatchString(v)
		case []any:
			for _, e := range v {
				if walk(e) {
					return true
				}
			}
		case map[string]any:
			for k, e := range v {
				if urlPassword.MatchString(k) || walk(e) {
					return true
				}
			}
		}
		return false
	}
	return walk(v)
}

// checkSize refuses a DTR larger than max bytes (bus.MaxDTRBytes): the
// stream took it, but its grant would not fit in a NATS message. A max of
// 0 is no limit.
func checkSize(data []byte, max int) error {
	if max > 0 && len(data) > max {
		return fmt.Errorf("the DTR is %d bytes, more than the %d that a DTR may have on this NATS server (an eighth of its max_payload, at most 1 MiB)", len(data), max)
	}
	return nil
}
