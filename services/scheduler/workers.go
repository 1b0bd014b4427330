package scheduler

// The worker processes, as their heartbeats tell: who they are, what they
// hold, and whether they have gone silent. Outside the core: the core
// knows grants and leases, not processes.

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// missedBeats is how many heartbeat intervals pass without one before a
// worker is silent.
const missedBeats = 3

// workerTracker keeps the last heartbeat of every worker heard from: one
// stage's pool of a worker process (a processor's pre- and post-processing
// pools share the process's id). Heartbeats come on their own
// subscription, renewals in the scheduling loop and questions from the
// API: it locks.
type workerTracker struct {
	mu sync.Mutex
	// every is the interval expected of a worker whose heartbeat does not
	// say its own (SLUICE_HEARTBEAT).
	every time.Duration
	// forgetAfter is how long a silent worker is remembered: longer than
	// any lease it held can last.
	forgetAfter time.Duration
	seen        map[workerKey]*seenWorker
	// deaf is when the scheduler last could not hear (its connection to
	// NATS down): no worker is silent for what it said meanwhile.
	deaf time.Time
	// badHost holds the workers whose heartbeats named a host that is not
	// a plain host name (validWorkerHost), once reported; they are
	// forgotten with the worker.
	badHost map[string]bool
}

// workerKey names one stage's pool of a worker process.
type workerKey struct {
	worker string
	stage  dtr.Stage
}

type seenWorker struct {
	hb   api.Heartbeat
	last time.Time
	// holds are the ids of hb.Grants, for renewals to look up.
	holds map[string]bool
}

func newWorkerTracker(every, lease time.Duration) *workerTracker {
	if every <= 0 {
		every = 5 * time.Second
	}
	return &workerTracker{every: every, forgetAfter: max(10*time.Minute, 2*lease), seen: map[workerKey]*seenWorker{},
		badHost: map[string]bool{}}
}

// heard takes a heartbeat that came at now. A worker that says it stops
// is forgotten: it gives back what it holds. A host that is not a plain
// host name or address (validWorkerHost) is taken as unknown (empty); the
// first time a worker sends one, heard returns it, to be logged.
func (t *workerTracker) heard(hb api.Heartbeat, now time.Time) (badHost string) {
	if hb.Worker == "" {
		return ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if hb.Host != "" && !validWorkerHost(hb.Host) {
		if !t.badHost[hb.Worker] {
			t.badHost[hb.Worker] = true
			badHost = hb.Host
		}
		hb.Host = ""
	}
	key := workerKey{hb.Worker, hb.Stage}
	if hb.Stopping {
		delete(t.seen, key)
		return badHost
	}
	w := &seenWorker{hb: hb, last: now, holds: make(map[string]bool, len(hb.Grants))}
	for _, g := range hb.Grants {
		w.holds[g.Grant] = true
	}
	t.seen[key] = w
	t.forget(now)
	return badHost
}

// forget drops the workers not heard from for forgetAfter. Called with
// t.mu held, wherever the workers are looked at: with every worker gone,
// no heartbeat comes to do it.
func (t *workerTracker) forget(now time.Time) {
	for id, w := range t.seen {
		if now.Sub(w.last) > t.forgetAfter {
			delete(t.seen, id)
		}
	}
	for worker := range t.badHost {
		if !t.knows(worker) {
			delete(t.badHost, worker)
		}
	}
}

// knows says whether any pool of a worker process is remembered. Called
// with t.mu held.
func (t *workerTracker) knows(worker string) bool {
	for k := range t.seen {
		if k.worker == worker {
			return true
		}
	}
	return false
}

// renewed takes a lease renewal that names its worker: a grant taken since
// the worker's last heartbeat is its from now on. A renewal is no
// heartbeat: it does not make a silent worker heard.
func (t *workerTracker) renewed(stage dtr.Stage, p api.Progress) {
	if p.Worker == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.seen[workerKey{p.Worker, stage}]
	if w == nil || w.holds[p.Grant] {
		return
	}
	w.holds[p.Grant] = true
	w.hb.Grants = append(w.hb.Grants, api.HeldGrant{DTR: p.DTR, Grant: p.Grant})
}

// pools counts the pools of a stage heard from and not silent at now: the
// worker processes that take its grants.
func (t *workerTracker) pools(stage dtr.Stage, now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for k, w := range t.seen {
		if k.stage == stage && !t.silent(w, now) {
			n++
		}
	}
	return n
}

// interval is the heartbeat interval of a worker.
func (t *workerTracker) interval(w *seenWorker) time.Duration {
	if i := w.hb.Interval(); i > 0 {
		return i
	}
	return t.every
}

// silent says whether a worker has missed missedBeats heartbeats at now,
// that the scheduler could have heard.
func (t *workerTracker) silent(w *seenWorker, now time.Time) bool {
	return now.Sub(later(w.last, t.deaf)) > missedBeats*t.interval(w)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// deafAt says the scheduler cannot hear the workers at now.
func (t *workerTracker) deafAt(now time.Time) {
	t.mu.Lock()
	t.deaf = later(t.deaf, now)
	t.mu.Unlock()
}

// holder describes a worker as the holder of its grants.
func (t *workerTracker) holder(w *seenWorker, now time.Time) api.Holder {
	return api.Holder{Worker: w.hb.Worker, Role: w.hb.Role, Stage: w.hb.Stage, Host: w.hb.Host, PID: w.hb.PID,
		LastHeartbeat: w.last, Silent: t.silent(w, now)}
}

// heldBy is a grant's DTR and the worker holding it.
type heldBy struct {
	dtr    uuid.UUID
	holder api.Holder
}

// holders returns who holds each grant of the workers heard from: the one
// heard from last where two claim a grant.
func (t *workerTracker) holders(now time.Time) map[string]heldBy {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forget(now)
	out := map[string]heldBy{}
	for _, w := range t.seen {
		for _, g := range w.hb.Grants {
			if h, ok := out[g.Grant]; !ok || h.holder.LastHeartbeat.Before(w.last) {
				out[g.Grant] = heldBy{g.DTR, t.holder(w, now)}
			}
		}
	}
	return out
}

// holderOf returns who holds a grant, as holders would.
func (t *workerTracker) holderOf(grant string, now time.Time) (api.Holder, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forget(now)
	var found *seenWorker
	for _, w := range t.seen {
		if (found == nil || found.last.Before(w.last)) && w.holds[grant] {
			found = w
		}
	}
	if found == nil {
		return api.Holder{}, false
	}
	return t.holder(found, now), true
}

// list returns every worker heard from, by role, host, pid and stage,
// with the grants of its last heartbeat.
func (t *workerTracker) list(now time.Time) []api.Worker {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forget(now)
	out := make([]api.Worker, 0, len(t.seen))
	for _, w := range t.seen {
		hb := w.hb
		aw := api.Worker{ID: hb.Worker, Role: hb.Role, Stage: hb.Stage, Host: hb.Host, PID: hb.PID, Version: hb.Version,
			Started: hb.Started, Workers: hb.Workers, Grants: []api.WorkerGrant{}, LastHeartbeat: w.last, Silent: t.silent(w, now)}
		for _, g := range hb.Grants {
			aw.Grants = append(aw.Grants, api.WorkerGrant{DTR: g.DTR, Grant: g.Grant, State: g.State})
		}
		out = append(out, aw)
	}
	slices.SortFunc(out, func(a, b api.Worker) int {
		return cmp.Or(strings.Compare(a.Role, b.Role), strings.Compare(a.Host, b.Host), cmp.Compare(a.PID, b.PID),
			strings.Compare(string(a.Stage), string(b.Stage)), strings.Compare(a.ID, b.ID))
	})
	return out
}

// hearWorkers subscribes to the workers' heartbeats until the returned
// subscription is dropped.
func (s *Service) hearWorkers() (*nats.Subscription, error) {
	return s.nc.Subscribe(api.SubjectHeartbeatPrefix+">", func(m *nats.Msg) {
		var hb api.Heartbeat
		if _, err := codec.DecodeData(context.Background(), m, api.TypeHeartbeat, &hb); err != nil {
			s.log.Debug("heartbeat ignored", "subject", m.Subject, "err", err)
			return
		}
		if bad := s.workers.heard(hb, time.Now()); bad != "" {
			s.log.Warn("a worker's heartbeat names a host that is not a plain host name or address; its host is taken as unknown",
				"worker", hb.Worker, "host", quoteStart(bad))
		}
	})
}

// current keeps, of the grants a worker claims, those that the core still
// counts as running under that grant, with their states, and for a
// silent worker when their leases end. Run it in the loop.
func current(c *core.Core, now time.Time, w *api.Worker) {
	kept := w.Grants[:0]
	for _, g := range w.Grants {
		d, ok := c.Get(g.DTR)
		if !ok || d.Grant != g.Grant || !d.State.IsActive() {
			continue
		}
		g.State = d.State
		if w.Silent {
			g.LeaseEnds, _ = c.LeaseEnds(now, g.DTR)
			if g.LeaseEnds.After(w.LeaseEnds) {
				w.LeaseEnds = g.LeaseEnds
			}
		}
		kept = append(kept, g)
	}
	w.Grants = kept
}

func (s *Service) handleWorkers(r micro.Request) {
	c, ok := s.requester(r, api.SubjectWorkers, auth.ScopeRead)
	if !ok {
		return
	}
	if !c.Admin {
		_ = r.Error("403", fmt.Sprintf("%s: only operators and administrators may list the workers (%s is not one; see SLUICE_ADMINS)", auth.ErrForbidden, c), nil)
		return
	}
	now := time.Now()
	reply := api.WorkersReply{Workers: s.workers.list(now), HeartbeatSeconds: s.workers.every.Seconds()}
	s.query(func() {
		for i := range reply.Workers {
			current(s.core, now, &reply.Workers[i])
		}
	})
	_ = r.RespondJSON(reply)
}

// silentGrants returns the grants the core counts as running whose worker
// is silent, of the DTRs whose owner owns takes (nil: all), with their
// shares and when their leases end. Run it in the loop.
func silentGrants(c *core.Core, now time.Time, holders map[string]heldBy, owns func(dtr.Identity) bool) []api.SilentGrant {
	var out []api.SilentGrant
	for grant, hb := range holders {
		h, id := hb.holder, hb.dtr
		if !h.Silent {
			continue
		}
		d, ok := c.Get(id)
		if !ok || d.Grant != grant || !d.State.IsActive() || owns != nil && !owns(d.Owner) {
			continue
		}
		end, _ := c.LeaseEnds(now, id)
		h.LeaseEnds = end
		out = append(out, api.SilentGrant{DTR: id, Grant: grant, Share: d.Share, State: d.State, Holder: h, LeaseEnds: end})
	}
	slices.SortFunc(out, func(a, b api.SilentGrant) int {
		return cmp.Or(a.LeaseEnds.Compare(b.LeaseEnds), strings.Compare(a.Grant, b.Grant))
	})
	return out
}

// holderReason is what a DTR's reason adds about the worker that holds its
// grant.
func holderReason(h api.Holder) string {
	s := "held by " + h.String()
	if h.Silent {
		s += fmt.Sprintf("; its worker stopped heartbeating at %s", h.LastHeartbeat.UTC().Format(time.RFC3339))
		if !h.LeaseEnds.IsZero() {
			s += fmt.Sprintf("; the lease ends at %s, when the DTR is granted again", h.LeaseEnds.UTC().Format(time.RFC3339))
		}
	}
	return s
}
