package scheduler

import (
	"reflect"

	"github.com/sluice-dtr/sluice/pkg/bus"
)

// StoreLimits are the most bytes each stream and bucket may hold, read
// from SLUICE_*_MAX_BYTES; the scheduler sets them up (bus.Ensure). The
// NATS server reserves each in its JetStream store, so together they must
// fit in its max_file_store: the defaults add up to 4.58 GiB.
type StoreLimits struct {
	SubmitMaxBytes     int64 `envconfig:"SUBMIT_MAX_BYTES" default:"536870912" desc:"most bytes of stream SLUICE_SUBMIT (DTRs and cancels not yet taken by the scheduler, about 1 KiB a DTR); full, it refuses new DTRs (a job submission answers 503 store full) and keeps those it holds; 0: no limit"`
	GrantsMaxBytes     int64 `envconfig:"GRANTS_MAX_BYTES" default:"134217728" desc:"most bytes of stream SLUICE_GRANTS (grants not yet taken by a worker); full, the scheduler holds its grants back and tries again; 0: no limit"`
	ResultsMaxBytes    int64 `envconfig:"RESULTS_MAX_BYTES" default:"134217728" desc:"most bytes of stream SLUICE_RESULTS (results and progress not yet taken by the scheduler); full, workers hold their results back and try again; 0: no limit"`
	EventsMaxBytes     int64 `envconfig:"EVENTS_MAX_BYTES" default:"536870912" desc:"most bytes of stream SLUICE_EVENTS (final DTRs and job events, kept 7 days); full, its oldest events are dropped; 0: no limit"`
	RejectionsMaxBytes int64 `envconfig:"REJECTIONS_MAX_BYTES" default:"67108864" desc:"most bytes of stream SLUICE_REJECTIONS (why messages were refused, kept 7 days); full, its oldest are dropped: a flood of bad messages drops rejections, never final DTRs; 0: no limit"`
	JournalMaxBytes    int64 `envconfig:"JOURNAL_MAX_BYTES" default:"268435456" desc:"most bytes of stream SLUICE_JOURNAL (DTR records not yet checkpointed); full, the scheduler waits for its next checkpoint; 0: no limit"`
	DTRsMaxBytes       int64 `envconfig:"DTRS_MAX_BYTES" default:"2147483648" desc:"most bytes of bucket sluice_dtrs (a record per DTR, final ones kept SLUICE_RETENTION); full, checkpoints wait and the journal fills; 0: no limit"`
	JobsMaxBytes       int64 `envconfig:"JOBS_MAX_BYTES" default:"1073741824" desc:"most bytes of bucket sluice_jobs (job records, file lists and final DTRs, kept SLUICE_RETENTION after the job ended); full, new jobs are refused and final DTRs wait; 0: no limit"`
	// A bearer token is 1-4 KiB and a job's DTRs share one entry.
	// An event of a DTR's history is about 300 bytes.
	HistoryMaxBytes       int64 `envconfig:"HISTORY_MAX_BYTES" default:"268435456" desc:"most bytes of stream SLUICE_HISTORY (every DTR's state changes, the last 64 of each, kept SLUICE_RETENTION); full, its oldest events are dropped and counted (sluice_scheduler_history_dropped_total); scheduling goes on; 0: no limit"`
	SubjectTokensMaxBytes int64 `envconfig:"SUBJECT_TOKENS_MAX_BYTES" default:"16777216" desc:"most bytes of bucket sluice_subject_tokens (the bearer tokens DTRs were submitted with, each kept until it expires); full, DTRs submitted with a token not kept yet are taken without it and fail at their first storage request saying so, and scheduling goes on; 0: no limit"`
}

// Limits returns the limits as bus.Ensure takes them.
func (l StoreLimits) Limits() bus.Limits {
	return bus.Limits{Submit: l.SubmitMaxBytes, Grants: l.GrantsMaxBytes, Results: l.ResultsMaxBytes,
		Events: l.EventsMaxBytes, Rejections: l.RejectionsMaxBytes, Journal: l.JournalMaxBytes, DTRs: l.DTRsMaxBytes, Jobs: l.JobsMaxBytes,
		SubjectTokens: l.SubjectTokensMaxBytes, History: l.HistoryMaxBytes}
}

// tagDefault returns the default tag of Config's field: the one place a
// default is written, read here too for a Config built in code.
func tagDefault(field string) string {
	f, _ := reflect.TypeFor[Config]().FieldByName(field)
	return f.Tag.Get("default")
}
