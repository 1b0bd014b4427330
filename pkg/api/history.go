package api

// A DTR's history (sluice.api.history) and the stuck DTRs in the shares
// reply.

import (
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// SubjectHistory answers a DTR's history: its body is the DTR's id.
const SubjectHistory = "sluice.api.history"

// HistoryEvent is one change in a DTR's life as the scheduler saw it: a
// new state, or, in the same state, a new reason that holds it there.
type HistoryEvent struct {
	// Seq numbers the DTR's events from 1; a gap says events were dropped.
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// From is the state before (its name), if known.
	From  string    `json:"from,omitempty"`
	State dtr.State `json:"state"`
	// Hold is what held the DTR in State when the event was recorded (a
	// word of HoldWords); Until when a retry's or cache wait's delay
	// ends.
	Hold  string    `json:"hold,omitempty"`
	Until time.Time `json:"until,omitzero"`
	// Error is the DTR's error, when it has one new.
	Error *dtr.Failure `json:"error,omitempty"`
	// Grant is the grant the DTR runs under in an active state. Ended is
	// the grant that ended with this event (the DTR left its active
	// state), and Worker the worker that held it (role@host (pid N)), if
	// the scheduler heard from it.
	Grant  string `json:"grant,omitempty"`
	Ended  string `json:"ended_grant,omitempty"`
	Worker string `json:"worker,omitempty"`
	// Bytes are the bytes moved so far; Attempts the attempts made.
	Bytes    int64  `json:"bytes,omitempty"`
	Attempts int    `json:"attempts,omitempty"`
	Share    string `json:"share,omitempty"`
	Priority int    `json:"priority,omitempty"`
	// Term is the leader's term that recorded the event.
	Term uint64 `json:"term,omitempty"`
}

// HistoryRecord is a message of the stream SLUICE_HISTORY, on the subject
// sluice.history.<dtr>: events of one DTR that the scheduler recorded
// since the last message (in the steps of about a second),
// numbered on from the message before.
type HistoryRecord struct {
	Events []HistoryEvent `json:"events"`
}

// HistoryReply is the answer of sluice.api.history: the DTR's events, the
// oldest first.
type HistoryReply struct {
	DTR   uuid.UUID `json:"dtr"`
	State dtr.State `json:"state"`
	// Events are the last HistoryPerDTR events kept, duplicates (a step
	// taken again after a crash) left out.
	Events []HistoryEvent `json:"events"`
	// Dropped counts the DTR's earlier events no longer kept.
	Dropped uint64 `json:"dropped,omitempty"`
	// Missing, set when no event is shown, says why: the history is not
	// recorded, not stored yet, or no longer kept (the store keeps only
	// its newest SLUICE_HISTORY_MAX_BYTES).
	Missing string `json:"missing,omitempty"`
}

// HoldWords says in words what each hold of a history event or a stuck
// DTR means: the reasons `sluice why` gives, in short.
var HoldWords = map[string]string{
	"running":       "running under a grant",
	"retry_backoff": "waiting to retry after an error",
	"cache_wait":    "waiting for another DTR's download of the same file into the cache",
	"routing":       "being routed by the scheduler",
	"endpoint_full": "queued: a storage endpoint has its most transfers running (max per host)",
	"link_full":     "queued: its link has as many transfers running as the optimizer's limit for it",
	"activity_full": "queued: an activity limit at one of its endpoints is full",
	"maxprepared":   "queued: its share holds its most staged copies (maxprepared)",
	"share_no_slot": "queued: its share has no slot in this state",
	"state_full":    "queued: its share is due a slot but every slot of the state is busy",
	"share_full":    "queued: its share uses all its slots",
	"free_slot":     "queued with a free slot: starts at the next tick",
}

// StuckDTR is a DTR that has been in its state past the time it should
// take (its deadline) and waits for nothing that will come.
type StuckDTR struct {
	DTR   uuid.UUID `json:"dtr"`
	State dtr.State `json:"state"`
	Hold  string    `json:"hold"`
	// Since is when it came to its state; Deadline how long it may stay.
	Since    time.Time     `json:"since"`
	Deadline time.Duration `json:"deadline_ns"`
}
