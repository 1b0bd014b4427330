// Package job reads users' job descriptions, in JSON or in ARC's xRSL, checks
// them, and turns each into the DTRs (one per file) that the scheduler moves.
//
// The usual sequence is Parse, Normalize, Validate, then DTRs.
package job

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// DefaultPriority is the priority of a job that gives none.
const DefaultPriority = 50

// Job is a user's unit of work: input files fetched before it runs, output
// files sent after.
type Job struct {
	// ID is assigned (a UUID v4 string) by Normalize if empty; if given it
	// must be 1–64 characters of [A-Za-z0-9_-]
	// (no dot: the generator's keys use it as a separator).
	ID   string `json:"id,omitempty"`
	Name string `json:"name,omitempty"`
	// Owner is the DN and/or FQANs of the user. An empty identity is
	// allowed; its DTRs go to the _default share.
	Owner dtr.Identity `json:"owner"`
	// Priority is 1–100; 0 means DefaultPriority.
	Priority int    `json:"priority,omitempty"`
	Inputs   []File `json:"inputs,omitempty"`
	Outputs  []File `json:"outputs,omitempty"`
}

// File is one file to move: for an input, from where it is to where the job
// reads it; for an output, from where the job wrote it to where it is kept.
type File struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
	// Checksum is the expected checksum "type:value" (adler32, md5, sha256,
	// crc32c).
	Checksum string `json:"checksum,omitempty"`
	// Overwrite lets an existing destination be replaced.
	Overwrite bool `json:"overwrite,omitempty"`
	// FailureAllowed lets the job succeed when this file fails.
	FailureAllowed bool `json:"failure_allowed,omitempty"`
	// Stage has the source staged (brought to the staging area and pinned)
	// before it is transferred.
	Stage bool `json:"stage,omitempty"`
	// NoCache keeps the file out of the cache.
	NoCache bool `json:"no_cache,omitempty"`
	// Replicas are other URLs of the same source file: when one fails the
	// next is tried before a retry is spent.
	Replicas []string `json:"replicas,omitempty"`
	// Activity is what the transfer is for (FTS3's field): at most 64
	// printable characters.
	Activity string `json:"activity,omitempty"`
	// TPC is auto (the default), only or never: whether the file may be
	// moved by an HTTP third-party copy, storage to storage.
	TPC dtr.TPCMode `json:"tpc,omitempty"`
	// SciTag is the packet marking of the file's transfer (65–65535),
	// taken from trusted callers only; 0 leaves it to the site's mapping.
	SciTag int `json:"scitag,omitempty"`
}

// Parse reads a job description in either format: JSON when its first
// non-space character is '{', xRSL when it is '&' or '(' (or '+' or '|', so
// that the xRSL parser can explain that those forms are not supported).
// opt is used only for xRSL.
func Parse(data []byte, opt XRSLOptions) (*Job, error) {
	data = blankBOM(data)
	trimmed := bytes.TrimLeft(data, " \t\r\n\v\f")
	if len(trimmed) == 0 {
		return nil, fmt.Errorf("%w: the description is empty", ErrUnknownFormat)
	}
	switch trimmed[0] {
	case '{':
		return ParseJSON(data)
	case '&', '(', '+', '|':
		return ParseXRSL(data, opt)
	}
	off := len(data) - len(trimmed)
	line, col := position(data, off)
	return nil, fmt.Errorf("%w: it starts with %s at line %d, column %d, but JSON starts with '{' and xRSL with '&' or '('",
		ErrUnknownFormat, describeAt(data, off), line, col)
}

// Normalize fills in defaults: a new ID if none was given, and the default
// priority if none was given.
func (j *Job) Normalize() {
	if j.ID == "" {
		j.ID = uuid.NewString()
	}
	if j.Priority == 0 {
		j.Priority = DefaultPriority
	}
}

// Validate reports every problem with the job, joined with errors.Join: a
// missing or malformed ID (call Normalize first), a priority outside 1–100,
// malformed FQANs, no files at all, and, for each file, URLs that Sluice
// cannot move, a source equal to its destination, a destination already used
// by another file of the job, and a malformed checksum.
func (j *Job) Validate() error {
	var errs []error
	switch {
	case j.ID == "":
		errs = append(errs, errors.New("id is empty (Normalize assigns one)"))
	case !dtr.ValidJobID(j.ID):
		errs = append(errs, fmt.Errorf("id %q is not 1–64 characters of A–Z, a–z, 0–9, '_', '-'", j.ID))
	}
	if j.Priority != 0 && (j.Priority < 1 || j.Priority > 100) {
		errs = append(errs, fmt.Errorf("priority %d is outside 1–100", j.Priority))
	}
	for i, f := range j.Owner.FQANs {
		if !strings.HasPrefix(f, "/") {
			errs = append(errs, fmt.Errorf("owner.fqans[%d]: FQAN %q does not start with \"/\" (e.g. \"/atlas/Role=production\")", i, f))
		}
	}
	if len(j.Inputs) == 0 && len(j.Outputs) == 0 {
		errs = append(errs, errors.New("the job has no input or output files"))
	}

	seen := map[string]string{} // canonical destination → field that has it
	check := func(field string, f File) {
		if err := dtr.ValidateURL(f.Source); err != nil {
			errs = append(errs, fmt.Errorf("%s.source: %w", field, err))
		}
		if err := dtr.ValidateURL(f.Destination); err != nil {
			errs = append(errs, fmt.Errorf("%s.destination: %w", field, err))
		}
		if f.Source != "" && canonicalURL(f.Source) == canonicalURL(f.Destination) {
			errs = append(errs, fmt.Errorf("%s: source and destination are the same URL %q", field, dtr.RedactURL(f.Source)))
		}
		if f.Destination != "" {
			key := canonicalURL(f.Destination)
			if first, dup := seen[key]; dup {
				errs = append(errs, fmt.Errorf("%s.destination: URL %q is also the destination of %s", field, dtr.RedactURL(f.Destination), first))
			} else {
				seen[key] = field
			}
		}
		for _, err := range (dtr.Options{Checksum: f.Checksum, Activity: f.Activity, TPC: f.TPC, SciTag: f.SciTag}).Check() {
			errs = append(errs, fmt.Errorf("%s.%w", field, err))
		}
		if f.TPC == dtr.TPCOnly {
			for _, err := range dtr.CheckTPCOnly(f.Source, f.Destination, f.Replicas, f.Stage) {
				errs = append(errs, fmt.Errorf("%s.%w", field, err))
			}
		}
		for k, r := range f.Replicas {
			if err := dtr.ValidateURL(r); err != nil {
				errs = append(errs, fmt.Errorf("%s.replicas[%d]: %w", field, k, err))
			} else if canonicalURL(r) == canonicalURL(f.Destination) {
				errs = append(errs, fmt.Errorf("%s.replicas[%d]: URL %q is the destination", field, k, dtr.RedactURL(r)))
			}
		}
	}
	for i, f := range j.Inputs {
		check(fmt.Sprintf("inputs[%d]", i), f)
	}
	for i, f := range j.Outputs {
		check(fmt.Sprintf("outputs[%d]", i), f)
	}
	return errors.Join(errs...)
}

// defaultPort is the port a URL of scheme reaches when it names none.
func defaultPort(scheme string) string {
	s, _ := dtr.SchemeOf(scheme)
	return s.DefaultPort
}

// canonicalURL reduces a URL to a form in which two spellings of the same
// location compare equal: lower-case scheme and host, the scheme's default
// port dropped, "localhost" and the query (which names no other file)
// dropped from file URLs, and a cleaned path. Unparsable URLs are returned
// as given.
func canonicalURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Opaque != "" {
		return s
	}
	u.Scheme = strings.ToLower(u.Scheme)
	u.Host = strings.ToLower(u.Host)
	if port, scheme := u.Port(), u.Scheme; port != "" && port == defaultPort(scheme) {
		u.Host = strings.TrimSuffix(u.Host, ":"+port)
	}
	if u.Scheme == "file" {
		u.RawQuery, u.ForceQuery = "", false
		if u.Host == "localhost" {
			u.Host = ""
		}
	}
	if u.Path != "" {
		u.Path = path.Clean(u.Path)
		u.RawPath = ""
	}
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}

// DTRs makes one new DTR per file, inputs first and then outputs, each with
// a fresh ID and stamped with now. Call it on a normalized, valid job.
func (j *Job) DTRs(now time.Time) []*dtr.DTR {
	out := make([]*dtr.DTR, 0, len(j.Inputs)+len(j.Outputs))
	add := func(f File, dir dtr.Direction) {
		out = append(out, &dtr.DTR{
			ID:          uuid.New(),
			JobID:       j.ID,
			Source:      f.Source,
			Destination: f.Destination,
			Owner: dtr.Identity{
				DN:    j.Owner.DN,
				FQANs: slices.Clone(j.Owner.FQANs),
			},
			Direction:    dir,
			UserPriority: j.Priority,
			Options: dtr.Options{
				Checksum:       f.Checksum,
				Overwrite:      f.Overwrite,
				FailureAllowed: f.FailureAllowed,
				Stage:          f.Stage,
				NoCache:        f.NoCache,
				Activity:       f.Activity,
				TPC:            f.TPC,
				SciTag:         f.SciTag,
			},
			State:   dtr.New,
			Created: now,
			Updated: now,
		})
		if len(f.Replicas) > 0 {
			out[len(out)-1].Replicas = append([]string{f.Source}, f.Replicas...)
		}
	}
	for _, f := range j.Inputs {
		add(f, dtr.Download)
	}
	for _, f := range j.Outputs {
		add(f, dtr.Upload)
	}
	return out
}
