package generator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/auth"
)

// decodeJobListRequest reads a sluice.api.job.list request strictly.
func decodeJobListRequest(data []byte) (api.JobListRequest, error) {
	var req api.JobListRequest
	if len(bytes.TrimSpace(data)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return req, fmt.Errorf("job list request: %w", err)
		}
		if dec.More() {
			return req, fmt.Errorf("job list request: data after the JSON object")
		}
	}
	switch req.State {
	case "", "ended", api.JobRunning, api.JobFinished, api.JobFailed:
	default:
		return req, fmt.Errorf("job list request: state %q is not running, finished, failed or ended", req.State)
	}
	if req.Limit < 0 || req.Limit > api.MaxJobList {
		return req, fmt.Errorf("job list request: limit %d is not 0–%d", req.Limit, api.MaxJobList)
	}
	if req.Limit == 0 {
		req.Limit = api.DefaultJobList
	}
	return req, nil
}

func (s *Service) handleList(ctx context.Context, r micro.Request) {
	c, err := s.cfg.Callers.Caller(ctx, api.SubjectJobList, r.Subject(), nats.Header(r.Headers()))
	if err == nil {
		err = c.Allow(auth.ScopeRead)
	}
	if err != nil {
		_ = r.Error("403", err.Error(), nil)
		return
	}
	req, err := decodeJobListRequest(r.Data())
	if err != nil {
		_ = r.Error("400", err.Error(), nil)
		return
	}
	reply, err := s.List(ctx, c, req)
	if err != nil {
		text := "the job records cannot be read now; try again"
		if c.Admin {
			text = err.Error()
		}
		_ = r.Error("503", text, nil)
		return
	}
	b, err := fitJobList(reply, s.eventLimit())
	if err != nil {
		_ = r.Error("500", err.Error(), nil)
		return
	}
	_ = r.Respond(b)
}

// fitJobList encodes reply in at most limit bytes (a message): the latest
// jobs that fit, with More set when some were left out.
func fitJobList(reply api.JobListReply, limit int) ([]byte, error) {
	for {
		b, err := json.Marshal(reply)
		if err != nil || len(b) <= limit || len(reply.Jobs) == 0 {
			return b, err
		}
		reply.Jobs, reply.More = reply.Jobs[:len(reply.Jobs)*limit/len(b)*9/10], true
	}
}

// List returns the records of the jobs req asks for that caller c may see
// (an administrator every job, anyone else their own), the latest first.
// It reads every job record in the bucket once: a list costs about as much
// as the jobs kept (SLUICE_RETENTION bounds them).
func (s *Service) List(ctx context.Context, c auth.Caller, req api.JobListRequest) (api.JobListReply, error) {
	reply := api.JobListReply{Jobs: []api.JobRecord{}}
	w, err := s.kv.WatchFiltered(ctx, []string{"*"}, jetstream.IgnoreDeletes())
	if err != nil {
		return reply, fmt.Errorf("list jobs: %w", err)
	}
	defer func() { _ = w.Stop() }()
	var all []api.JobRecord
	for {
		var e jetstream.KeyValueEntry
		select {
		case <-ctx.Done():
			return reply, ctx.Err()
		case e = <-w.Updates():
		}
		if e == nil {
			break
		}
		var rec Record
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			continue // not a job record
		}
		if !wanted(rec.State, req.State) || !c.Owns(rec.Job.Owner) {
			continue
		}
		all = append(all, rec.JobRecord)
	}
	slices.SortFunc(all, func(a, b api.JobRecord) int {
		if c := b.Created.Compare(a.Created); c != 0 {
			return c
		}
		return strings.Compare(a.Job.ID, b.Job.ID)
	})
	if len(all) > req.Limit {
		all, reply.More = all[:req.Limit], true
	}
	for i := range all {
		all[i].Failures = firstFailures(all[i].Failures)
	}
	reply.Jobs = append(reply.Jobs, all...)
	return reply, nil
}

// firstFailures keeps a job's first three failure lines in a list.
func firstFailures(f []string) []string {
	return f[:min(len(f), 3)]
}

func wanted(state, asked string) bool {
	switch asked {
	case "":
		return true
	case "ended":
		return state == api.JobFinished || state == api.JobFailed
	}
	return state == asked
}
