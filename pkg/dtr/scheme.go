package dtr

import (
	"errors"
	"net/url"
	"slices"
	"strings"
)

// Scheme is what Sluice knows of a URL scheme it moves data between: one
// row of SchemeTable. Adding a protocol is one row here, one file in
// pkg/transfer that registers it, and one row of its conformance suite.
type Scheme struct {
	Name string
	// DefaultPort is the port a URL of the scheme reaches when it names
	// none ("" for local files).
	DefaultPort string
	// Credentials is what its requests are signed or authorised with:
	// CredentialsNone, CredentialsBearer (SLUICE_HTTP_TOKENS, storage
	// tokens) or CredentialsS3 (SLUICE_S3_CREDENTIALS).
	Credentials string
	// Renames says an object is written under a temporary name and
	// renamed into place; AppearsWhole that one written in place appears
	// only once its upload completes.
	Renames, AppearsWhole bool
	// Local says a URL names a local path (file:///path) and no host.
	Local bool
	// StatesChecksums says a stat may learn the checksum the storage keeps
	// of an object (HTTP's Digest header), so that post-processing asks
	// it of an object written there.
	StatesChecksums bool
	// Path checks what the scheme asks of a URL's path (nil: nothing).
	Path func(path string) error
	// ThirdPartyCopy says its storages may copy to and from each other
	// themselves (HTTP third-party copy, COPY with perf markers).
	ThirdPartyCopy bool
}

// Check says what is wrong with u as a URL of the scheme: a local URL
// needs an absolute path and no other host; any other, a host and a path
// its Path accepts.
func (s Scheme) Check(u *url.URL) error {
	if s.Local {
		if u.Path == "" || !strings.HasPrefix(u.Path, "/") {
			return errors.New("a file URL needs an absolute path (file:///path)")
		}
		if u.Host != "" && u.Host != "localhost" {
			return errors.New("file URLs must be local (file:///path)")
		}
		return nil
	}
	if u.Host == "" {
		return errors.New("no host")
	}
	if s.Path != nil {
		return s.Path(u.Path)
	}
	return nil
}

// s3Path checks an S3 URL's path is /bucket/key.
func s3Path(p string) error {
	if bucket, key, _ := strings.Cut(strings.TrimPrefix(p, "/"), "/"); bucket == "" || key == "" {
		return errors.New("an S3 URL is s3://host[:port]/bucket/key")
	}
	return nil
}

// xrootdPath checks an xrootd URL's path is absolute after the host's
// slash (root://host//path).
func xrootdPath(p string) error {
	if !strings.HasPrefix(p, "//") {
		return errors.New("an xrootd URL is root://host[:port]//absolute/path")
	}
	return nil
}

// Kinds of credentials.
const (
	CredentialsNone   = ""
	CredentialsBearer = "bearer"
	CredentialsS3     = "s3"
)

// SchemeTable lists the schemes Sluice moves data between.
var SchemeTable = []Scheme{
	{Name: "file", Renames: true, Local: true},
	{Name: "http", DefaultPort: "80", Credentials: CredentialsBearer, StatesChecksums: true, ThirdPartyCopy: true},
	{Name: "https", DefaultPort: "443", Credentials: CredentialsBearer, StatesChecksums: true, ThirdPartyCopy: true},
	{Name: "dav", DefaultPort: "80", Credentials: CredentialsBearer, Renames: true, StatesChecksums: true, ThirdPartyCopy: true},
	{Name: "davs", DefaultPort: "443", Credentials: CredentialsBearer, Renames: true, StatesChecksums: true, ThirdPartyCopy: true},
	{Name: "s3", DefaultPort: "80", Credentials: CredentialsS3, AppearsWhole: true, Path: s3Path},
	{Name: "s3s", DefaultPort: "443", Credentials: CredentialsS3, AppearsWhole: true, Path: s3Path},
	{Name: "root", DefaultPort: "1094", Renames: true, Path: xrootdPath},
}

// SchemeOf returns the row of SchemeTable for a scheme.
func SchemeOf(name string) (Scheme, bool) {
	i := slices.IndexFunc(SchemeTable, func(s Scheme) bool { return s.Name == name })
	if i < 0 {
		return Scheme{}, false
	}
	return SchemeTable[i], true
}

// schemeNames is "file, http, …", for error messages.
func schemeNames() string {
	names := make([]string, len(SchemeTable))
	for i, s := range SchemeTable {
		names[i] = s.Name
	}
	return strings.Join(names, ", ")
}
