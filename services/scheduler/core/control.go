package core

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// ErrUnknownJob is returned for a job with no unfinished DTR.
var ErrUnknownJob = errors.New("unknown job, or every DTR of it has finished")

// CancelJob cancels every unfinished DTR of a job that owns says is the
// caller's (nil: every one) and returns how many it cancelled. Those DTRs'
// owners' DTRs of the job that arrive later (still on their way through the
// submit stream) are cancelled as they arrive, for cancelledJobKept; other
// owners' are not. A job with no such DTR is ErrUnknownJob, and leaves
// nothing behind.
func (c *Core) CancelJob(now time.Time, jobID string, owns func(dtr.Identity) bool) (int, error) {
	c.forgetCancelledJobs(now)
	var ids []uuid.UUID
	owners := map[string]bool{}
	for id, e := range c.dtrs { // a rare request: a scan keeps no index in memory
		if jobID == "" || c.jobOf(e) != jobID {
			continue
		}
		if owner := c.peekEntry(e).Owner; owns == nil || owns(owner) {
			ids = append(ids, id)
			owners[owner.DN] = true
		}
	}
	if len(ids) == 0 {
		return 0, fmt.Errorf("%w: %q", ErrUnknownJob, jobID)
	}
	for dn := range owners {
		c.cancelledJobs[cancelledJob(jobID, dn)] = now
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i].String() < ids[j].String() })
	for _, id := range ids {
		if err := c.Cancel(now, id); err != nil {
			return 0, err
		}
	}
	return len(ids), nil
}

// cancelledJob is the key of an owner's DTRs of a cancelled job.
func cancelledJob(jobID, dn string) string { return jobID + "\n" + dn }

// cancelledJobKept is how long a cancelled job's DTRs still on their way
// are cancelled as they arrive: a job's DTRs reach the scheduler within
// moments of each other.
const cancelledJobKept = time.Hour

// forgetCancelledJobs drops the cancelled jobs older than cancelledJobKept.
func (c *Core) forgetCancelledJobs(now time.Time) {
	for job, at := range c.cancelledJobs {
		if now.Sub(at) > cancelledJobKept {
			delete(c.cancelledJobs, job)
		}
	}
}

// SetSharePriorities replaces the configured share priorities. The slot
// split follows at the next tick. The DTRs of a share whose priority changed
// get their priority computed again from it (share × user / 100), so that
// those queued before and after the change keep their order; a priority set
// by hand or raised by ageing in such a share starts over.
func (c *Core) SetSharePriorities(now time.Time, prios map[string]int) error {
	var errs []error
	for share, p := range prios {
		if p < 1 || p > 100 {
			errs = append(errs, fmt.Errorf("share %q: priority %d is outside 1–100", share, p))
		}
		if share == "" {
			errs = append(errs, errors.New("a share name is empty"))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	cp := make(map[string]int, len(prios))
	for k, v := range prios {
		cp[k] = v
	}
	old := c.cfg.SharePriority
	c.cfg.SharePriority = cp
	for _, e := range c.dtrs {
		share := c.shareOf(e)
		if p := c.SharePriority(share); p != sharePriorityUnder(old, c.cfg.SharePolicy, share) {
			d := c.unpackEntry(e)
			d.Priority = c.policy.Priority(d.Share, d)
			d.Updated = now
			c.markDirty(e)
			if d.State.IsQueue() && e.index >= 0 {
				e.home().fix(e)
			}
		}
	}
	for _, st := range c.states {
		for _, ss := range st.order {
			ss.prio = c.SharePriority(ss.name)
		}
	}
	return nil
}

// Why explains where a DTR is and what it waits for.
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

// Explain tells why a DTR waits: its share, its place in the share's queue,
// the slot split that holds it, and when it should start.
func (c *Core) Explain(now time.Time, id uuid.UUID) (Why, error) {
	e, ok := c.dtrs[id]
	if !ok {
		return Why{}, fmt.Errorf("%w: %s", ErrUnknownDTR, id)
	}
	d := c.peekEntry(e)
	w := Why{DTR: d.ID, State: d.State, Share: d.Share, Priority: d.Priority}
	switch {
	case d.State.IsActive():
		w.Reason = fmt.Sprintf("running in %s under grant %s since %s", d.State, d.Grant, c.when(e.granted).UTC().Format(time.RFC3339))
		if d.Chained {
			w.Reason += fmt.Sprintf(", holding a PRE_CLEAN slot too: its worker pre-cleans next, under grant %s", nextGrant(d))
		}
		return w, nil
	case !d.NextProcess.IsZero():
		w.Reason = fmt.Sprintf("waiting to retry after %s (attempt %d of %d)", errorText(d.Error), d.Attempts+1, d.MaxAttempts)
		w.EstimatedStart = d.NextProcess
		return w, nil
	case !d.State.IsQueue():
		w.Reason = "being routed by the scheduler"
		return w, nil
	}
	st := c.states[d.State]
	// Its place among all its share's waiting DTRs, parked or not.
	q := e.home()
	ahead := func(items []*entry) {
		for _, o := range items {
			if o != e && queueBefore(q.draw != nil, o, e) {
				w.Position++
			}
		}
	}
	ahead(e.share.q.items)
	for _, p := range e.share.parked {
		ahead(p.items)
	}
	names := st.order
	alloc, exact := c.shareSlots(st)
	var part float64
	var gave int // the slots payback took from its share
	for i, ss := range st.order {
		if ss == e.share {
			w.Slots, part = alloc[i], exact[i]
			if st.gave != nil {
				gave = st.gave[i]
			}
		}
	}
	w.Queued, w.Running = e.share.q.Len()+e.share.parkedN, e.share.running
	if e.park != nil {
		w.Reason = c.holdReason(e)
		return w, nil
	}
	w.Limit, w.Busy = c.Limit(d.State), st.total
	if h := c.hosts.blocked(e); classOf(d.State).PerHost && c.hosts.limited() && h == linkFull {
		w.Reason = fmt.Sprintf("link %s already has %d transfers running, its limit set by the optimizer (sluice links): the DTR waits for one of them to end",
			c.linkName(e), c.links.links[e.hosts].running)
		return w, nil
	} else if classOf(d.State).PerHost && c.hosts.limited() && h != 0 {
		w.Reason = fmt.Sprintf("storage endpoint %s already has %d transfers running (max per host %d): the DTR waits for one of them to end",
			c.names[h-1], c.hosts.running[h], c.cfg.MaxPerHost)
		return w, nil
	}
	if reason := c.activityLimitReason(e); classOf(d.State).PerHost && reason != "" {
		w.Reason = reason
		return w, nil
	}
	if p := c.pins.of(d.Share); classOf(d.State).Pins && c.pins.full(d.Share, d.Priority) {
		w.Reason = fmt.Sprintf("share %s holds %d staged copies (maxprepared %d) and this DTR's priority %d does not outrank the best of them (%d): it waits for one to be released",
			d.Share, p.n, c.cfg.MaxPrepared, d.Priority, p.highest())
		return w, nil
	}
	switch free := w.Slots - w.Running; {
	case w.Slots == 0:
		w.Reason = fmt.Sprintf("share %s has no slot in %s: %d shares with work share its %d slots; it may get an emergency slot when it has nothing running",
			d.Share, d.State, len(names), w.Limit)
	case free > 0 && w.Busy >= w.Limit:
		w.Reason = fmt.Sprintf("share %s is due %d slots in %s but all %d are busy; it gets the next one to free up",
			d.Share, w.Slots, d.State, w.Limit)
	case free <= 0:
		w.Reason = fmt.Sprintf("share %s uses all its %d of %d slots in %s; %d of its DTRs are ahead of this one",
			d.Share, w.Slots, w.Limit, d.State, w.Position) + paybackNote(gave, part, e.share.deficit)
	default:
		w.Reason = fmt.Sprintf("share %s has a free slot in %s; it starts at the next tick", d.Share, d.State)
	}
	if avg, ok := c.took[d.State]; ok && w.Slots > 0 {
		rounds := w.Position/w.Slots + 1
		if w.Slots-w.Running > w.Position {
			rounds = 0
		}
		w.EstimatedStart = now.Add(time.Duration(rounds) * avg)
	}
	return w, nil
}

func errorText(f *dtr.Failure) string {
	if f == nil {
		return "an error"
	}
	return fmt.Sprintf("%s: %s", f.Kind, f.Text)
}
