package dtr

import (
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"
)

// Seeds of the URL fuzz targets: URLs Sluice moves, and URLs it refuses.
var seedURLs = []string{
	"file:///scratch/job42/hits.root",
	"file://localhost/scratch/a%20b",
	"file:///a/../b",
	"file:///",
	"file:relative/path",
	"file://host/a",
	"https://data.example/run42/hits.root",
	"http://u:pw@h/a",
	"https://user:s3cr3t@store.example:8443/x?y=1#z",
	"https://user@store.example/x",
	"https://:pw@h/x",
	"https://u:p%zzw@h/x",
	"dav://h/dir/f", "davs://h/dir/f",
	"s3://h:9000/bucket/key", "s3s://h/bucket/a/b", "s3://h/bucket", "s3://h/", "s3://h",
	"root://h:1094//data/f", "root://h/data/f",
	"gopher://x/y", "ftp://u:pw@h/x", "", " ", "//h/x", "http:///x", "http://[::1]:80/x",
	"https://h/\xff", "file:///\xfe\xff", "http://h/%00",
}

// FuzzValidateURLRefusesPasswordsWithoutQuotingThem gives ValidateURL any
// string, and the same URL again with a password in it. It checks that a
// URL with a password is always refused, that no refusal quotes the
// password (or, for a URL that does not parse, anything between "//" and
// "@"), that every refusal has a message, and that an accepted URL is
// UTF-8, of a scheme Sluice moves, with a host, or, for file://, local and
// with an absolute path.
func FuzzValidateURLRefusesPasswordsWithoutQuotingThem(f *testing.F) {
	for _, u := range seedURLs {
		f.Add(u, "s3cr3t")
	}
	f.Add("https://h/x", "")
	f.Add("https://h/x", "p@ss/w:rd")
	f.Add("file:///x", "xxxxx")
	f.Fuzz(func(t *testing.T, raw, password string) {
		checkURL(t, raw)
		if p, err := url.Parse(raw); err == nil {
			p.User = url.UserPassword(cmpOr(p.User.Username(), "user"), password)
			checkURL(t, p.String())
		}
		// Written by hand, unescaped, as a publisher may.
		if scheme, rest, ok := strings.Cut(raw, "://"); ok {
			checkURL(t, scheme+"://user:"+password+"@"+rest)
		}
	})
}

// withPassword returns raw with the password of its user information, as
// written, replaced by pw.
func withPassword(raw, pw string) string {
	i := strings.Index(raw, "//")
	if i < 0 {
		return raw
	}
	authority := raw[i+2:]
	if end := strings.IndexAny(authority, "/?#"); end >= 0 {
		authority = authority[:end]
	}
	at := strings.LastIndex(authority, "@")
	colon := strings.Index(authority, ":")
	if at < 0 || colon < 0 || colon > at {
		return raw
	}
	start := i + 2 + colon + 1
	return raw[:start] + pw + raw[i+2+at:]
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// checkURL fails unless ValidateURL treats raw as documented.
func checkURL(t *testing.T, raw string) {
	t.Helper()
	err := ValidateURL(raw)
	p, perr := url.Parse(raw)
	if err != nil {
		msg := err.Error()
		if strings.TrimSpace(msg) == "" {
			t.Fatalf("%q refused without a reason", raw)
		}
		if perr == nil && p.User != nil {
			if pw, has := p.User.Password(); has && len(pw) >= 4 {
				// The refusal of the same URL with another password is
				// the reference: whatever else both quote is no secret.
				refMsg := ""
				if rerr := ValidateURL(withPassword(raw, "xxxxx")); rerr != nil {
					refMsg = rerr.Error()
				}
				esc := strings.TrimPrefix(url.UserPassword("", pw).String(), ":")
				for _, secret := range []string{pw, esc} {
					if strings.Contains(msg, secret) && !strings.Contains(refMsg, secret) {
						t.Fatalf("the refusal of %q quotes its password %q: %s", raw, secret, msg)
					}
				}
			}
		}
		if perr != nil {
			// A URL that does not parse may hold credentials where the
			// parser did not find them.
			if _, rest, ok := strings.Cut(raw, "//"); ok {
				if at := strings.LastIndex(rest, "@"); at >= 4 {
					if userinfo := rest[:at]; strings.Contains(msg, userinfo) && !strings.Contains("bad URL (not quoted: it may hold credentials)", userinfo) {
						t.Fatalf("the refusal of %q, which does not parse, quotes %q: %s", raw, userinfo, msg)
					}
				}
			}
		}
		return
	}
	// Accepted.
	if perr != nil {
		t.Fatalf("%q accepted, but it does not parse: %v", raw, perr)
	}
	if !utf8.ValidString(raw) {
		t.Fatalf("%q accepted, but it is not UTF-8", raw)
	}
	if p.User != nil {
		if _, has := p.User.Password(); has {
			t.Fatalf("%q accepted with a password", raw)
		}
	}
	if _, ok := SchemeOf(p.Scheme); !ok {
		t.Fatalf("%q accepted with scheme %q", raw, p.Scheme)
	}
	switch p.Scheme {
	case "file":
		if !strings.HasPrefix(p.Path, "/") || p.Host != "" && p.Host != "localhost" {
			t.Fatalf("file URL %q accepted: path %q, host %q", raw, p.Path, p.Host)
		}
	default:
		if p.Host == "" {
			t.Fatalf("%q accepted without a host", raw)
		}
	}
}
