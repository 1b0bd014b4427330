package api

// The messages that cross the bus between the services, their CloudEvent
// types and their subjects.

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// Subjects. Every message on them is a CloudEvent (binary content mode, ce-*
// headers) with a W3C traceparent header; dtr.submit also takes structured
// CloudEvents and plain DTR JSON from any publisher.
const (
	// SubjectSubmit takes new DTRs from anyone (stream SLUICE_SUBMIT).
	SubjectSubmit = "dtr.submit"
	// SubjectCancelCommand takes cancel commands for DTRs (stream SLUICE_SUBMIT, so
	// a cancel is ordered after the submits before it).
	SubjectCancelCommand = "sluice.cmd.cancel"
	// SubjectGrantPrefix + stage carries grants (stream SLUICE_GRANTS).
	SubjectGrantPrefix = "sluice.grant."
	// SubjectResultPrefix + stage carries outcomes (stream SLUICE_RESULTS).
	SubjectResultPrefix = "sluice.result."
	// SubjectProgressPrefix + stage carries progress and lease renewals
	// (stream SLUICE_RESULTS).
	SubjectProgressPrefix = "sluice.progress."
	// SubjectStopPrefix + grant id tells the worker holding a grant to stop
	// (core NATS: only the holder cares, and only now).
	SubjectStopPrefix = "sluice.stop."
	// SubjectHeartbeatPrefix + stage carries the heartbeats of that
	// stage's worker processes (core NATS: only the latest matters, and
	// only to whoever listens now; the scheduler does).
	SubjectHeartbeatPrefix = "sluice.heartbeat."
	// SubjectDTRFinal carries every DTR that reached DONE, CANCELLED or ERROR
	// (stream SLUICE_EVENTS).
	SubjectDTRFinal = "sluice.event.dtr.final"
	// SubjectDTRState carries every state change (core NATS, best effort,
	// for observers).
	SubjectDTRState = "sluice.event.dtr.state"
	// SubjectJobFinished and SubjectJobFailed carry the end of a job with
	// per-file statistics (stream SLUICE_EVENTS).
	SubjectJobFinished = "sluice.event.job.finished"
	SubjectJobFailed   = "sluice.event.job.failed"
	// SubjectRejected carries the reason a message was refused (stream
	// SLUICE_REJECTIONS, of its own: a flood of refused messages drops old
	// rejections, never another owner's final DTRs).
	SubjectRejected = "sluice.event.rejected"
	// The request/reply subjects are in api.go.
)

// Subjects of a user. Every subject that takes work or requests from
// outside (dtr.submit and sluice.api.*) has a plain form, which is the
// operator's, and one per NATS user, <subject>.<user>, which the NATS
// server lets only that user publish to (deploy/nats/sluice.conf), so that
// a message there comes from that user (pkg/auth).

// UserSubject returns base's subject for user; for "" it is base itself.
func UserSubject(base, user string) string {
	if user == "" {
		return base
	}
	return base + "." + user
}

// InSubjectOf says whether subject is base or base.<user>.
func InSubjectOf(subject, base string) bool {
	if len(subject) == len(base) {
		return subject == base
	}
	return len(subject) > len(base)+1 && subject[len(base)] == '.' && subject[:len(base)] == base &&
		!strings.Contains(subject[len(base)+1:], ".")
}

// GrantSubject returns the grant subject of a stage.
func GrantSubject(s dtr.Stage) string { return SubjectGrantPrefix + string(s) }

// ResultSubject returns the result subject of a stage.
func ResultSubject(s dtr.Stage) string { return SubjectResultPrefix + string(s) }

// ProgressSubject returns the progress subject of a stage.
func ProgressSubject(s dtr.Stage) string { return SubjectProgressPrefix + string(s) }

// HeartbeatSubject returns the heartbeat subject of a stage.
func HeartbeatSubject(s dtr.Stage) string { return SubjectHeartbeatPrefix + string(s) }

// CloudEvent types, one per message kind. The data of each is JSON; its
// schema is documented in docs/usage.md (Messages).
const (
	TypeSubmit      = "org.sluice.dtr.submit.v1"
	TypeSubmits     = "org.sluice.dtr.submits.v1"
	TypeCancel      = "org.sluice.dtr.cancel.v1"
	TypeGrant       = "org.sluice.grant.v1"
	TypeGrants      = "org.sluice.grants.v1"
	TypeResult      = "org.sluice.result.v1"
	TypeResults     = "org.sluice.results.v1"
	TypeProgress    = "org.sluice.progress.v1"
	TypeStop        = "org.sluice.stop.v1"
	TypeDTRStates   = "org.sluice.dtr.states.v1"
	TypeDTRFinal    = "org.sluice.dtr.final.v1"
	TypeDTRFinals   = "org.sluice.dtr.finals.v1"
	TypeJobFinished = "org.sluice.job.finished.v1"
	TypeJobFailed   = "org.sluice.job.failed.v1"
	TypeRejected    = "org.sluice.rejected.v1"
	TypeHeartbeat   = "org.sluice.heartbeat.v1"
)

// HeaderSubjectToken, on a dtr.submit message of a trusted caller (the
// generator), carries the bearer token that the work was submitted with
// (a job's), so that its transfers reach storage with the submitter's
// rights: the scheduler verifies it, keeps it for the DTRs that its holder
// owns, and ignores it from any other caller. Only the scheduler reads
// SLUICE_SUBMIT, where it stays until taken.
const HeaderSubjectToken = "Sluice-Subject-Token"

// Grant is the data of a grant event: the scheduler gives a DTR a slot in
// one state. The worker holds the grant until it publishes a Result; it
// renews the lease with Progress events while the work lasts. The
// scheduler's core decides grants in this shape too.
type Grant struct {
	ID    string    `json:"grant"`
	Stage dtr.Stage `json:"stage"`
	// State is the active state the DTR is in while the grant runs.
	State dtr.State `json:"state"`
	// LeaseSeconds is how long the grant stays valid without progress.
	LeaseSeconds float64 `json:"lease_seconds"`
	// Cleanup asks post-processing to delete what a failed or cancelled
	// transfer left, instead of putting the file in place.
	Cleanup bool `json:"cleanup,omitempty"`
	// Emergency marks a grant on one of the state's emergency slots.
	Emergency bool `json:"emergency,omitempty"`
	// Then, on a QUERY_REPLICA grant, says that the scheduler holds a
	// slot of the next state for the DTR too: once the query succeeds,
	// the worker does that step as well, under Then's grant id, and
	// sends both outcomes in one Result (its Then). A worker that does
	// only the grant's own state is still right: the scheduler frees the
	// slot it held and queues the DTR for it.
	Then *GrantThen `json:"then,omitempty"`
	// ExpectedSeconds is how long the scheduler expects the work to take
	// (for a transfer, its size at the link's recent throughput): the
	// storage tokens it gets must outlive it. 0: not said, or short.
	ExpectedSeconds float64 `json:"expected_seconds,omitempty"`
	// Term is the term of the scheduler that issued the grant (the
	// journal sequence at which it began to lead): it only grows, and a
	// worker drops a grant of an older term than one it has seen. 0 from a
	// scheduler that does not say.
	Term uint64 `json:"term,omitempty"`
	// TraceParent names the scheduler's span that sent this grant, so that
	// the worker's span joins the DTR's trace when the grant comes in a
	// Grants event with others.
	TraceParent string `json:"traceparent,omitempty"`
	// DTR is the DTR as granted; it is always sent. Last, so that a
	// publisher may encode the grant without it and append the DTR's JSON
	// it has already (AppendDTR). From the scheduler's core it points into
	// the core: read it before calling the core again.
	DTR *dtr.DTR `json:"dtr,omitempty"`
}

// GrantThen is the step a chained grant's worker does after the grant's
// own: its active state (PRE_CLEANING) and the grant id its outcome is
// sent under.
type GrantThen struct {
	State dtr.State `json:"state"`
	Grant string    `json:"grant"`
}

// Expected returns the grant's expected duration.
func (g Grant) Expected() time.Duration {
	return time.Duration(g.ExpectedSeconds * float64(time.Second))
}

// Lease returns the grant's lease as a duration.
func (g Grant) Lease() time.Duration { return time.Duration(g.LeaseSeconds * float64(time.Second)) }

// AppendDTR returns grant, the JSON of a Grant encoded without its DTR,
// with d, a DTR's JSON, as its "dtr" (not checked again as a
// json.RawMessage would be).
func AppendDTR(grant, d []byte) []byte {
	grant = append(grant[:len(grant)-1], `,"dtr":`...)
	grant = append(grant, d...)
	return append(grant, '}')
}

// Submits is the data of a TypeSubmits event on dtr.submit: several new
// DTRs in one message (the generator sends a job's DTRs so).
type Submits struct {
	DTRs []SubmitEntry `json:"dtrs"`
}

// SubmitEntry is one DTR of a Submits event: a dtr.Submission, as a single
// DTR's event would carry it, with the traceparent of its own trace.
type SubmitEntry struct {
	TraceParent string          `json:"traceparent,omitempty"`
	DTR         json.RawMessage `json:"dtr"`
}

// Finals is the data of a TypeDTRFinals event on sluice.event.dtr.final:
// the DTRs that consecutive scheduling steps finished (the scheduler
// gathers them for a few milliseconds), in the order they finished.
type Finals struct {
	DTRs []FinalEntry `json:"dtrs"`
}

// FinalEntry is one DTR of a Finals event: the whole DTR, with the
// traceparent of the span that announced it.
type FinalEntry struct {
	TraceParent string          `json:"traceparent,omitempty"`
	DTR         json.RawMessage `json:"dtr"`
}

// Grants is the data of a grants event: several grants of one stage, made
// in one scheduling step and taken by one worker process.
type Grants struct {
	Grants []Grant `json:"grants"`
}

// Result is the data of a result event: a worker's outcome for a grant.
// The scheduler's core takes results in this shape too.
type Result struct {
	DTR   uuid.UUID `json:"dtr"`
	Grant string    `json:"grant"`
	// Stage is the stage whose result subject brought the result, if
	// known: a result from another stage than the grant's is refused. Not
	// on the wire: the subject says it.
	Stage    dtr.Stage    `json:"-"`
	State    dtr.State    `json:"state"`
	Error    *dtr.Failure `json:"error,omitempty"`
	Size     int64        `json:"size,omitempty"`
	Bytes    int64        `json:"bytes,omitempty"`
	Checksum string       `json:"checksum,omitempty"`
	// TransferMethod and ChecksumUnverified are a transfer's, as on
	// dtr.DTR.
	TransferMethod     string `json:"transfer_method,omitempty"`
	ChecksumUnverified string `json:"checksum_unverified,omitempty"`
	// ChecksumSource says what Checksum was checked against
	// (dtr.ChecksumFromStorage, dtr.ChecksumFromStream); "" leaves the
	// DTR's as it is.
	ChecksumSource string `json:"checksum_source,omitempty"`
	// TURL is where a staging grant put the source's copy.
	TURL string `json:"turl,omitempty"`
	// Cache and CacheFile are what a cache check found (dtr.CacheHit,
	// CacheDownload, CacheLocked) and the cache entry's file:// URL.
	Cache     string    `json:"cache,omitempty"`
	CacheFile string    `json:"cache_file,omitempty"`
	Started   time.Time `json:"started,omitzero"`
	Ended     time.Time `json:"ended,omitzero"`
	// Returned says the worker gave the grant back without finishing it
	// (it was stopping): the DTR goes back to its queue, no attempt spent.
	Returned bool `json:"returned,omitempty"`
	// Then is the outcome of the step a chained grant (Grant.Then) asked
	// for after its own, under that step's grant id and state: present
	// only when the grant's own step succeeded and the next was done.
	Then *Result `json:"then,omitempty"`
	// TraceParent names the span that sent this result, so that the
	// scheduler's span for it joins the DTR's trace when it comes in a
	// Results event with others.
	TraceParent string `json:"traceparent,omitempty"`
}

// Results is the data of a results event: the outcomes of several grants
// of one stage, sent together by one worker process.
type Results struct {
	Results []Result `json:"results"`
}

// Progress is the data of a progress event; it also renews the grant's lease.
type Progress struct {
	DTR   uuid.UUID `json:"dtr"`
	Grant string    `json:"grant"`
	Bytes int64     `json:"bytes"`
	Size  int64     `json:"size,omitempty"`
	// Worker is the id of the worker process that holds the grant (its
	// Heartbeat's), if it says.
	Worker string `json:"worker,omitempty"`
}

// Heartbeat is the data of a heartbeat event on sluice.heartbeat.<stage>:
// one stage's pool of a worker process (pkg/worker) says it is alive and
// which grants it holds, every IntervalSeconds. Its schema is
// schemas/heartbeat.schema.json.
type Heartbeat struct {
	// Worker is the worker process's id, stable while it runs: the
	// instance id of its NATS micro service (nats micro ls shows it),
	// which a processor's pre- and post-processing pools share.
	Worker string `json:"worker"`
	// Role is the service: "processor" or "delivery".
	Role  string    `json:"role"`
	Stage dtr.Stage `json:"stage"`
	Host  string    `json:"host"`
	PID   int       `json:"pid"`
	// Version is the build's (pkg/version).
	Version string    `json:"version"`
	Started time.Time `json:"started"`
	// Workers is how many grants the pool runs at once.
	Workers int `json:"workers"`
	// IntervalSeconds is how often the worker sends a heartbeat
	// (SLUICE_HEARTBEAT): it is silent once three have not come.
	IntervalSeconds float64 `json:"interval_seconds"`
	// Grants are the grants it holds, waiting for a worker or running.
	Grants []HeldGrant `json:"grants"`
	// Stopping says this is the last heartbeat: the process is stopping
	// (and gives back what it holds); it is not missed when none follows.
	Stopping bool `json:"stopping,omitempty"`
}

// HeldGrant is a grant a worker holds.
type HeldGrant struct {
	DTR   uuid.UUID `json:"dtr"`
	Grant string    `json:"grant"`
	State dtr.State `json:"state"`
}

// Interval returns the heartbeat's interval as a duration.
func (h Heartbeat) Interval() time.Duration {
	return time.Duration(h.IntervalSeconds * float64(time.Second))
}

// Cancel is the data of a cancel command.
type Cancel struct {
	DTR    uuid.UUID `json:"dtr"`
	Reason string    `json:"reason,omitempty"`
}

// Stop tells the worker holding a grant to give up now.
type Stop struct {
	DTR   uuid.UUID `json:"dtr"`
	Grant string    `json:"grant"`
	// Term is the term of the scheduler that sent it (Grant.Term).
	Term uint64 `json:"term,omitempty"`
}

// StateChanges is the data of a DTR states event: every DTR that changed
// in consecutive scheduling steps (those settled together), in its new
// state, in order: a DTR changed in two of them appears twice, its latest
// state last.
type StateChanges struct {
	Changes []StateChange `json:"changes"`
}

// StateChange is one DTR's new state.
type StateChange struct {
	DTR      uuid.UUID `json:"dtr"`
	JobID    string    `json:"job_id,omitempty"`
	State    dtr.State `json:"state"`
	Share    string    `json:"share"`
	Priority int       `json:"priority"`
}

// Rejection says why a message was refused. Nothing else changed.
type Rejection struct {
	Subject string `json:"subject"`
	MsgID   string `json:"msg_id,omitempty"`
	Reason  string `json:"reason"`
	// Payload is the start of the refused message, for the publisher's logs.
	Payload string `json:"payload,omitempty"`
}
