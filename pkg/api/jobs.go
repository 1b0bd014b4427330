package api

// Requests, replies and events of the generator: jobs in, their state out.

import (
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// Job states.
const (
	JobRunning  = "running"
	JobFinished = "finished"
	JobFailed   = "failed"
)

// JobRecord is a job's state: its description (without its files) and
// counts, as the generator keeps it.
type JobRecord struct {
	Job       job.Job   `json:"job"`
	State     string    `json:"state"`
	Total     int       `json:"total"`
	Done      int       `json:"done"`
	Failed    int       `json:"failed"`
	Cancelled int       `json:"cancelled"`
	Created   time.Time `json:"created"`
	Ended     time.Time `json:"ended,omitzero"`
	// DownloadFailed is set by the first mandatory download that failed; the
	// job's other downloads were then cancelled.
	DownloadFailed bool `json:"download_failed,omitempty"`
	// Failures are "Failed in data staging: ..." lines, as ARC writes them.
	Failures []string `json:"failures,omitempty"`
	// Announced says the job's end event has been published.
	Announced bool `json:"announced,omitempty"`
}

// Final reports how many of the job's DTRs are final.
func (r *JobRecord) Final() int { return r.Done + r.Failed + r.Cancelled }

// FileRef is one of a job's DTRs.
type FileRef struct {
	DTR            uuid.UUID     `json:"dtr"`
	Direction      dtr.Direction `json:"direction"`
	Source         string        `json:"source"`
	Destination    string        `json:"destination"`
	FailureAllowed bool          `json:"failure_allowed,omitempty"`
	// TraceID is the id of the DTR's trace (32 hex digits), in which every
	// span of its way through Sluice is found.
	TraceID string `json:"trace_id,omitempty"`
}

// FileStat is the per-file statistics line of a finished job (ARC's
// job.ID.statistics).
type FileStat struct {
	FileRef
	State    dtr.State    `json:"state"`
	Size     int64        `json:"size"`
	Started  time.Time    `json:"started,omitzero"`
	Ended    time.Time    `json:"ended,omitzero"`
	Checksum string       `json:"checksum,omitempty"`
	Attempts int          `json:"attempts"`
	Error    *dtr.Failure `json:"error,omitempty"`
}

// JobEvent is the data of job-finished and job-failed events, and the
// answer of sluice.api.job.status (where Files has a line only for final
// DTRs and Pending lists the others).
type JobEvent struct {
	JobRecord
	Files   []FileStat `json:"files"`
	Pending []FileRef  `json:"pending,omitempty"`
	// FilesOmitted, PendingOmitted and FailuresOmitted count the lines of
	// Files, Pending and Failures left out so that the event or answer
	// fits in one NATS message (a job of many files on a server with a
	// small max_payload); the counts of the record stay whole.
	FilesOmitted    int `json:"files_omitted,omitempty"`
	PendingOmitted  int `json:"pending_omitted,omitempty"`
	FailuresOmitted int `json:"failures_omitted,omitempty"`
}

// JobListRequest asks sluice.api.job.list for jobs: those in State
// (running, finished, failed; "ended" for either end; empty for any),
// the latest first, at most Limit of them (0: DefaultJobList; at most
// MaxJobList). An empty request is the same as {}.
type JobListRequest struct {
	State string `json:"state,omitempty"`
	Limit int    `json:"limit,omitempty"`
}

// Bounds of a job list.
const (
	DefaultJobList = 50
	MaxJobList     = 1000
)

// JobListReply is the answer of sluice.api.job.list: the records of the
// jobs asked for that the caller may see, the latest first; More says that
// more matched than Limit.
type JobListReply struct {
	Jobs []JobRecord `json:"jobs"`
	More bool        `json:"more,omitempty"`
}

// SubmitReply is the answer of sluice.api.job.submit.
type SubmitReply struct {
	JobID string      `json:"job_id"`
	DTRs  []uuid.UUID `json:"dtrs"`
}

// Headers of a job submit request that carry what an xRSL description
// lacks.
const (
	HeaderSessionDir = "Sluice-Session-Dir"
	HeaderDN         = "Sluice-Owner-DN"
	HeaderFQAN       = "Sluice-Owner-FQAN"
)
