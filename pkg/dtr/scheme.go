package dtr

import (
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
}

// Kinds of credentials.
const (
	CredentialsNone   = ""
	CredentialsBearer = "bearer"
	CredentialsS3     = "s3"
)

// SchemeTable lists the schemes Sluice moves data between.
var SchemeTable = []Scheme{
	{Name: "file", Renames: true},
	{Name: "http", DefaultPort: "80", Credentials: CredentialsBearer},
	{Name: "https", DefaultPort: "443", Credentials: CredentialsBearer},
	{Name: "dav", DefaultPort: "80", Credentials: CredentialsBearer, Renames: true},
	{Name: "davs", DefaultPort: "443", Credentials: CredentialsBearer, Renames: true},
	{Name: "s3", DefaultPort: "80", Credentials: CredentialsS3, AppearsWhole: true},
	{Name: "s3s", DefaultPort: "443", Credentials: CredentialsS3, AppearsWhole: true},
	{Name: "root", DefaultPort: "1094", Renames: true},
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
