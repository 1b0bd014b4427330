package scheduler

// The scheduler's request/reply endpoints (sluice.api.*): priority, cancel,
// reconfigure, shares, one DTR's record, and the workers (workers.go).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/bus/tracing"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/version"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// api is the scheduler's request/reply endpoints, served on a connection
// of their own, closed when they stop: closing removes them from the
// server at once, where a service stopped while the connection is down
// would be subscribed again when it comes back.
type apiService struct {
	nc *nats.Conn
}

// Stop stops serving.
func (a *apiService) Stop() { a.nc.Close() }

// addAPI serves the scheduler's request/reply endpoints as a micro
// service, on a connection of its own made with the scheduler's options.
func (s *Service) addAPI() (*apiService, error) {
	nc, err := s.nc.Opts.Connect()
	if err != nil {
		return nil, fmt.Errorf("scheduler API: %w", err)
	}
	svc, err := micro.AddService(nc, micro.Config{Name: "sluice-scheduler", Version: version.SemVer(),
		Description: "Sluice scheduler: shares and DTRs"})
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("scheduler API: %w", err)
	}
	for _, e := range []struct {
		name, base string
		h          micro.HandlerFunc
	}{
		{"shares", api.SubjectShares, s.handleShares},
		{"dtr", api.SubjectDTR, s.handleDTR},
		{"retrying", api.SubjectRetrying, s.handleRetrying},
		{"priority", api.SubjectPriority, s.handlePriority},
		{"cancel", api.SubjectCancel, s.handleCancel},
		{"reconfigure", api.SubjectReconfigure, s.handleReconfigure},
		{"workers", api.SubjectWorkers, s.handleWorkers},
		{"links", api.SubjectLinks, s.handleLinks},
		{"history", api.SubjectHistory, s.handleHistory},
	} {
		// The operator's subject, and every user's own (pkg/auth).
		if err := svc.AddEndpoint(e.name, e.h, micro.WithEndpointSubject(e.base)); err != nil {
			nc.Close()
			return nil, err
		}
		if err := svc.AddEndpoint(e.name+"-user", e.h, micro.WithEndpointSubject(e.base+".*")); err != nil {
			nc.Close()
			return nil, err
		}
	}
	return &apiService{nc: nc}, nil
}

// decodeRequest reads a control request strictly: unknown fields and
// trailing data are errors that name themselves.
func decodeRequest(data []byte, v any) error {
	if err := decodeStrict(data, v); err != nil {
		return fmt.Errorf("malformed request: %w", err)
	}
	return nil
}

// decodeStrict reads one JSON object into v: anything but an object (null
// included), unknown fields and anything after the object are errors that
// name themselves.
func decodeStrict(data []byte, v any) error {
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && t[0] != '{' && json.Valid(t) {
		return fmt.Errorf("%s is not a JSON object", describeJSON(t))
	}
	return codec.DecodeJSONStrict(data, v)
}

// describeJSON names the kind of a valid JSON value that is not an object.
func describeJSON(v []byte) string {
	switch v[0] {
	case 'n':
		return "null"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	}
	return "a number"
}

// respondErr answers a control request with an error: 404 for an unknown
// DTR or job, 400 for everything else.
func respondErr(r micro.Request, err error) {
	code := "400"
	if errors.Is(err, core.ErrUnknownDTR) || errors.Is(err, core.ErrUnknownJob) {
		code = "404"
	}
	_ = r.Error(code, err.Error(), nil)
}

// decodePriorityRequest reads a sluice.api.priority request: a DTR id and
// a priority 1–100.
func decodePriorityRequest(data []byte) (api.PriorityRequest, error) {
	var req api.PriorityRequest
	if err := decodeRequest(data, &req); err != nil {
		return req, err
	}
	var errs []error
	if req.DTR == uuid.Nil {
		errs = append(errs, errors.New("dtr is missing"))
	}
	if req.Priority < 1 || req.Priority > 100 {
		errs = append(errs, fmt.Errorf("priority %d is outside 1–100", req.Priority))
	}
	return req, errors.Join(errs...)
}

// errNotYours refuses a request about a DTR or job of another owner.
var errNotYours = errors.New("not yours")

func (s *Service) handlePriority(r micro.Request) {
	c, ok := s.requester(r, api.SubjectPriority, auth.ScopeModify)
	if !ok {
		return
	}
	req, err := decodePriorityRequest(r.Data())
	if err != nil {
		respondErr(r, err)
		return
	}
	var d dtr.DTR
	if cerr := s.change(func() {
		if cur, ok := s.core.Get(req.DTR); ok && !c.Owns(cur.Owner) {
			err = errNotYours
			return
		}
		if err = s.core.SetPriority(time.Now(), req.DTR, req.Priority); err == nil {
			d, _ = s.core.Get(req.DTR)
		}
	}); cerr != nil {
		_ = r.Error("503", cerr.Error(), nil)
		return
	}
	if errors.Is(err, errNotYours) || errors.Is(err, core.ErrUnknownDTR) {
		unknown(r, c, "DTR "+req.DTR.String()+" (or it has finished)")
		return
	}
	if err != nil {
		respondErr(r, err)
		return
	}
	s.log.Info("priority changed", "dtr", req.DTR, "priority", req.Priority, "by", c.String())
	_ = r.RespondJSON(api.DTRReply{DTR: d})
}

// decodeCancelRequest reads a sluice.api.cancel request: either a DTR id
// or a job id.
func decodeCancelRequest(data []byte) (api.CancelRequest, error) {
	var req api.CancelRequest
	if err := decodeRequest(data, &req); err != nil {
		return req, err
	}
	if (req.DTR == uuid.Nil) == (req.Job == "") {
		return req, errors.New("name either a dtr or a job to cancel")
	}
	return req, nil
}

func (s *Service) handleCancel(r micro.Request) {
	c, ok := s.requester(r, api.SubjectCancel, auth.ScopeCancel)
	if !ok {
		return
	}
	req, err := decodeCancelRequest(r.Data())
	if err != nil {
		respondErr(r, err)
		return
	}
	var n int
	cerr := s.change(func() {
		now := time.Now()
		if req.Job != "" {
			n, err = s.core.CancelJob(now, req.Job, c.Owns) // only the caller's DTRs of the job
			return
		}
		cur, ok := s.core.Get(req.DTR)
		switch {
		case !ok:
			err = fmt.Errorf("%w: %s", core.ErrUnknownDTR, req.DTR)
		case !c.Owns(cur.Owner):
			err = errNotYours
		default:
			n, err = 1, s.core.Cancel(now, req.DTR)
		}
	})
	if cerr != nil {
		_ = r.Error("503", cerr.Error(), nil)
		return
	}
	if errors.Is(err, errNotYours) || errors.Is(err, core.ErrUnknownDTR) || errors.Is(err, core.ErrUnknownJob) {
		what := "DTR " + req.DTR.String() + " (or it has finished)"
		if req.Job != "" {
			what = fmt.Sprintf("job %q (or every DTR of it has finished)", req.Job)
		}
		unknown(r, c, what)
		return
	}
	if err != nil {
		respondErr(r, err)
		return
	}
	s.log.Info("cancelled", "dtr", req.DTR, "job", req.Job, "dtrs", n, "by", c.String())
	_ = r.RespondJSON(api.CancelReply{Cancelled: n})
}

// decodeReconfigureRequest reads a sluice.api.reconfigure request: share
// names, none empty, with priorities 1–100.
func decodeReconfigureRequest(data []byte) (api.ReconfigureRequest, error) {
	var req api.ReconfigureRequest
	if err := decodeRequest(data, &req); err != nil {
		return req, err
	}
	if req.SharePriority == nil {
		return req, errors.New("sharepriority is missing")
	}
	var errs []error
	for _, share := range slices.Sorted(maps.Keys(req.SharePriority)) {
		if p := req.SharePriority[share]; p < 1 || p > 100 {
			errs = append(errs, fmt.Errorf("share %q: priority %d is outside 1–100", share, p))
		}
		if share == "" {
			errs = append(errs, errors.New("a share name is empty"))
		}
	}
	return req, errors.Join(errs...)
}

func (s *Service) handleReconfigure(r micro.Request) {
	c, ok := s.requester(r, api.SubjectReconfigure, auth.ScopeModify)
	if !ok {
		return
	}
	if !c.Admin {
		_ = r.Error("403", fmt.Sprintf("%s: only administrators may reconfigure shares (%s is not one; see SLUICE_ADMINS)", auth.ErrForbidden, c), nil)
		return
	}
	req, err := decodeReconfigureRequest(r.Data())
	if err != nil {
		respondErr(r, err)
		return
	}
	if cerr := s.change(func() { err = s.core.SetSharePriorities(time.Now(), req.SharePriority) }); cerr != nil {
		_ = r.Error("503", cerr.Error(), nil)
		return
	}
	if err != nil {
		respondErr(r, err)
		return
	}
	s.log.Info("share priorities reconfigured", "sharepriority", req.SharePriority, "by", c.String())
	reply := s.shares(c)
	reply.Warnings = unknownShares(req.SharePriority, reply, s.cfg.SharePolicy)
	for _, w := range reply.Warnings {
		s.log.Warn("reconfigure: "+w, "by", c.String())
	}
	_ = r.RespondJSON(reply)
}

// unknownShares says which of the shares given priorities have no DTR
// queued, running or waiting for a retry, and, where the share policy
// makes every DTR's share _default, that none will ever come.
func unknownShares(prios map[string]int, now api.SharesReply, policy string) []string {
	known := map[string]bool{}
	sp, _ := core.ParseSharePolicy(policy)
	add := func(share string) {
		known[share] = true
		known[strings.TrimSuffix(strings.TrimSuffix(share, "-download"), "-upload")] = true
		// "atlas" sets the priority of "atlas#Production Input".
		if id, _, ok := sp.SplitShare(share); ok && id != "" {
			known[id] = true
		}
	}
	for _, st := range now.Shares {
		add(st.Share)
	}
	for share := range now.Retrying {
		add(share)
	}
	var warnings []string
	for _, share := range slices.Sorted(maps.Keys(prios)) {
		switch {
		case known[share]:
		case policy == "":
			warnings = append(warnings, fmt.Sprintf("share %q has no DTRs and will get none: SLUICE_SHAREPOLICY is not set, so every DTR is in the share _default (set it to dn, voms:vo, voms:group or voms:role)", share))
		default:
			warnings = append(warnings, fmt.Sprintf("share %q has no DTRs queued, running or waiting now: its priority applies once it has some (is the name right? the share policy is %s)", share, policy))
		}
	}
	return warnings
}

func (s *Service) handleShares(r micro.Request) {
	c, ok := s.requester(r, api.SubjectShares, auth.ScopeRead)
	if !ok {
		return
	}
	s.respondShares(r, c)
}

// respondShares answers with every share's state and the limits, and the
// grants of silent workers: every one to an administrator, the caller's
// own to anyone else.
func (s *Service) respondShares(r micro.Request, c auth.Caller) {
	_ = r.RespondJSON(s.shares(c))
}

// shares is every share's state, the limits, and the grants of silent
// workers that c may see.
func (s *Service) shares(c auth.Caller) api.SharesReply {
	var reply api.SharesReply
	now := time.Now()
	holders := s.workers.holders(now)
	s.query(func() {
		reply.Silent = silentGrants(s.core, now, holders, c.Owns)
		reply.Stuck = s.stuck.list(c.Owns)
		var stats []core.ShareStats
		stats, reply.Retrying = s.core.Shares()
		for _, st := range stats {
			reply.Shares = append(reply.Shares, api.ShareStats(st))
		}
		for _, u := range s.core.ActivityLimits() {
			reply.ActivityLimits = append(reply.ActivityLimits, api.ActivityLimitUse{Activity: u.Activity, Source: u.Source,
				Destination: u.Destination, Max: u.Max, Running: u.Running})
		}
		reply.Reading = s.core.Loading()
		reply.Limits = map[string]int{"maxprocessor": s.cfg.MaxProcessor, "maxdelivery": s.cfg.MaxDelivery, "maxemergency": s.cfg.MaxEmergency, "maxprepared": s.cfg.MaxPrepared, "maxperhost": s.cfg.MaxPerHost}
	})
	return reply
}

func (s *Service) handleDTR(r micro.Request) {
	c, ok := s.requester(r, api.SubjectDTR, auth.ScopeRead)
	if !ok {
		return
	}
	id, err := uuid.Parse(strings.TrimSpace(string(r.Data())))
	if err != nil {
		_ = r.Error("400", fmt.Sprintf("DTR id %q is not a UUID", r.Data()), nil)
		return
	}
	d, why, holder, from := s.lookupDTR(context.Background(), id)
	if from == "" || !c.Owns(d.Owner) {
		unknown(r, c, "DTR "+id.String())
		return
	}
	_ = r.RespondJSON(api.DTRReply{DTR: d, Why: why, Holder: holder, TraceID: tracing.TraceID(d.TraceParent)})
}

// Where lookupDTR found a DTR's record.
const (
	heldCore    = "scheduler" // the core holds it: it is on its way
	heldJournal = "journal"   // changed since the last checkpoint
	heldStore   = "store"     // the bucket sluice_dtrs
)

// lookupDTR returns DTR id's record and, while the core holds it, why it
// is where it is and the worker that holds its grant (if heard of); from
// says where it was found, empty if nowhere (never seen, or final and its
// record gone).
func (s *Service) lookupDTR(ctx context.Context, id uuid.UUID) (d dtr.DTR, why *api.Why, holder *api.Holder, from string) {
	var ok bool
	now := time.Now()
	s.query(func() {
		if d, ok = s.core.Get(id); ok {
			if w, err := s.core.Explain(now, id); err == nil {
				aw := api.Why(w)
				why = &aw
			}
			if !d.State.IsActive() {
				return
			}
			if h, held := s.workers.holderOf(d.Grant, now); held {
				holder = &h
				if holder.Silent {
					holder.LeaseEnds, _ = s.core.LeaseEnds(now, id)
				}
			}
		}
	})
	if ok {
		if why != nil && holder != nil {
			why.Reason += "; " + holderReason(*holder)
		}
		return d, why, holder, heldCore
	}
	if b, found := s.journal.Lookup(id); found && json.Unmarshal(b, &d) == nil {
		return d, nil, nil, heldJournal
	}
	kv, err := s.js.KeyValue(ctx, bus.BucketDTRs)
	if err == nil {
		if e, err := kv.Get(ctx, id.String()); err == nil && json.Unmarshal(e.Value(), &d) == nil {
			return d, nil, nil, heldStore
		}
	}
	return dtr.DTR{}, nil, nil, ""
}

func (s *Service) handleRetrying(r micro.Request) {
	c, ok := s.requester(r, api.SubjectRetrying, auth.ScopeRead)
	if !ok {
		return
	}
	job := strings.TrimSpace(string(r.Data()))
	if !dtr.ValidJobID(job) {
		_ = r.Error("400", fmt.Sprintf("job id %q is not 1–64 characters of A–Z, a–z, 0–9, '_', '-'", job), nil)
		return
	}
	reply := api.RetryingReply{DTRs: []dtr.DTR{}}
	s.query(func() {
		for _, d := range s.core.Retrying(job) {
			if c.Owns(d.Owner) {
				reply.DTRs = append(reply.DTRs, d)
			}
		}
	})
	_ = r.RespondJSON(reply)
}

// query runs f in the scheduling loop, which owns the core.
func (s *Service) query(f func()) { _ = s.inLoop(f, false) }

// change runs f in the scheduling loop and returns once what f changed is
// stored, or an error if the scheduler stopped first or could not store it.
func (s *Service) change(f func()) error { return s.inLoop(f, true) }

// loopRequest is a query or change that the scheduling loop runs for an
// API request.
type loopRequest struct {
	f      func()
	change bool
	done   chan struct{}
	err    error
}

// answerAside answers a request that reaches the loop while it cannot act
// on changes (a committer busy with earlier steps, or a standby): one that
// changes nothing runs at once; a change is refused with errStoreFull while
// the store is full, else with refusal, or parked (refusal nil) to be
// answered once the loop can act on it.
func (s *Service) answerAside(q *loopRequest, refusal error) {
	switch full, _, _ := bus.SpaceOf(s.nc).Full(); {
	case !q.change:
		q.f()
	case full:
		q.err = errStoreFull
	case refusal == nil:
		s.parked = append(s.parked, q)
		return
	default:
		q.err = refusal
	}
	close(q.done)
}

// errStopped answers requests that reach a scheduler on its way out.
var errStopped = errors.New("the scheduler is stopping; try again")

func (s *Service) inLoop(f func(), change bool) error {
	q := &loopRequest{f: f, change: change, done: make(chan struct{})}
	select {
	case s.queries <- q:
		<-q.done
		return q.err
	case <-s.stopped:
		return errStopped
	}
}
