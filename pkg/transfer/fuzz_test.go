package transfer

import (
	"errors"
	"net/url"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// FuzzURLsAreCheckedAsAtSubmissionAndFilesStayInsideTheirRoots gives the
// transfer client's URL handling any string. It checks that parseURL takes
// every URL that dtr.ValidateURL takes at submission (a URL the scheduler
// accepted must not fail later as INTERNAL_LOGIC); that its refusals have a
// message and that neither they nor Redact quote a password; and that the
// local path of an accepted file:// URL is absolute and, with file roots,
// reached only as a clean path inside one of them, through the right one
// ("/r/a2" is not under "/r/a"), or refused as outside the roots.
func FuzzURLsAreCheckedAsAtSubmissionAndFilesStayInsideTheirRoots(f *testing.F) {
	dir := f.TempDir()
	rootA, rootA2 := filepath.Join(dir, "a"), filepath.Join(dir, "a2")
	files, err := OpenFiles(rootA, rootA2)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		"file://" + rootA + "/x", "file://" + rootA2 + "/x", "file://" + rootA + "2/../a/x", "file://" + rootA + "/../a2/x",
		"file://" + rootA + "/./b//c/", "file://" + rootA, "file://" + dir + "/b/x", "file://localhost" + rootA + "/x%2F..%2F..%2Fy",
		"file:///scratch/job42/hits.root", "file:relative", "file://host/a", "file:///a/../b",
		"https://data.example/run42/hits.root", "http://u:pw@h/a", "https://user:s3cr3t@store.example:8443/x?y=1#z",
		"http://alice:s3cr3t@host:port/x", "http://alice:s3cr3t/x@host/f",
		"dav://h/dir/f", "davs://h/dir/f",
		"s3://h:9000/bucket/key", "s3s://h/bucket/a/b", "s3://h/bucket", "s3://h/bucket/", "s3://h/", "s3://h",
		"root://h:1094//data/f", "root://h/data/f", "root://h", "root://h//",
		"gopher://x/y", "", "//h/x", "http:///x", "https://h/\xff",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := parseURL("fuzz", raw)
		if verr := dtr.ValidateURL(raw); verr == nil && err != nil {
			t.Fatalf("%q is taken at submission but refused by the transfer client: %v", raw, err)
		}
		secrets := passwords(raw)
		if red := Redact(raw); containsAny(red, secrets) {
			t.Fatalf("Redact(%q) = %q keeps the password", raw, red)
		}
		if err != nil {
			var te *Error
			if !errors.As(err, &te) || te.Kind != dtr.ErrInternalLogic || strings.TrimSpace(err.Error()) == "" {
				t.Fatalf("%q refused with %#v", raw, err)
			}
			if containsAny(err.Error(), secrets) {
				t.Fatalf("the refusal of %q quotes its password: %v", raw, err)
			}
			return
		}
		if u.Scheme != "file" {
			return
		}
		if !path.IsAbs(u.Path) {
			t.Fatalf("file URL %q accepted with the relative path %q", raw, u.Path)
		}
		root, rel, err := files.locate(u.Path)
		clean := filepath.Clean(u.Path)
		if err != nil {
			if !errors.Is(err, ErrOutsideRoots) || strings.TrimSpace(err.Error()) == "" {
				t.Fatalf("%q refused with %v", raw, err)
			}
			hasDotDot := false
			for _, part := range strings.Split(u.Path, "/") {
				hasDotDot = hasDotDot || part == ".."
			}
			if !hasDotDot && (under(clean, rootA) || under(clean, rootA2)) {
				t.Fatalf("%q is inside a root but refused: %v", raw, err)
			}
			return
		}
		if root == nil {
			t.Fatalf("%q reached without a root", raw)
		}
		if rel != "." && !filepath.IsLocal(rel) || filepath.Clean(rel) != rel {
			t.Fatalf("%q reached as %q under %s: not a clean local path", raw, rel, root.Name())
		}
		if !under(clean, root.Name()) || filepath.Join(root.Name(), rel) != clean {
			t.Fatalf("%q (%s) reached as %q under %s", raw, clean, rel, root.Name())
		}
		if tmp, err := parseURL("fuzz", TempURL(raw, "g.1")); err != nil || path.Dir(tmp.Path) != path.Dir(u.Path) && !strings.HasSuffix(u.Path, "/") {
			t.Fatalf("the temporary name of %q is %q (%v)", raw, TempURL(raw, "g.1"), err)
		}
	})
}

// under reports whether the clean path p is dir or lies below it.
func under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator))
}

// passwords returns the password of raw's user information, as url.Parse
// finds it and as written, if it is long enough not to turn up by chance
// in the rest of a message.
func passwords(raw string) []string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return nil
	}
	pw, has := u.User.Password()
	if !has || len(pw) < 6 || strings.Contains(strings.Replace(raw, pw, "", 1), pw) {
		return nil
	}
	return []string{pw, strings.TrimPrefix(url.UserPassword("", pw).String(), ":")}
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if sub != "" && strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
