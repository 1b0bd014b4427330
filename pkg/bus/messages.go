package bus

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// Grant is the data of a grant event: the scheduler gives a DTR a slot in
// one state. The worker holds the grant until it publishes a Result; it
// renews the lease with Progress events while the work lasts.
type Grant struct {
	Grant string    `json:"grant"`
	Stage dtr.Stage `json:"stage"`
	State dtr.State `json:"state"`
	DTR   dtr.DTR   `json:"dtr"`
	// LeaseSeconds is how long the grant stays valid without progress.
	LeaseSeconds float64 `json:"lease_seconds"`
	// Cleanup asks post-processing to delete what a failed or cancelled
	// transfer left, instead of putting the file in place.
	Cleanup   bool `json:"cleanup,omitempty"`
	Emergency bool `json:"emergency,omitempty"`
	// TraceParent names the scheduler's span that sent this grant, so that
	// the worker's span joins the DTR's trace when the grant comes in a
	// Grants event with others.
	TraceParent string `json:"traceparent,omitempty"`
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
// the DTRs that one scheduling step finished.
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

// Lease returns the grant's lease as a duration.
func (g Grant) Lease() time.Duration { return time.Duration(g.LeaseSeconds * float64(time.Second)) }

// Result is the data of a result event: a worker's outcome for a grant.
type Result struct {
	DTR      uuid.UUID    `json:"dtr"`
	Grant    string       `json:"grant"`
	State    dtr.State    `json:"state"`
	Error    *dtr.Failure `json:"error,omitempty"`
	Size     int64        `json:"size,omitempty"`
	Bytes    int64        `json:"bytes,omitempty"`
	Checksum string       `json:"checksum,omitempty"`
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
}

// StateChanges is the data of a DTR states event: every DTR that changed
// in one scheduling step, in its new state.
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
