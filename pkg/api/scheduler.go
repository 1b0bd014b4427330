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
	// Warnings, in the answer of a reconfigure, name the shares it set
	// that have no DTRs, and why none may ever come.
	Warnings []string `json:"warnings,omitempty"`
	// Silent are the grants counted as running whose worker has stopped
	// sending heartbeats: they run nowhere, most likely, and wait for
	// their leases to end. An administrator sees every one, another
	// caller their own.
	Silent []SilentGrant `json:"silent,omitempty"`
	// ActivityLimits are the per-activity limits at endpoints and their
	// use (SLUICE_ACTIVITY_LIMITS).
	ActivityLimits []ActivityLimitUse `json:"activity_limits,omitempty"`
	// Stuck are the DTRs the stuck-DTR detector reports now: an
	// administrator sees every one, another caller their own.
	Stuck []StuckDTR `json:"stuck,omitempty"`
	// Reading says that the scheduler, restarted, still reads its stored
	// DTRs (it leads on those its restart index named): the shares'
	// Unread are not read yet, new submissions wait in their stream and
	// changes are refused (503) until it has read them all.
	Reading bool `json:"reading,omitempty"`
}

// ActivityLimitUse is one per-activity limit at a source or destination
// endpoint ("*": each endpoint), and the transfers it counts at each
// endpoint where any run.
type ActivityLimitUse struct {
	Activity    string         `json:"activity"`
	Source      string         `json:"source,omitempty"`
	Destination string         `json:"destination,omitempty"`
	Max         int            `json:"max"`
	Running     map[string]int `json:"running,omitempty"`
}

// SilentGrant is a grant held by a silent worker.
type SilentGrant struct {
	DTR   uuid.UUID `json:"dtr"`
	Grant string    `json:"grant"`
	Share string    `json:"share"`
	State dtr.State `json:"state"`
	// Holder is the worker that held it.
	Holder Holder `json:"holder"`
	// LeaseEnds is when the scheduler gives the grant up, if nothing is
	// heard of it before.
	LeaseEnds time.Time `json:"lease_ends,omitzero"`
}

// LinksRequest is the body of sluice.api.links; an empty body asks for
// no history.
type LinksRequest struct {
	// History asks for each link's last decisions.
	History bool `json:"history,omitempty"`
}

// LinksReply is the answer of sluice.api.links.
type LinksReply struct {
	// Enabled says whether the per-link optimizer runs (SLUICE_OPTIMIZER);
	// Min, Max and Start are its bounds and a new link's limit, and
	// MaxPerHost the per-endpoint limit that caps it.
	Enabled    bool         `json:"enabled"`
	Min        int          `json:"min"`
	Max        int          `json:"max"`
	Start      int          `json:"start"`
	MaxPerHost int          `json:"maxperhost"`
	Links      []LinkStatus `json:"links"`
}

// LinkStatus is one link: transfers from a source endpoint to a
// destination endpoint ("local" for a file on the site's own disk).
type LinkStatus struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
	// Limit is how many transfers the link may run, Running how many it
	// runs; Throughput (bytes/s) and ErrorRate are what the last decision
	// measured.
	Limit      int     `json:"limit"`
	Running    int     `json:"running"`
	Throughput float64 `json:"throughput"`
	ErrorRate  float64 `json:"error_rate"`
	// Last is the last decision, History the kept ones, oldest first
	// (only when asked for).
	Last    *LinkRecord  `json:"last,omitempty"`
	History []LinkRecord `json:"history,omitempty"`
}

// LinkRecord is one decision of the optimizer with what it decided by:
// the mean transfers running over the interval, the throughput (bytes/s)
// and its moving average, the failure rate judged, the transfers that
// ended and failed, and the limit before and after.
type LinkRecord struct {
	At         time.Time `json:"at"`
	Running    float64   `json:"running"`
	Throughput float64   `json:"throughput"`
	EMA        float64   `json:"ema"`
	ErrorRate  float64   `json:"error_rate"`
	Ended      int       `json:"ended"`
	Failed     int       `json:"failed"`
	From       int       `json:"from"`
	Limit      int       `json:"limit"`
	Reason     string    `json:"reason"`
}

// DTRReply is the answer of sluice.api.dtr: the DTR and, while it is
// unfinished, why it is where it is.
type DTRReply struct {
	DTR dtr.DTR `json:"dtr"`
	Why *Why    `json:"why,omitempty"`
	// Holder is the worker that holds the DTR's grant, while one does and
	// the scheduler has heard of it.
	Holder *Holder `json:"holder,omitempty"`
	// TraceID is the id of the DTR's trace (32 hex digits), in which every
	// span of its way through Sluice is found.
	TraceID string `json:"trace_id,omitempty"`
}

// Holder is the worker process holding a grant, as its heartbeats say.
type Holder struct {
	Worker string    `json:"worker"`
	Role   string    `json:"role"`
	Stage  dtr.Stage `json:"stage"`
	Host   string    `json:"host"`
	PID    int       `json:"pid"`
	// LastHeartbeat is when the scheduler last heard from the worker.
	LastHeartbeat time.Time `json:"last_heartbeat"`
	// Silent says the worker's heartbeats have stopped: three intervals
	// have passed without one.
	Silent bool `json:"silent"`
	// LeaseEnds is when the grant's lease ends if nothing more is heard
	// (set for a silent worker's grant).
	LeaseEnds time.Time `json:"lease_ends,omitzero"`
}

// String names the worker as role@host (pid N).
func (h Holder) String() string { return fmt.Sprintf("%s@%s (pid %d)", h.Role, h.Host, h.PID) }

// WorkersReply is the answer of sluice.api.workers: every worker process
// the scheduler has heard from lately, by role, host and pid.
type WorkersReply struct {
	Workers []Worker `json:"workers"`
	// HeartbeatSeconds is the scheduler's SLUICE_HEARTBEAT, the interval
	// it expects of a worker that has not said its own.
	HeartbeatSeconds float64 `json:"heartbeat_seconds"`
}

// Worker is one stage's pool of a worker process as its heartbeats
// describe it; a processor's two pools share its id.
type Worker struct {
	ID      string    `json:"worker"`
	Role    string    `json:"role"`
	Stage   dtr.Stage `json:"stage"`
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Version string    `json:"version"`
	Started time.Time `json:"started"`
	Workers int       `json:"workers"`
	// Grants are the grants it holds that the scheduler still counts as
	// its: those of its last heartbeat whose DTR still runs under them.
	Grants        []WorkerGrant `json:"grants"`
	LastHeartbeat time.Time     `json:"last_heartbeat"`
	// Silent says three heartbeat intervals have passed without one.
	Silent bool `json:"silent"`
	// LeaseEnds is, for a silent worker, when the last of its grants'
	// leases ends: by then the scheduler has granted them again.
	LeaseEnds time.Time `json:"lease_ends,omitzero"`
}

// WorkerGrant is a grant a worker holds, with its lease's end for a
// silent worker.
type WorkerGrant struct {
	DTR       uuid.UUID `json:"dtr"`
	Grant     string    `json:"grant"`
	State     dtr.State `json:"state"`
	LeaseEnds time.Time `json:"lease_ends,omitzero"`
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
	// Running counts the share's grants in the state; Reserved the slots
	// of the state held by chained QUERY_REPLICA grants for their DTRs'
	// PRE_CLEAN, not in Running: each DTR counts once across states.
	Running  int `json:"running"`
	Reserved int `json:"reserved,omitempty"`
	// Slots is the share's part of the state's limit under the current split.
	Slots int `json:"slots"`
	// Weight is the share's weight in that split under the policy in force
	// (the configured priority under ARC's).
	Weight int64 `json:"weight"`
	// Activity is the share's activity under an activity share policy
	// (voms:vo+activity), else empty.
	Activity string `json:"activity,omitempty"`
	// Unread is about how many of Queued a scheduler restarted over a
	// restart index has not yet read from its store (SharesReply.Reading).
	Unread int `json:"unread,omitempty"`
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

// Leader says which scheduler leads: the value of its key in the bucket
// sluice_leader, and the leader named in the scheduler's answers.
type Leader struct {
	// Name is the scheduler's SLUICE_SCHEDULER_NAME, by default its host
	// name; Instance is the id of its run.
	Name     string `json:"name"`
	Instance string `json:"instance"`
	// Term is the leader's term (Grant.Term); 0 until it has begun.
	Term uint64 `json:"term,omitempty"`
	// Since is when it began to lead.
	Since time.Time `json:"since"`
}
