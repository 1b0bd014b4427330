package scheduler

import (
	"math"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// historyLength is how many one-second samples the monitor keeps (ten
// minutes).
const historyLength = 600

// Overview is what the scheduler looks like now and over the last minutes:
// the answer of the web page's /api/overview and the source of the metrics.
type Overview struct {
	Time   time.Time `json:"time"`
	Policy string    `json:"policy"`
	// Scheduler says what the scheduler serving the page is in the
	// leader election, and who leads.
	Scheduler SchedulerRole `json:"scheduler"`
	// Shares is every share's load in every queue state that has work, with
	// the slots it has under the split and the slots its configured weight
	// alone would give it.
	Shares []ShareLoad `json:"shares"`
	// States holds each queue state's limit and use.
	States []StateLoad `json:"states"`
	// Retrying counts the DTRs per share that wait to be tried again.
	Retrying map[string]int `json:"retrying"`
	Counts   core.Counts    `json:"counts"`
	// Finished counts, per share, the DTRs that ended DONE and their bytes.
	Finished map[string]Finished `json:"finished"`
	// History holds one sample per second, oldest first.
	History []Sample `json:"history"`
	// Longest are the DTRs that have waited longest in their queue, and why.
	Longest []Waiting `json:"longest"`
	// Totals are the DTRs that ended and their bytes since the scheduler
	// started, and the rates over the last minute and since the start.
	Totals Totals `json:"totals"`
	// Failures are the DTRs that ended ERROR lately (the last 1,000 within
	// 24 hours), grouped by error kind and normalised reason, the largest
	// groups first; FailuresKept counts the DTRs in them.
	Failures     []FailureGroup `json:"failures"`
	FailuresKept int            `json:"failures_kept"`
	// Silent are the grants counted as running whose worker has stopped
	// sending heartbeats, soonest lease end first.
	Silent []api.SilentGrant `json:"silent"`
	// Workers are the worker pools the scheduler hears from, as
	// sluice.api.workers answers.
	Workers []api.Worker `json:"workers"`
	// ActivityLimits are the per-activity limits at endpoints and how
	// many transfers each counts where any run.
	ActivityLimits []core.ActivityLimitUse `json:"activity_limits"`
}

// Totals are what the scheduler finished since it started.
type Totals struct {
	Since     time.Time `json:"since"`
	Done      uint64    `json:"done"`
	Failed    uint64    `json:"failed"`
	Cancelled uint64    `json:"cancelled"`
	// Bytes are those of the DTRs that ended DONE.
	Bytes      int64 `json:"bytes"`
	LastMinute Rate  `json:"last_minute"`
	SinceStart Rate  `json:"since_start"`
}

// Rate is how fast DTRs ended over a span: DTRsPerSecond counts every DTR
// that ended (done, failed or cancelled), MBPerSecond the bytes (10⁶) of
// those done.
type Rate struct {
	Seconds       float64 `json:"seconds"`
	DTRsPerSecond float64 `json:"dtrs_per_s"`
	MBPerSecond   float64 `json:"mb_per_s"`
}

// mark is the totals at one sample, for the rate over the last minute.
type mark struct {
	t     time.Time
	ended uint64
	bytes int64
}

// ShareLoad is one share's load in one queue state.
type ShareLoad struct {
	core.ShareStats
	// Configured is the part of the state's limit the share's configured
	// weight gives it among the shares with work: the split it should get.
	Configured float64 `json:"configured"`
}

// StateLoad is one queue state's slots.
type StateLoad struct {
	State dtr.State `json:"state"`
	Limit int       `json:"limit"`
	Busy  int       `json:"busy"`
	// Emergency counts the slots in use above the limit.
	Emergency int `json:"emergency"`
	Queued    int `json:"queued"`
}

// Finished is what a share has moved.
type Finished struct {
	Files int64 `json:"files"`
	Bytes int64 `json:"bytes"`
}

// Sample is one second of history.
type Sample struct {
	Time time.Time `json:"time"`
	// Files and Bytes are the DTRs per share that ended DONE in the second
	// before Time, and their bytes.
	Files map[string]int64 `json:"files"`
	Bytes map[string]int64 `json:"bytes"`
	// Running and Queued are the transfers per share at Time.
	Running map[string]int `json:"running"`
	Queued  map[string]int `json:"queued"`
	// Fairness is Jain's index of the shares' transfer slots against their
	// configured split (1: every share has exactly its part); absent when
	// no share had transfers to run.
	Fairness *float64 `json:"fairness,omitempty"`
}

// Waiting is a DTR that waits, and why.
type Waiting struct {
	core.Why
	Since   time.Time `json:"since"`
	Created time.Time `json:"created"`
	JobID   string    `json:"job_id,omitempty"`
	Source  string    `json:"source"`
}

// monitor keeps the overview. The scheduling loop writes it; HTTP handlers
// and metric callbacks read copies.
type monitor struct {
	mu       sync.Mutex
	now      Overview
	finished map[string]Finished
	// last holds the finished counts at the previous sample.
	last map[string]Finished
	// started is when the monitor began; marks the totals of the samples
	// of the last minute, oldest first.
	started time.Time
	marks   []mark
	failed  failures
}

func newMonitor(policy string) *monitor {
	return &monitor{now: Overview{Policy: policy}, finished: map[string]Finished{}, last: map[string]Finished{},
		started: time.Now()}
}

// final counts a DTR that ended at now, and records it if it failed.
func (m *monitor) final(now time.Time, d *dtr.DTR) {
	switch d.State {
	case dtr.Done:
		m.mu.Lock()
		f := m.finished[d.Share]
		f.Files++
		f.Bytes += d.Bytes
		m.finished[d.Share] = f
		m.mu.Unlock()
	case dtr.Error:
		r := failureRecord(now, d)
		m.mu.Lock()
		m.failed.add(r)
		m.mu.Unlock()
	}
}

// failure returns the recent failure of DTR id, if the monitor keeps it.
func (m *monitor) failure(id uuid.UUID) (FailureRecord, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.failed.get(id)
}

// sample records the core's state at now. It runs in the scheduling loop.
func (m *monitor) sample(now time.Time, c *core.Core, longest []Waiting, silent []api.SilentGrant, workers []api.Worker) {
	stats, retrying := c.Shares()
	ov := Overview{Time: now, Retrying: retrying, Counts: c.Counts(), Longest: longest, Silent: silent, Workers: workers}
	ov.ActivityLimits = c.ActivityLimits()
	byState := map[dtr.State][]core.ShareStats{}
	for _, s := range stats {
		byState[s.State] = append(byState[s.State], s)
	}
	for _, state := range dtr.QueueStates {
		ss := byState[state]
		sl := StateLoad{State: state, Limit: c.Limit(state)}
		var weights float64
		for _, s := range ss {
			sl.Busy += s.Running
			sl.Queued += s.Queued
			weights += float64(s.Weight)
		}
		sl.Emergency = max(0, sl.Busy-sl.Limit)
		ov.States = append(ov.States, sl)
		for _, s := range ss {
			l := ShareLoad{ShareStats: s}
			if weights > 0 {
				l.Configured = float64(sl.Limit) * float64(s.Weight) / weights
			}
			ov.Shares = append(ov.Shares, l)
		}
	}
	smp := Sample{Time: now, Files: map[string]int64{}, Bytes: map[string]int64{},
		Running: map[string]int{}, Queued: map[string]int{}}
	var x []float64
	for _, l := range ov.Shares {
		if l.State != dtr.Transfer {
			continue
		}
		smp.Running[l.Share], smp.Queued[l.Share] = l.Running, l.Queued
		if l.Configured > 0 {
			x = append(x, float64(l.Running)/l.Configured)
		}
	}
	if j, ok := jain(x); ok {
		smp.Fairness = &j
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	ov.Finished = make(map[string]Finished, len(m.finished))
	for share, f := range m.finished {
		ov.Finished[share] = f
		if d := f.Files - m.last[share].Files; d > 0 {
			smp.Files[share] = d
			smp.Bytes[share] = f.Bytes - m.last[share].Bytes
		}
		m.last[share] = f
	}
	ov.Policy = m.now.Policy
	ov.Totals = m.totals(now, ov.Counts, ov.Finished)
	m.failed.prune(now)
	ov.Failures, ov.FailuresKept = m.failed.grouped(), len(m.failed.recs)
	ov.History = append(m.now.History, smp)
	if n := len(ov.History); n > historyLength {
		ov.History = slices.Delete(ov.History, 0, n-historyLength)
	}
	m.now = ov
}

// totals returns the totals at now from the core's counts and the bytes
// finished, and keeps them for the rate over the last minute.
func (m *monitor) totals(now time.Time, c core.Counts, finished map[string]Finished) Totals {
	t := Totals{Since: m.started, Done: c.Done, Failed: c.Failed, Cancelled: c.Cancelled}
	for _, f := range finished {
		t.Bytes += f.Bytes
	}
	cur := mark{t: now, ended: c.Done + c.Failed + c.Cancelled, bytes: t.Bytes}
	m.marks = append(m.marks, cur)
	i := 0
	for i < len(m.marks)-1 && now.Sub(m.marks[i+1].t) >= time.Minute {
		i++
	}
	m.marks = slices.Delete(m.marks, 0, i)
	t.LastMinute = rate(m.marks[0], cur)
	t.SinceStart = rate(mark{t: m.started}, cur)
	return t
}

// rate is how fast DTRs ended between two marks.
func rate(from, to mark) Rate {
	s := to.t.Sub(from.t).Seconds()
	if s <= 0 {
		return Rate{}
	}
	return Rate{Seconds: math.Round(s), DTRsPerSecond: float64(to.ended-from.ended) / s,
		MBPerSecond: float64(to.bytes-from.bytes) / 1e6 / s}
}

// overview returns a copy of the latest overview that callers may keep.
func (m *monitor) overview() Overview {
	m.mu.Lock()
	defer m.mu.Unlock()
	ov := m.now
	ov.History = slices.Clone(ov.History)
	return ov
}

// SchedulerRole is a scheduler's part in the leader election.
type SchedulerRole struct {
	// Role is "leader" or "standby" (empty while it starts); Name and Term
	// are its own (Term while it leads).
	Role string `json:"role"`
	Name string `json:"name"`
	Term uint64 `json:"term,omitempty"`
	// Leader is who leads, as the leader key says (absent while no one
	// does).
	Leader *api.Leader `json:"leader,omitempty"`
}

// jain returns Jain's fairness index of x: (Σx)² / (n·Σx²), 1 when all are
// equal, 1/n when one has everything. With no positive x there is nothing
// to judge.
func jain(x []float64) (float64, bool) {
	var sum, sq float64
	for _, v := range x {
		sum += v
		sq += v * v
	}
	if len(x) == 0 || sq == 0 {
		return 0, false
	}
	return math.Min(1, sum*sum/(float64(len(x))*sq)), true
}
