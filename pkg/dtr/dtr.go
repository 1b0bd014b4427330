package dtr

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Identity is who owns a DTR: the certificate DN and the VOMS attributes
// (FQANs such as "/atlas/Role=production").
type Identity struct {
	DN    string   `json:"dn,omitempty"`
	FQANs []string `json:"fqans,omitempty"`
}

// Direction says whether a DTR fetches a job's input or sends its output.
// It picks the "-download" or "-upload" sub-share.
type Direction string

// The two directions.
const (
	Download Direction = "download"
	Upload   Direction = "upload"
)

// Options are the per-file settings a job gives.
type Options struct {
	// Checksum is the expected checksum "type:value" (adler32, md5, sha256,
	// crc32c);
	// empty means none is known and the deliverer's SLUICE_DELIVERY_CHECKSUM
	// (adler32 unless the site says otherwise) is computed for the record.
	Checksum string `json:"checksum,omitempty"`
	// Overwrite lets pre-cleaning delete an existing destination.
	Overwrite bool `json:"overwrite,omitempty"`
	// FailureAllowed lets the job succeed when this file fails.
	FailureAllowed bool `json:"failure_allowed,omitempty"`
	// Stage says the source must be staged before it is transferred: a
	// pre-processor copies it into the staging area shared with delivery
	// (the STAGE_PREPARE step; the copy is pinned), delivery reads the
	// staged copy, and post-processing releases it (RELEASE_REQUEST). The
	// scheduler limits how many staged copies a share holds (maxprepared).
	Stage bool `json:"stage,omitempty"`
	// NoCache keeps a download out of the cache (ARC's cache=no).
	NoCache bool `json:"no_cache,omitempty"`
	// Activity is what the transfer is for, in FTS3's and Rucio's words
	// ("Production Input", "User Subscriptions"): at most 64 printable
	// characters. Empty is "default".
	Activity string `json:"activity,omitempty"`
	// TPC says whether the file may be moved by an HTTP third-party copy,
	// storage to storage, instead of through a deliverer.
	TPC TPCMode `json:"tpc,omitempty"`
	// SciTag is the packet marking (SciTags: experiment << 6 | activity)
	// that the transfer's requests carry, chosen by a trusted caller
	// (65–65535); 0 lets the site's mapping of the owner's VO and the
	// activity decide. Only trusted callers and administrators may set it.
	SciTag int `json:"scitag,omitempty"`
}

// The range of a SciTag: an experiment id of at least 1 in the high ten
// bits, an activity id in the low six (FTS3 takes the same range).
const (
	MinSciTag = 65
	MaxSciTag = 65535
)

// TPCMode says whether a transfer may be a third-party copy.
type TPCMode string

// The TPC modes. Empty is TPCAuto.
const (
	// TPCAuto copies storage to storage when both ends are HTTP(S) or
	// WebDAV and the storage accepts; otherwise, or when it refuses, the
	// bytes go through a deliverer.
	TPCAuto TPCMode = "auto"
	// TPCOnly fails the transfer if no third-party copy can be made.
	TPCOnly TPCMode = "only"
	// TPCNever always moves the bytes through a deliverer.
	TPCNever TPCMode = "never"
)

// MaxActivity is the longest activity name, in bytes.
const MaxActivity = 64

// Check reports what is wrong with the options, each problem named by its
// field ("checksum: ...", "activity: ...").
func (o Options) Check() []error {
	var errs []error
	if o.Checksum != "" {
		if _, _, err := ParseChecksum(o.Checksum); err != nil {
			errs = append(errs, fmt.Errorf("checksum: %w", err))
		}
	}
	if err := CheckActivity(o.Activity); err != nil {
		errs = append(errs, err)
	}
	if o.SciTag != 0 && (o.SciTag < MinSciTag || o.SciTag > MaxSciTag) {
		errs = append(errs, fmt.Errorf("scitag: %d is outside %d–%d", o.SciTag, MinSciTag, MaxSciTag))
	}
	switch o.TPC {
	case "", TPCAuto, TPCOnly, TPCNever:
	default:
		errs = append(errs, fmt.Errorf("tpc: %q is none of auto, only, never", o.TPC))
	}
	return errs
}

// CheckActivity checks an activity name: at most MaxActivity bytes of
// printable UTF-8, no leading or trailing space, and no "#" (the
// scheduler joins a share's identity and its activity with it, so an
// activity holding one could pass for another identity's share).
func CheckActivity(a string) error {
	switch {
	case len(a) > MaxActivity:
		return fmt.Errorf("activity: %d bytes, more than %d", len(a), MaxActivity)
	case !utf8.ValidString(a):
		return errors.New("activity: not UTF-8")
	case strings.TrimSpace(a) != a:
		return fmt.Errorf("activity %q: leading or trailing space", a)
	case strings.Contains(a, "#"):
		return fmt.Errorf("activity %q: holds %q, which the scheduler uses to join a share's owner and activity", a, "#")
	}
	for _, r := range a {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("activity %q: holds a character that is not printable", a)
		}
	}
	return nil
}

// ErrorKind classifies a failure as ARC's DTR errors do.
type ErrorKind string

// The error kinds. Only TEMPORARY_REMOTE, TRANSFER_SPEED and
// INTERNAL_PROCESS are retried.
const (
	ErrNone            ErrorKind = ""
	ErrInternalLogic   ErrorKind = "INTERNAL_LOGIC"
	ErrInternalProcess ErrorKind = "INTERNAL_PROCESS"
	ErrSelfReplication ErrorKind = "SELF_REPLICATION"
	ErrCache           ErrorKind = "CACHE"
	ErrTemporaryRemote ErrorKind = "TEMPORARY_REMOTE"
	ErrPermanentRemote ErrorKind = "PERMANENT_REMOTE"
	ErrLocalFile       ErrorKind = "LOCAL_FILE"
	ErrTransferSpeed   ErrorKind = "TRANSFER_SPEED"
	ErrStagingTimeout  ErrorKind = "STAGING_TIMEOUT"
)

// Retryable reports whether an error of this kind is worth another attempt.
func (k ErrorKind) Retryable() bool {
	return k == ErrTemporaryRemote || k == ErrTransferSpeed || k == ErrInternalProcess
}

// Failure is an error with its kind and the state in which it was raised.
type Failure struct {
	Kind  ErrorKind `json:"kind"`
	Text  string    `json:"text"`
	State State     `json:"state"`
	// Location is the end that failed, if the worker knows:
	// LocationSource or LocationDestination.
	Location string `json:"location,omitempty"`
}

// The ends of a transfer, for Failure.Location.
const (
	LocationSource      = "source"
	LocationDestination = "destination"
)

// DTR is one file to move.
type DTR struct {
	ID          uuid.UUID `json:"id"`
	JobID       string    `json:"job_id,omitempty"`
	Source      string    `json:"source"`
	Destination string    `json:"destination"`
	Owner       Identity  `json:"owner"`
	Direction   Direction `json:"direction,omitempty"`
	// UserPriority is the job's priority, 1–100 (default 50).
	UserPriority int     `json:"user_priority,omitempty"`
	Options      Options `json:"options,omitempty"`

	// Set by the scheduler.
	Share       string    `json:"share,omitempty"`
	Priority    int       `json:"priority,omitempty"`
	State       State     `json:"state"`
	Attempts    int       `json:"attempts,omitempty"`
	MaxAttempts int       `json:"max_attempts,omitempty"`
	Error       *Failure  `json:"error,omitempty"`
	Cancel      bool      `json:"cancel,omitempty"`
	Size        int64     `json:"size,omitempty"`
	Bytes       int64     `json:"bytes,omitempty"`
	Checksum    string    `json:"checksum,omitempty"`
	Created     time.Time `json:"created"`
	Updated     time.Time `json:"updated"`
	// Started and Ended frame the successful transfer.
	Started time.Time `json:"started,omitzero"`
	Ended   time.Time `json:"ended,omitzero"`
	// NextProcess is when a DTR waiting for a retry goes on.
	NextProcess time.Time `json:"next_process,omitzero"`
	// TraceParent is the W3C traceparent of the DTR's trace.
	TraceParent string `json:"traceparent,omitempty"`
	// TransferGrant is the grant of this attempt's transfer, if one was
	// granted; it names the temporary file that transfer wrote.
	TransferGrant string `json:"transfer_grant,omitempty"`
	// Cleanup says the current post-processing grant removes what a failed
	// or cancelled transfer left, rather than putting the file in place.
	Cleanup bool `json:"cleanup,omitempty"`
	// Grant is the id of the grant that owns the DTR in an active state.
	Grant string `json:"grant,omitempty"`
	// Chained says the DTR's QUERY_REPLICA grant also holds a PRE_CLEAN
	// slot: its worker pre-cleans under the next grant id once the query
	// succeeds (api.Grant.Then). Kept in the record so that a restarted
	// scheduler, or a standby, holds that slot again for the running grant.
	Chained bool `json:"chained,omitempty"`
	// TURL is where a staged source's copy is, the URL delivery reads from
	// (ARC's transfer URL); empty when the source is read directly.
	TURL string `json:"turl,omitempty"`
	// Replicas, when the file has more than one source, lists them all in
	// the order they are tried (preferred pattern first); Source is
	// Replicas[Replica]. A failure of the source moves on to the next
	// replica before a retry is spent; a retry starts from the first.
	Replicas []string `json:"replicas,omitempty"`
	Replica  int      `json:"replica,omitempty"`
	// Cache says how the cache serves the DTR (CacheHit, CacheDownload), and
	// CacheFile is the file:// URL of its cache entry.
	Cache     string `json:"cache,omitempty"`
	CacheFile string `json:"cache_file,omitempty"`
	// ChecksumMismatch is the checksum of an earlier attempt's copy when it
	// was not Options.Checksum. One such mismatch is retried with a fresh
	// copy; a second fails the DTR (PERMANENT_REMOTE), naming both values.
	ChecksumMismatch string `json:"checksum_mismatch,omitempty"`
	// TransferMethod says how the last transfer moved the bytes:
	// TransferPull or TransferPush (a third-party copy, storage to
	// storage), or TransferStreamed through a deliverer, followed by
	// ": <why>" when a third-party copy was wanted and not made.
	TransferMethod string `json:"transfer_method,omitempty"`
	// ChecksumUnverified says why the last transfer's checksum was
	// compared with nothing, when it was not: a third-party copy whose
	// bytes never passed through Sluice, with no checksum from the job
	// or the source to compare the destination's with.
	ChecksumUnverified string `json:"checksum_unverified,omitempty"`
	// TokenRef names, in the bucket sluice_subject_tokens, the bearer
	// token the DTR was submitted with: its transfers exchange it for
	// storage tokens with the submitter's rights. A random reference, not
	// the token, which no DTR record holds; empty for work submitted
	// without a token.
	TokenRef string `json:"token_ref,omitempty"`
	// SubmittedWithToken says the DTR was submitted with a bearer token
	// (its submitter's own, or one a trusted caller such as the generator
	// sent on its submitter's behalf). Its transfers get storage tokens
	// with that token's rights only, by TokenRef, never Sluice's own
	// client credentials: without a TokenRef (the scheduler could not
	// keep the token) a transfer that needs a storage token fails.
	SubmittedWithToken bool `json:"submitted_with_token,omitempty"`
	// ChecksumSource says what Checksum was checked against:
	// ChecksumFromStorage when a checksum the storage itself stated (the
	// source's Digest, or the destination's once written) agreed with
	// the bytes streamed, ChecksumFromStream when only the checksum
	// computed on the stream was, as with a
	// storage that keeps no checksums. Empty until a transfer checks one.
	ChecksumSource string `json:"checksum_source,omitempty"`
	// StateEntered is when the DTR entered its State (Transition sets
	// it). Unlike Updated, a change of priority does not move it: the
	// ageing deadline of a restored DTR and the CACHE_WAIT timeout count
	// from it. Zero in records written before it was kept (read Updated).
	StateEntered time.Time `json:"state_entered,omitzero"`
}

// EnteredState returns when the DTR entered its state: StateEntered, or
// Updated for a record that predates it.
func (d *DTR) EnteredState() time.Time {
	if d.StateEntered.IsZero() {
		return d.Updated
	}
	return d.StateEntered
}

// What a DTR's checksum was checked against (DTR.ChecksumSource).
const (
	ChecksumFromStorage = "storage"
	ChecksumFromStream  = "stream"
)

// How a transfer moved the bytes, for DTR.TransferMethod.
const (
	TransferPull     = "third-party pull"
	TransferPush     = "third-party push"
	TransferStreamed = "streamed"
)

// How the cache serves a DTR.
const (
	// CacheHit: the file is in the cache; it is linked to the destination
	// and not transferred.
	CacheHit = "hit"
	// CacheDownload: the DTR holds the cache entry's lock and downloads
	// into it; the entry is then linked to the destination.
	CacheDownload = "download"
	// CacheLocked: another DTR is downloading the file into the cache.
	CacheLocked = "locked"
)

// Target is where the transfer writes: the cache entry when the DTR
// downloads into the cache, else the destination.
func (d *DTR) Target() string {
	if d.Cache == CacheDownload && d.CacheFile != "" {
		return d.CacheFile
	}
	return d.Destination
}

// Transition moves the DTR to a new state if the move is legal.
func (d *DTR) Transition(to State, now time.Time) error {
	if !CanTransition(d.State, to) {
		return fmt.Errorf("%w: %s → %s (dtr %s)", ErrIllegalTransition, d.State, to, d.ID)
	}
	d.State = to
	d.Updated = now
	d.StateEntered = now
	return nil
}

// Validate checks what a DTR must have before it is scheduled: an id, two
// distinct URLs of known schemes, a priority in range, and, if it belongs
// to a job, a job id the generator can use.
func (d *DTR) Validate() error {
	var errs []error
	if d.ID == uuid.Nil {
		errs = append(errs, errors.New("id is missing"))
	}
	if err := ValidateURL(d.Source); err != nil {
		errs = append(errs, fmt.Errorf("source: %w", err))
	}
	if err := ValidateURL(d.Destination); err != nil {
		errs = append(errs, fmt.Errorf("destination: %w", err))
	}
	for i, r := range d.Replicas {
		if err := ValidateURL(r); err != nil {
			errs = append(errs, fmt.Errorf("replica %d: %w", i+1, err))
		}
		if r == d.Destination {
			errs = append(errs, fmt.Errorf("replica %d is the destination", i+1))
		}
	}
	if d.JobID != "" && !ValidJobID(d.JobID) {
		errs = append(errs, fmt.Errorf("job_id %q is not 1–64 characters of A–Z, a–z, 0–9, '_', '-'", d.JobID))
	}
	if d.Source != "" && d.Source == d.Destination {
		errs = append(errs, errors.New("source and destination are the same"))
	}
	if d.UserPriority != 0 && (d.UserPriority < 1 || d.UserPriority > 100) {
		errs = append(errs, fmt.Errorf("user_priority %d is outside 1–100", d.UserPriority))
	}
	if d.Direction != "" && d.Direction != Download && d.Direction != Upload {
		errs = append(errs, fmt.Errorf("direction %q is neither download nor upload", d.Direction))
	}
	errs = append(errs, d.Options.Check()...)
	if d.Options.TPC == TPCOnly {
		errs = append(errs, CheckTPCOnly(d.Source, d.Destination, d.Replicas, d.Options.Stage)...)
	}
	return errors.Join(errs...)
}

// CheckTPCOnly says why a file with tpc only could never be a third-party
// copy: a URL of a scheme without one, or a source staged to a local copy
// first.
func CheckTPCOnly(source, destination string, replicas []string, stage bool) []error {
	var errs []error
	urls := append([]string{destination, source}, replicas...)
	for i, u := range urls {
		p, err := url.Parse(u)
		if err != nil {
			continue // ValidateURL says why
		}
		if s, ok := SchemeOf(p.Scheme); ok && !s.ThirdPartyCopy {
			what := "destination"
			switch {
			case i == 1:
				what = "source"
			case i > 1:
				what = fmt.Sprintf("replica %d", i-1)
			}
			errs = append(errs, fmt.Errorf("tpc: only, but the %s is %s://, which has no third-party copy (only http, https, dav and davs)", what, p.Scheme))
		}
	}
	if stage {
		errs = append(errs, errors.New("tpc: only, but stage copies the source to local disk first: a staged file is streamed"))
	}
	return errs
}

// ValidateURL checks that u is an absolute URL of a scheme Sluice moves, in
// the form its protocol needs (file:///path, a host for the others, a
// bucket and a key for S3, "//" before an xrootd path), UTF-8, and without
// a password. Its errors never quote a password.
func ValidateURL(u string) error {
	if u == "" {
		return errors.New("URL is empty")
	}
	if !utf8.ValidString(u) {
		// Not quoted: JSON would mangle it, and it may hold credentials.
		return errors.New("URL is not valid UTF-8: write other bytes percent-encoded (%FF); a URL that is not UTF-8 would change on its way through JSON")
	}
	p, err := url.Parse(u)
	if err != nil {
		if strings.Contains(u, "@") {
			// The parser's message may quote a password.
			return errors.New("bad URL (not quoted: it may hold credentials)")
		}
		return fmt.Errorf("bad URL %q: %w", RedactURL(u), stripQuoted(err))
	}
	if p.User != nil {
		if _, has := p.User.Password(); has {
			return fmt.Errorf("URL %q carries a password: credentials come from the environment or files (SLUICE_HTTP_TOKENS), never from URLs, which end up in events and logs", redact(p))
		}
	}
	u = redact(p)
	scheme, ok := SchemeOf(p.Scheme)
	if !ok {
		return fmt.Errorf("URL %q: scheme %q is not one of %s", u, p.Scheme, schemeNames())
	}
	if err := scheme.Check(p); err != nil {
		return fmt.Errorf("URL %q: %w", u, err)
	}
	return nil
}

// ValidJobID reports whether id can be a job's id: 1–64 characters of
// A–Z, a–z, 0–9, '_' and '-'. The generator keeps a job's records under
// keys "<job id>.<...>", so a job id has no dot, and nothing a key-value
// key cannot hold. (Checked for every DTR submitted: a loop, not a
// regular expression.)
func ValidJobID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// Checksum algorithms Sluice computes.
var ChecksumTypes = map[string]bool{"adler32": true, "md5": true, "sha256": true, "crc32c": true}

// ParseChecksum splits "type:value" and checks the type is known.
func ParseChecksum(s string) (typ, value string, err error) {
	typ, value, ok := strings.Cut(s, ":")
	typ = strings.ToLower(typ)
	if !ok || value == "" {
		return "", "", fmt.Errorf("checksum %q is not type:value", s)
	}
	if !ChecksumTypes[typ] {
		return "", "", fmt.Errorf("checksum %q: type %q is not one of adler32, md5, sha256, crc32c", s, typ)
	}
	digits := checksumDigits[typ]
	short := typ == "adler32" || typ == "crc32c" // leading zeros may be left out, as ARC does
	if !isHex(value) || len(value) > digits || !short && len(value) != digits {
		want := fmt.Sprintf("%d hexadecimal digits", digits)
		if short {
			want = "1 to " + want
		}
		return "", "", fmt.Errorf("checksum %q: %s values are %s", s, typ, want)
	}
	return typ, strings.ToLower(value), nil
}

// checksumDigits is the length of each checksum type's value in
// hexadecimal digits.
var checksumDigits = map[string]int{"adler32": 8, "crc32c": 8, "md5": 32, "sha256": 64}

// isHex says whether s is made of hexadecimal digits only.
func isHex(s string) bool {
	for i := range len(s) {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// Submission is what a publisher says about a new DTR on the dtr.submit
// subject; everything else is the scheduler's to set. Its JSON schema is
// schemas/dtr.schema.json.
type Submission struct {
	ID           uuid.UUID `json:"id"`
	JobID        string    `json:"job_id,omitempty"`
	Source       string    `json:"source"`
	Destination  string    `json:"destination"`
	Owner        Identity  `json:"owner,omitzero"`
	Direction    Direction `json:"direction,omitempty"`
	UserPriority int       `json:"user_priority,omitempty"`
	Options      Options   `json:"options,omitzero"`
	// Replicas are other URLs of the same source file, tried when one
	// fails.
	Replicas []string `json:"replicas,omitempty"`
}

// Submission returns what a publisher sends to submit d.
func (d *DTR) Submission() Submission {
	var others []string
	for _, r := range d.Replicas {
		if r != d.Source {
			others = append(others, r)
		}
	}
	return Submission{ID: d.ID, JobID: d.JobID, Source: d.Source, Destination: d.Destination,
		Owner: d.Owner, Direction: d.Direction, UserPriority: d.UserPriority, Options: d.Options, Replicas: others}
}

// DTR returns the new DTR a submission asks for.
func (s Submission) DTR() *DTR {
	d := &DTR{ID: s.ID, JobID: s.JobID, Source: s.Source, Destination: s.Destination,
		Owner: s.Owner, Direction: s.Direction, UserPriority: s.UserPriority, Options: s.Options}
	if len(s.Replicas) > 0 {
		d.Replicas = append([]string{s.Source}, s.Replicas...)
	}
	return d
}

// recordOverhead is about what a DTR record takes besides its strings.
const recordOverhead = 512

// Footprint is about how many bytes d's record takes, in memory and in the
// store: what the per-owner limit SLUICE_OWNER_MAX_BYTES counts.
func Footprint(d *DTR) int64 {
	n := recordOverhead + len(d.Source) + len(d.Destination) + len(d.JobID) + len(d.Owner.DN) + len(d.Options.Checksum) + len(d.Options.Activity) +
		len(d.TransferMethod) + len(d.ChecksumUnverified)
	for _, r := range d.Replicas {
		n += len(r)
	}
	for _, f := range d.Owner.FQANs {
		n += len(f)
	}
	return int64(n)
}
