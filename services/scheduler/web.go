package scheduler

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/tracing"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

//go:embed web
var webFiles embed.FS

// Handler serves the scheduler's live web page at / and its data:
// /api/overview (the Overview), /api/jobs (the generator's job list, asked
// over NATS), /api/dtr/{id} (one DTR's record and why it waits), /api/history/{id}
// (its history, history.go) and /api/links (the per-link optimizer's links, ?history=1 with their
// decisions, as sluice.api.links answers). No
// answer holds a credential: URLs and error texts are redacted.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(webFiles, "web")
	mux.Handle("GET /", http.FileServerFS(static))
	mux.HandleFunc("GET /api/overview", func(w http.ResponseWriter, r *http.Request) {
		ov := s.mon.overview()
		ov.Scheduler = s.roleNow(r.Context())
		writeJSON(w, http.StatusOK, ov)
	})
	jobs := &jobLister{nc: s.nc, timeout: jobListTimeout}
	mux.HandleFunc("GET /api/jobs", jobs.serve)
	mux.HandleFunc("GET /api/dtr/{id}", s.serveDTR)
	mux.HandleFunc("GET /api/links", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.links(r.URL.Query().Get("history") != ""))
	})
	mux.HandleFunc("GET /api/history/{id}", s.serveHistory)
	return mux
}

// writeJSON answers with v as JSON, never cached.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// webError is the answer of a web API request that failed.
type webError struct {
	Error string `json:"error"`
}

// jobListTimeout is how long the web page's job list waits for the
// generator.
const jobListTimeout = 3 * time.Second

// jobListFresh is how long a job list answer is served again to other
// requests for the same list: open pages cost the generator one bucket
// scan per list and period, however many they are.
const jobListFresh = 2 * time.Second

// WebJob is one job in /api/jobs: the generator's record without its
// files, its failure lines redacted.
type WebJob struct {
	ID        string    `json:"id"`
	Name      string    `json:"name,omitempty"`
	Owner     string    `json:"owner,omitempty"`
	State     string    `json:"state"`
	Total     int       `json:"total"`
	Done      int       `json:"done"`
	Failed    int       `json:"failed"`
	Cancelled int       `json:"cancelled"`
	Created   time.Time `json:"created"`
	Ended     time.Time `json:"ended,omitzero"`
	Failures  []string  `json:"failures,omitempty"`
}

// WebJobs is the answer of /api/jobs.
type WebJobs struct {
	Jobs []WebJob `json:"jobs"`
	More bool     `json:"more,omitempty"`
}

// jobLister asks the generator for job lists (sluice.api.job.list) on the
// scheduler's connection, as the operator.
type jobLister struct {
	nc      *nats.Conn
	timeout time.Duration
	mu      sync.Mutex
	cache   map[api.JobListRequest]jobListAnswer
}

type jobListAnswer struct {
	at   time.Time
	code int
	body any
}

// serve answers GET /api/jobs?state=running|finished|failed|ended&limit=n.
func (l *jobLister) serve(w http.ResponseWriter, r *http.Request) {
	req, err := jobListRequest(r.URL.Query())
	if err != nil {
		writeJSON(w, http.StatusBadRequest, webError{err.Error()})
		return
	}
	now := time.Now()
	l.mu.Lock()
	a, ok := l.cache[req]
	l.mu.Unlock()
	if !ok || now.Sub(a.at) > jobListFresh {
		a = jobListAnswer{at: now}
		a.code, a.body = l.ask(context.WithoutCancel(r.Context()), req)
		l.mu.Lock()
		if l.cache == nil {
			l.cache = map[api.JobListRequest]jobListAnswer{}
		}
		for k, old := range l.cache {
			if now.Sub(old.at) > jobListFresh {
				delete(l.cache, k)
			}
		}
		l.cache[req] = a
		l.mu.Unlock()
	}
	writeJSON(w, a.code, a.body)
}

// jobListRequest reads the query of /api/jobs.
func jobListRequest(q url.Values) (api.JobListRequest, error) {
	req := api.JobListRequest{State: q.Get("state")}
	switch req.State {
	case "", "ended", api.JobRunning, api.JobFinished, api.JobFailed:
	default:
		return req, fmt.Errorf("state %q is not running, finished, failed or ended", req.State)
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > api.MaxJobList {
			return req, fmt.Errorf("limit %q is not 1–%d", v, api.MaxJobList)
		}
		req.Limit = n
	}
	return req, nil
}

// ask sends req to the generator and returns the HTTP status and body of
// its answer: the jobs, or what went wrong in words for the page.
func (l *jobLister) ask(ctx context.Context, req api.JobListRequest) (int, any) {
	data, err := json.Marshal(req)
	if err != nil {
		return http.StatusInternalServerError, webError{err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	m, err := l.nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: api.SubjectJobList, Data: data})
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return http.StatusServiceUnavailable, webError{"no generator answers " + api.SubjectJobList + ": the job list is unknown (is a generator running?)"}
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
		return http.StatusGatewayTimeout, webError{fmt.Sprintf("no generator answered %s within %s: the job list is unknown", api.SubjectJobList, l.timeout)}
	case err != nil:
		return http.StatusBadGateway, webError{"asking the generator for the job list: " + dtr.RedactText(err.Error())}
	}
	if code := m.Header.Get("Nats-Service-Error-Code"); code != "" {
		return http.StatusBadGateway, webError{fmt.Sprintf("the generator refused the job list (%s): %s", code, dtr.RedactText(m.Header.Get("Nats-Service-Error")))}
	}
	var reply api.JobListReply
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		return http.StatusBadGateway, webError{"the generator's job list does not read: " + err.Error()}
	}
	out := WebJobs{Jobs: make([]WebJob, 0, len(reply.Jobs)), More: reply.More}
	for _, j := range reply.Jobs {
		wj := WebJob{ID: j.Job.ID, Name: dtr.RedactText(j.Job.Name), Owner: j.Job.Owner.DN, State: j.State, Total: j.Total,
			Done: j.Done, Failed: j.Failed, Cancelled: j.Cancelled, Created: j.Created, Ended: j.Ended}
		for _, f := range j.Failures {
			wj.Failures = append(wj.Failures, dtr.RedactText(f))
		}
		out.Jobs = append(out.Jobs, wj)
	}
	return http.StatusOK, out
}

// WebDTR is the answer of /api/dtr/{id}: the DTR's record (redacted) and,
// while the scheduler holds it, why it is where it is and the worker that
// holds its grant (as its heartbeats say); or, for a DTR that
// failed lately and whose record is gone, what the record of recent
// failures keeps of it. From says where it was found: "scheduler" (on its
// way), "journal" or "store" (the record of a final DTR), or "failures".
type WebDTR struct {
	DTR     *dtr.DTR       `json:"dtr,omitempty"`
	Why     *api.Why       `json:"why,omitempty"`
	Holder  *api.Holder    `json:"holder,omitempty"`
	Failure *FailureRecord `json:"failure,omitempty"`
	// TraceID is the DTR's trace, to look up in the tracing backend.
	TraceID string `json:"trace_id,omitempty"`
	From    string `json:"from"`
}

// serveDTR answers GET /api/dtr/{id}.
func (s *Service) serveDTR(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, webError{fmt.Sprintf("DTR id %q is not a UUID", r.PathValue("id"))})
		return
	}
	if !s.ready.Load() {
		writeJSON(w, http.StatusServiceUnavailable, webError{"the scheduler is not running now (starting, recovering or stopping); try again"})
		return
	}
	var out WebDTR
	if fr, ok := s.mon.failure(id); ok {
		out.Failure, out.From = &fr, "failures"
	}
	type found struct {
		d      dtr.DTR
		why    *api.Why
		holder *api.Holder
		from   string
	}
	ch := make(chan found, 1)
	go func() { // the loop answers between two steps; a stuck loop must not hold the page
		var f found
		f.d, f.why, f.holder, f.from = s.lookupDTR(context.WithoutCancel(r.Context()), id)
		ch <- f
	}()
	var f found
	select {
	case f = <-ch:
	case <-time.After(dtrLookupTimeout):
		writeJSON(w, http.StatusServiceUnavailable, webError{fmt.Sprintf("the scheduler did not look DTR %s up within %s (its loop is busy or stuck); try again", id, dtrLookupTimeout)})
		return
	}
	d, why, holder, from := f.d, f.why, f.holder, f.from
	if from != "" {
		rd := redactDTR(d)
		out.DTR, out.Why, out.Holder, out.From = &rd, why, holder, from
		out.TraceID = tracing.TraceID(d.TraceParent)
	}
	if out.From == "" {
		writeJSON(w, http.StatusNotFound, webError{fmt.Sprintf("DTR %s is not known to the scheduler: never submitted, or it ended and its record is gone (final records are kept for SLUICE_RETENTION), and it is not among the recent failures", id)})
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// dtrLookupTimeout is how long /api/dtr/{id} waits for the scheduler's
// loop and the DTR records.
const dtrLookupTimeout = 5 * time.Second

// redactDTR returns d fit to show: the credentials its URLs and error may
// carry are replaced by xxxxx.
func redactDTR(d dtr.DTR) dtr.DTR {
	d.Source, d.Destination = dtr.RedactURL(d.Source), dtr.RedactURL(d.Destination)
	d.TURL, d.CacheFile = dtr.RedactURL(d.TURL), dtr.RedactURL(d.CacheFile)
	if d.Replicas != nil {
		rs := make([]string, len(d.Replicas))
		for i, u := range d.Replicas {
			rs[i] = dtr.RedactURL(u)
		}
		d.Replicas = rs
	}
	if d.Error != nil {
		e := *d.Error
		e.Text = dtr.RedactText(e.Text)
		d.Error = &e
	}
	return d
}

// Role says what this scheduler is in the leader election now: "leader",
// "standby", or "" while it starts.
func (s *Service) Role() string {
	r, _ := s.role.Load().(string)
	return r
}

// roleNow says what this scheduler is in the election, and who leads.
func (s *Service) roleNow(ctx context.Context) SchedulerRole {
	r := SchedulerRole{Term: s.term.Load(), Role: s.Role(), Name: s.name}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	kv, err := s.js.KeyValue(ctx, bus.BucketLeader)
	if err != nil {
		return r
	}
	if l, ok, err := (&election{kv: kv}).current(ctx); err == nil && ok {
		r.Leader = &l
	}
	return r
}

// Ready reports whether the scheduler has recovered its DTRs, takes input
// and its loop comes round: a loop stuck for stallAfter (a store that never
// answers) is not ready.
func (s *Service) Ready() bool {
	return s.ready.Load() && time.Since(time.Unix(0, s.looped.Load())) < stallAfter
}

// stallAfter is how long the scheduling loop may take over one round, which
// the tick keeps near 50 ms.
const stallAfter = 30 * time.Second
