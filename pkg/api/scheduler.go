package api

// Requests and replies of the scheduler's endpoints.

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// PriorityRequest is the body of sluice.api.priority.
type PriorityRequest struct {
	DTR      uuid.UUID `json:"dtr"`
	Priority int       `json:"priority"`
}

// CancelRequest is the body of sluice.api.cancel: one DTR or a whole job.
type CancelRequest struct {
	DTR uuid.UUID `json:"dtr,omitzero"`
	Job string    `json:"job,omitempty"`
}

// CancelReply says how many DTRs a cancel reached.
type CancelReply struct {
	Cancelled int `json:"cancelled"`
}

// ReconfigureRequest is the body of sluice.api.reconfigure: the share
// priorities that replace the configured ones until the scheduler restarts.
type ReconfigureRequest struct {
	SharePriority map[string]int `json:"sharepriority"`
}

// SharesReply is the answer of sluice.api.shares.
type SharesReply struct {
	Shares   []ShareStats   `json:"shares"`
	Retrying map[string]int `json:"retrying,omitempty"`
	Limits   map[string]int `json:"limits"`
}

// DTRReply is the answer of sluice.api.dtr: the DTR and, while it is
// unfinished, why it is where it is.
type DTRReply struct {
	DTR dtr.DTR `json:"dtr"`
	Why *Why    `json:"why,omitempty"`
	// TraceID is the id of the DTR's trace (32 hex digits), in which every
	// span of its way through Sluice is found.
	TraceID string `json:"trace_id,omitempty"`
}

// RetryingReply is the answer of sluice.api.retrying: a job's DTRs that
// wait to be tried again, each with its error, attempts and next_process.
type RetryingReply struct {
	DTRs []dtr.DTR `json:"dtrs"`
}

// ShareStats is one share's load in one state. It has the fields of the
// scheduler core's own, which the scheduler converts to it (a struct
// conversion: the compiler keeps the two alike).
type ShareStats struct {
	Share    string    `json:"share"`
	State    dtr.State `json:"state"`
	Priority int       `json:"priority"`
	Queued   int       `json:"queued"`
	Running  int       `json:"running"`
	// Slots is the share's part of the state's limit under the current split.
	Slots int `json:"slots"`
	// Weight is the share's weight in that split under the policy in force
	// (the configured priority under ARC's).
	Weight int64 `json:"weight"`
}

// Why explains where a DTR is and what it waits for; like ShareStats, the
// core's own converted.
type Why struct {
	DTR      uuid.UUID `json:"dtr"`
	State    dtr.State `json:"state"`
	Share    string    `json:"share"`
	Priority int       `json:"priority"`
	// Reason says in words why the DTR is not further along.
	Reason string `json:"reason"`
	// Position is the number of DTRs of the same share ahead of it in its
	// queue (0: it is next).
	Position int `json:"position"`
	// Queued, Running and Slots describe its share in its state; Limit and
	// Busy the whole state.
	Queued  int `json:"queued"`
	Running int `json:"running"`
	Slots   int `json:"slots"`
	Limit   int `json:"limit"`
	Busy    int `json:"busy"`
	// EstimatedStart is when it should start, from how long the state's
	// grants have lately taken; zero when there is nothing to go on.
	EstimatedStart time.Time `json:"estimated_start,omitzero"`
}

// ParseSharePriorities reads "share=prio,share=prio" (a space or a tab may
// stand for "=", as in ARC's "sharepriority=atlas:validation 80", and spaces
// may surround the "="). The priority follows the last "=", space or tab,
// so a share named by a DN keeps the "=" of its attributes.
func ParseSharePriorities(s string) (map[string]int, error) {
	out := map[string]int{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		i := strings.LastIndexAny(item, "= \t")
		// "atlas = 80" and "atlas= 80": the "=" before the space is the
		// separator too, not a part of the name.
		share := strings.TrimRightFunc(item[:max(i, 0)], func(r rune) bool { return r == '=' || unicode.IsSpace(r) })
		if i <= 0 || share == "" {
			return nil, fmt.Errorf("share priority %q is not share=priority", item)
		}
		p, err := strconv.Atoi(strings.TrimSpace(item[i+1:]))
		if err != nil || p < 1 || p > 100 {
			return nil, fmt.Errorf("share priority %q: priority must be an integer 1–100", item)
		}
		out[share] = p
	}
	return out, nil
}
