package generator

// The FTS3 REST API: the subset of fts-rest that Rucio and DIRAC use to
// submit, follow and cancel transfers, so that they can use Sluice
// unchanged. Routes (schemas/fts3-openapi.json describes them):
//
//	POST   /jobs                submit a job (fts-rest's JSON)
//	GET    /jobs/<id>[,<id>...] one job, or several (as Rucio polls them);
//	                            ?files=<field>,... adds its files
//	GET    /jobs/<id>/files     a job's files
//	POST   /jobs/<id>           change its priority ({"params": {"priority": 4}})
//	DELETE /jobs/<id>[,<id>...] cancel
//	GET    /whoami              the caller, as the token names it
//	GET    /                    the API's version, as FTS3's client asks
//
// A bearer token is the only way in: it is checked as the NATS API checks
// one (the same issuers, audience and scopes), and its holder sees only
// its own jobs, as on the NATS API.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/token"
)

// ftsBytesPerFile is what the body of a submission may take per file the
// job may have (SLUICE_GENERATOR_MAX_FILES): a Rucio file, with long URLs,
// its metadata and two storage tokens, takes 2–3 KiB.
const ftsBytesPerFile = 5 << 10

// maxFTSBody bounds the body of a submission of jobs of at most maxFiles
// files: 10 MiB for the default 2,000.
func maxFTSBody(maxFiles int) int64 { return int64(maxFiles)*ftsBytesPerFile + 64<<10 }

// ftsBodyWait bounds how long the body of a submission may take to arrive,
// so that a slow sender does not hold one of the API's slots.
const ftsBodyWait = 30 * time.Second

// ftsRetryAfter is what an answer 503 tells a client to wait, in seconds,
// when every slot of the API is taken.
const ftsRetryAfter = "2"

// ftsWait bounds how long a request waits for the generator to start and
// for a token's issuer to answer.
const ftsWait = 10 * time.Second

// ftsSubmitWait bounds a submission once its caller is known: its body
// read, its records stored and its DTRs sent. It has a clock of its own, so
// that a slow token check does not cut it short.
const ftsSubmitWait = time.Minute

// ftsReadWait bounds any other request once its caller is known.
const ftsReadWait = 30 * time.Second

// ftsRoutes are the routes the FTS3 API serves, method and pattern; the
// OpenAPI document is held to them by a test.
var ftsRoutes = []struct {
	method, pattern string
	handle          func(*ftsAPI, http.ResponseWriter, *http.Request, auth.Caller)
	wait            time.Duration // the handler's deadline
}{
	{http.MethodPost, "/jobs", (*ftsAPI).submit, ftsSubmitWait},
	{http.MethodGet, "/jobs/{ids}", (*ftsAPI).jobs, ftsReadWait},
	{http.MethodGet, "/jobs/{id}/files", (*ftsAPI).files, ftsReadWait},
	{http.MethodPost, "/jobs/{ids}", (*ftsAPI).modify, ftsReadWait},
	{http.MethodDelete, "/jobs/{ids}", (*ftsAPI).cancel, ftsReadWait},
	{http.MethodGet, "/whoami", (*ftsAPI).whoami, ftsReadWait},
	{http.MethodGet, "/{$}", (*ftsAPI).version, ftsReadWait},
}

// ftsAPI serves the FTS3 API of a generator.
type ftsAPI struct {
	s *Service
	// slots holds one token per request being served: when it is full
	// the API answers 503 (SLUICE_GENERATOR_FTS_MAX_REQUESTS).
	slots chan struct{}
}

// FTSHandler returns the FTS3 REST API of the generator. It answers 503
// until Run has started, and while it serves as many requests as it may.
func (s *Service) FTSHandler() http.Handler {
	a := &ftsAPI{s: s, slots: make(chan struct{}, s.cfg.FTSMaxRequests)}
	mux := http.NewServeMux()
	for _, r := range ftsRoutes {
		mux.HandleFunc(r.method+" "+r.pattern, func(w http.ResponseWriter, req *http.Request) {
			a.serve(w, req, r.handle, r.wait)
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		ftsError(w, http.StatusNotFound, fmt.Sprintf("%s %s is not part of the FTS3 API that Sluice serves", r.Method, r.URL.Path))
	})
	// FTS3's Python client joins its endpoint and paths with a slash of
	// its own, so that its requests are for //jobs, //whoami and //: taken
	// as /jobs, /whoami and /, not redirected (a redirected POST would be
	// lost).
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "//") {
			r2 := *r
			u := *r.URL
			u.Path, u.RawPath = squeezeSlashes(u.Path), ""
			r2.URL = &u
			r = &r2
		}
		mux.ServeHTTP(w, r)
	})
}

// squeezeSlashes replaces each run of slashes in a path with one.
func squeezeSlashes(p string) string {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] == '/' && i > 0 && p[i-1] == '/' {
			continue
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

// serve establishes the caller from its bearer token and waits for the
// generator to be running before handing the request on.
func (a *ftsAPI) serve(w http.ResponseWriter, r *http.Request, h func(*ftsAPI, http.ResponseWriter, *http.Request, auth.Caller), wait time.Duration) {
	ctx, cancel := context.WithTimeout(r.Context(), ftsWait)
	defer cancel()
	c, err := a.s.cfg.Callers.TokenCaller(ctx, r.Header.Get("Authorization"))
	switch {
	case errors.Is(err, auth.ErrNoToken):
		w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
		ftsError(w, http.StatusUnauthorized, err.Error())
		return
	case errors.Is(err, token.ErrUnreachable):
		// The token may well be good: its issuer cannot be asked now.
		ftsError(w, http.StatusServiceUnavailable, err.Error())
		return
	case err != nil:
		ftsError(w, http.StatusForbidden, err.Error())
		return
	}
	// A slot is taken once the caller is known, so that only token
	// holders can take them; the work that costs (a body decoded, the
	// records read) is done in one.
	select {
	case a.slots <- struct{}{}:
		defer func() { <-a.slots }()
	default:
		w.Header().Set("Retry-After", ftsRetryAfter)
		ftsError(w, http.StatusServiceUnavailable, fmt.Sprintf("the FTS3 API is serving as many requests as it may (%d, SLUICE_GENERATOR_FTS_MAX_REQUESTS); try again", cap(a.slots)))
		return
	}
	select {
	case <-a.s.started:
	case <-ctx.Done():
		ftsError(w, http.StatusServiceUnavailable, "the generator is starting; try again")
		return
	}
	hctx, hcancel := context.WithTimeout(r.Context(), wait)
	defer hcancel()
	h(a, w, r.WithContext(hctx), c)
}

// ftsError answers with fts-rest's error body: {"status": "403 Forbidden",
// "message": "..."}.
func ftsError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"status": httpStatus(code), "message": msg})
}

// httpStatus is "404 Not Found", as fts-rest writes a status; a job's
// http_status of 200 is "200 Ok", exactly, which Rucio compares.
func httpStatus(code int) string {
	if code == http.StatusOK {
		return "200 Ok"
	}
	return fmt.Sprintf("%d %s", code, http.StatusText(code))
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"status":"500 Internal Server Error","message":"the answer could not be encoded"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// ftsSubmitReply is the answer of POST /jobs.
type ftsSubmitReply struct {
	JobID string `json:"job_id"`
	// Warnings name what was given but is not used.
	Warnings []string `json:"warnings,omitempty"`
}

func (a *ftsAPI) submit(w http.ResponseWriter, r *http.Request, c auth.Caller) {
	if err := c.Allow(auth.ScopeCreate); err != nil {
		ftsError(w, http.StatusForbidden, err.Error())
		return
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(ftsBodyWait))
	limit := maxFTSBody(a.s.cfg.MaxFiles)
	sub, err := readFTSSubmission(http.MaxBytesReader(w, r.Body, limit), a.s.cfg.MaxFiles, c, time.Now().UTC())
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		ftsError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes, the most for a job of at most %d files (SLUICE_GENERATOR_MAX_FILES)", limit, a.s.cfg.MaxFiles))
		return
	case errors.Is(err, errTooManyFiles):
		ftsError(w, http.StatusRequestEntityTooLarge, err.Error())
		return
	case err != nil:
		ftsError(w, http.StatusBadRequest, oneLine(err))
		return
	}
	sidecar, err := json.Marshal(sub.rec)
	if err != nil {
		ftsError(w, http.StatusInternalServerError, err.Error())
		return
	}
	// The job's transfers reach storage with the caller's rights: its
	// token goes with the DTRs, exchanged for storage tokens at each
	// transfer (docs/security.md, "Whose rights storage sees").
	ctx := WithSubjectToken(r.Context(), auth.Bearer(nats.Header{"Authorization": r.Header.Values("Authorization")}))
	reply, err := a.s.submit(ctx, c, sub.job, sidecar)
	var full *fullError
	var unavailable *unavailableError
	switch {
	case errors.As(err, &full):
		ftsError(w, http.StatusServiceUnavailable, full.text)
		return
	case errors.As(err, &unavailable) || errors.Is(err, context.DeadlineExceeded):
		// Nothing of the job was kept (an FTS3 job is taken whole or not
		// at all): the client may submit it again.
		a.s.log.Error("FTS3 API: a job could not be taken", "caller", c.String(), "err", err)
		w.Header().Set("Retry-After", ftsRetryAfter)
		ftsError(w, http.StatusServiceUnavailable, "the job could not be taken now, and nothing of it was kept; try again")
		return
	case errors.Is(err, ErrOwnerLimit):
		w.Header().Set("Retry-After", "60")
		ftsError(w, http.StatusTooManyRequests, "job refused: "+oneLine(err))
		return
	case errors.Is(err, auth.ErrForbidden):
		ftsError(w, http.StatusForbidden, "job refused: "+oneLine(err))
		return
	case err != nil:
		// The job's files are its outputs, in the order given: its
		// errors name them as the submission did.
		ftsError(w, http.StatusBadRequest, "job refused: "+strings.ReplaceAll(oneLine(err), "outputs[", "files["))
		return
	}
	if len(sub.warnings) > 0 {
		a.s.log.Warn("FTS3 job submitted with what Sluice ignores", "job", reply.JobID, "caller", c.String(), "ignored", sub.warnings)
	}
	writeJSON(w, http.StatusOK, ftsSubmitReply{JobID: reply.JobID, Warnings: sub.warnings})
}

// ftsJob is what Sluice knows of a job submitted over the FTS3 API: its
// record, what was kept of the submission, its final DTRs and the live
// records of the others.
type ftsJob struct {
	rec    Record
	fts    ftsRecord
	refs   []api.FileRef
	finals map[uuid.UUID]*dtr.DTR
	live   map[uuid.UUID]*dtr.DTR
}

// errNotYours answers a job id that is unknown, not the caller's, or not
// submitted over the FTS3 API: the same answer, so that no one learns
// what others have.
var errNotYours = errors.New("unknown job, or not yours")

// load reads a job for c, its unfinished files' live state within what
// reads allows.
func (a *ftsAPI) load(ctx context.Context, c auth.Caller, id string, reads *ftsReads) (*ftsJob, error) {
	if !dtr.ValidJobID(id) {
		return nil, errNotYours
	}
	j := &ftsJob{}
	if _, err := a.s.get(ctx, id, &j.rec); errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, errNotYours
	} else if err != nil {
		return nil, err
	}
	if !c.Owns(j.rec.Job.Owner) {
		return nil, errNotYours
	}
	if _, err := a.s.get(ctx, id+ftsSuffix, &j.fts); errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, errNotYours // a job submitted otherwise
	} else if err != nil {
		return nil, err
	}
	if _, err := a.s.get(ctx, id+".files", &j.refs); err != nil {
		return nil, err
	}
	var err error
	if j.finals, err = a.s.finals(ctx, id); err != nil {
		return nil, err
	}
	j.live = reads.live(ctx, a.s, j.refs, j.finals)
	return j, nil
}

// maxLiveReads bounds the scheduler's DTR records one request reads for
// the live state of unfinished files, over all the jobs it names: past it,
// files show the last state Sluice keeps of them (their end if they ended,
// SUBMITTED if not).
const maxLiveReads = 500

// ftsReads is what one request reads of the scheduler's DTR records: the
// bucket, looked up once, and how many records it may still read.
type ftsReads struct {
	dtrs   jetstream.KeyValue
	looked bool
	left   int
}

func newFTSReads() *ftsReads { return &ftsReads{left: maxLiveReads} }

// live reads the scheduler's records of a job's unfinished DTRs (the
// sluice_dtrs bucket) for their live state. It is a best effort: a record
// not found, not readable or past the budget leaves its file SUBMITTED.
func (r *ftsReads) live(ctx context.Context, s *Service, refs []api.FileRef, finals map[uuid.UUID]*dtr.DTR) map[uuid.UUID]*dtr.DTR {
	out := map[uuid.UUID]*dtr.DTR{}
	if len(refs) == len(finals) || r.left <= 0 {
		return out
	}
	if !r.looked {
		r.looked = true
		kv, err := s.js.KeyValue(ctx, bus.BucketDTRs)
		if err != nil {
			s.log.Warn("FTS3 API: the scheduler's DTR records cannot be read; unfinished files show SUBMITTED", "err", err)
		}
		r.dtrs = kv
	}
	if r.dtrs == nil {
		return out
	}
	for _, ref := range refs {
		if _, final := finals[ref.DTR]; final {
			continue
		}
		if r.left <= 0 {
			break
		}
		r.left--
		if e, err := r.dtrs.Get(ctx, ref.DTR.String()); err == nil {
			d := &dtr.DTR{}
			if codec.DecodeJSON(e.Value(), d) == nil {
				out[ref.DTR] = d
			}
		}
	}
	return out
}

// maxJobsAsked bounds the jobs one request may name: Rucio's poller asks
// for 100 at a time by default. Each job named costs reads of its records
// and a pass over its final DTRs.
const maxJobsAsked = 200

// ids splits a path's comma-separated job ids.
func ids(r *http.Request, name string) []string {
	var out []string
	for id := range strings.SplitSeq(r.PathValue(name), ",") {
		if id = strings.TrimSpace(id); id != "" {
			out = append(out, id)
		}
	}
	return out
}

func (a *ftsAPI) jobs(w http.ResponseWriter, r *http.Request, c auth.Caller) {
	if err := c.Allow(auth.ScopeRead); err != nil {
		ftsError(w, http.StatusForbidden, err.Error())
		return
	}
	var fields []string
	if f := r.URL.Query().Get("files"); f != "" {
		fields = strings.Split(f, ",")
		for _, name := range fields {
			if !slices.Contains(ftsFileFieldNames, name) {
				ftsError(w, http.StatusBadRequest, fmt.Sprintf("files: %q is not a file field (%s)", name, strings.Join(ftsFileFieldNames, ", ")))
				return
			}
		}
	}
	a.each(w, r, c, func(j *ftsJob) (map[string]any, error) {
		v := j.view()
		if fields != nil {
			files := []map[string]any{}
			for _, f := range j.fileViews() {
				picked := map[string]any{}
				for _, name := range fields {
					picked[name] = f[name]
				}
				files = append(files, picked)
			}
			v["files"] = files
		}
		return v, nil
	})
}

// each answers a request about the jobs its path names: one job as an
// object (404 if not the caller's), several as a list with each job's
// http_status (207), as fts-rest does.
func (a *ftsAPI) each(w http.ResponseWriter, r *http.Request, c auth.Caller, answer func(*ftsJob) (map[string]any, error)) {
	list := ids(r, "ids")
	switch {
	case len(list) == 0:
		ftsError(w, http.StatusBadRequest, "no job id in the path")
		return
	case len(list) > maxJobsAsked:
		ftsError(w, http.StatusBadRequest, fmt.Sprintf("%d job ids; at most %d may be asked at once", len(list), maxJobsAsked))
		return
	}
	out := make([]map[string]any, 0, len(list))
	reads := newFTSReads()
	for _, id := range list {
		j, err := a.load(r.Context(), c, id, reads)
		switch {
		case errors.Is(err, errNotYours):
			out = append(out, map[string]any{"job_id": id, "http_status": httpStatus(http.StatusNotFound),
				"http_message": fmt.Sprintf("unknown job %q, or not yours", id)})
			continue
		case err != nil:
			a.s.log.Error("FTS3 API: a job's records cannot be read", "job", id, "err", err)
			ftsError(w, http.StatusServiceUnavailable, "the job's records cannot be read now; try again")
			return
		}
		v, err := answer(j)
		if err != nil {
			// Not done, and the client may ask again: 503 for this job.
			out = append(out, map[string]any{"job_id": id, "http_status": httpStatus(http.StatusServiceUnavailable),
				"http_message": err.Error()})
			continue
		}
		v["http_status"] = httpStatus(http.StatusOK)
		out = append(out, v)
	}
	if len(list) == 1 {
		code := http.StatusOK
		switch out[0]["http_status"] {
		case httpStatus(http.StatusOK):
		case httpStatus(http.StatusServiceUnavailable):
			code = http.StatusServiceUnavailable
			w.Header().Set("Retry-After", ftsRetryAfter)
		default:
			code = http.StatusNotFound
		}
		if code != http.StatusOK {
			out[0]["status"], out[0]["message"] = out[0]["http_status"], out[0]["http_message"]
		}
		writeJSON(w, code, out[0])
		return
	}
	writeJSON(w, http.StatusMultiStatus, out)
}

func (a *ftsAPI) files(w http.ResponseWriter, r *http.Request, c auth.Caller) {
	if err := c.Allow(auth.ScopeRead); err != nil {
		ftsError(w, http.StatusForbidden, err.Error())
		return
	}
	id := r.PathValue("id")
	j, ok := a.loadOne(w, r, c, id)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, j.fileViews())
}

func (a *ftsAPI) cancel(w http.ResponseWriter, r *http.Request, c auth.Caller) {
	if err := c.Allow(auth.ScopeCancel); err != nil {
		ftsError(w, http.StatusForbidden, err.Error())
		return
	}
	a.each(w, r, c, func(j *ftsJob) (map[string]any, error) {
		if err := a.s.cancelFTS(r.Context(), j, c); err != nil {
			a.s.log.Error("FTS3 API: cancel", "job", j.rec.Job.ID, "err", err)
			return nil, errors.New("the cancel could not be sent now; try again")
		}
		return j.view(), nil
	})
}

// cancelFTS cancels a job's unfinished files: it asks the scheduler to
// cancel each DTR, then notes the cancel in the job's FTS3 record (so that
// the job is CANCELED from now on, as in FTS3). In that order, so that a
// job is never shown CANCELED while its DTRs go on: when the commands
// cannot be sent, the cancel fails, and the client asks again. A job whose
// files have all ended is left as it is.
func (s *Service) cancelFTS(ctx context.Context, j *ftsJob, c auth.Caller) error {
	if len(j.finals) >= len(j.refs) {
		return nil
	}
	var pending []uuid.UUID
	for _, ref := range j.refs {
		if _, final := j.finals[ref.DTR]; !final {
			pending = append(pending, ref.DTR)
		}
	}
	if err := s.cancelDTRs(ctx, j.rec.Job.ID, pending, "cancelled by its owner over the FTS3 API"); err != nil {
		return err
	}
	s.log.Info("FTS3 job cancelled by its owner", "job", j.rec.Job.ID, "caller", c.String(), "dtrs", len(pending))
	rec, err := s.updateFTS(ctx, j.rec.Job.ID, func(r *ftsRecord) bool {
		if !r.Cancelled.IsZero() {
			return false
		}
		r.Cancelled = time.Now().UTC()
		return true
	})
	if err != nil {
		return fmt.Errorf("note the cancel of job %s: %w", j.rec.Job.ID, err)
	}
	j.fts = rec
	return nil
}

// ftsUpdateTries bounds how often a change of a job's FTS3 record is tried
// again when another request changed the record meanwhile; before each
// try again it waits a random time up to twice as long as before, from
// 2 ms to at most ftsUpdateWait, so that requests that collide spread out
// (tried again at once, one of 21 requests changing a record at the same
// time could lose ten times in a row).
const (
	ftsUpdateTries = 12
	ftsUpdateWait  = 128 * time.Millisecond
)

// updateFTS changes a job's FTS3 record with change (which says whether it
// changed anything), by compare-and-set on the record's revision: when
// another request (a cancel, a priority) wrote it meanwhile, the record is
// read again and changed again, so that neither change is lost.
func (s *Service) updateFTS(ctx context.Context, jobID string, change func(*ftsRecord) bool) (ftsRecord, error) {
	key := jobID + ftsSuffix
	for try := range ftsUpdateTries {
		if try > 0 {
			select {
			case <-time.After(rand.N(min(time.Millisecond<<try, ftsUpdateWait))):
			case <-ctx.Done():
				return ftsRecord{}, fmt.Errorf("store %s: %w", key, ctx.Err())
			}
		}
		var rec ftsRecord
		e, err := s.kv.Get(ctx, key)
		if err != nil {
			return rec, err
		}
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return rec, fmt.Errorf("read %s: %w", key, err)
		}
		if !change(&rec) {
			return rec, nil
		}
		b, err := json.Marshal(rec)
		if err != nil {
			return rec, err
		}
		if _, err = s.kv.Update(ctx, key, b, e.Revision()); err == nil {
			return rec, nil
		} else if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return rec, fmt.Errorf("store %s: %w", key, err)
		}
	}
	return ftsRecord{}, fmt.Errorf("store %s: changed by other requests %d times in a row", key, ftsUpdateTries)
}

// modify changes the priority of a job's unfinished files, as Rucio does
// with {"params": {"priority": N}}. Each DTR's priority is asked of the
// scheduler with the caller's own token, so that the scheduler checks the
// caller's right to it (compute.modify) as for any other request.
func (a *ftsAPI) modify(w http.ResponseWriter, r *http.Request, c auth.Caller) {
	if err := c.Allow(auth.ScopeModify); err != nil {
		ftsError(w, http.StatusForbidden, err.Error())
		return
	}
	var req struct {
		Params struct {
			Priority *int `json:"priority"`
		} `json:"params"`
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil || req.Params.Priority == nil {
		ftsError(w, http.StatusBadRequest, `the body is not {"params": {"priority": <1–5>}}`)
		return
	}
	sluicePriority, ok := ftsPriority[*req.Params.Priority]
	if !ok {
		ftsError(w, http.StatusBadRequest, fmt.Sprintf("params.priority: %d is outside FTS3's 1–5", *req.Params.Priority))
		return
	}
	list := ids(r, "ids")
	if len(list) != 1 {
		ftsError(w, http.StatusBadRequest, "the priority of one job at a time: name one job id")
		return
	}
	id := list[0]
	j, ok := a.loadOne(w, r, c, id)
	if !ok {
		return
	}
	// Each unfinished DTR in turn: a change that stops part way has been
	// made to the DTRs before, and is answered with the error; asked again
	// (it is the same change), it is made to the rest.
	for _, ref := range j.refs {
		if _, final := j.finals[ref.DTR]; final {
			continue
		}
		if code, msg := a.s.setPriority(r.Context(), id, ref.DTR, sluicePriority, r.Header.Get("Authorization")); code != http.StatusOK {
			if code == http.StatusServiceUnavailable {
				w.Header().Set("Retry-After", ftsRetryAfter)
			}
			ftsError(w, code, msg)
			return
		}
	}
	rec, err := a.s.updateFTS(r.Context(), id, func(rec *ftsRecord) bool {
		rec.Priority = *req.Params.Priority
		return true
	})
	if err != nil {
		a.s.log.Error("FTS3 API: note a job's priority", "job", id, "err", err)
		ftsError(w, http.StatusServiceUnavailable, "the priority was changed, but could not be noted now; try again")
		return
	}
	j.fts = rec
	writeJSON(w, http.StatusOK, j.view())
}

// ftsSchedulerCodes maps the scheduler's error codes for a priority change
// onto the FTS3 API's answers; any other is 502. 404 is not here: it is
// either a DTR that has ended (nothing to change) or one the scheduler has
// not taken yet (setPriority).
var ftsSchedulerCodes = map[string]int{
	"400": http.StatusBadRequest,
	"401": http.StatusForbidden,
	"403": http.StatusForbidden,
	"503": http.StatusServiceUnavailable, // standing by, or its store full
}

// ftsPriorityTries and ftsPriorityPause bound how long a priority change
// waits for the scheduler to take a DTR it does not know yet.
const (
	ftsPriorityTries = 10
	ftsPriorityPause = 200 * time.Millisecond
)

// setPriority asks the scheduler, with the caller's own token (authz), to
// change one DTR's priority; it returns the FTS3 API's code and message.
// The scheduler answers 404 for a DTR that has ended, which leaves nothing
// to change, and for one it has not taken from the stream yet, which is
// asked again for a while and then answered 503, so that the client asks
// again: never taken as done.
func (s *Service) setPriority(ctx context.Context, jobID string, id uuid.UUID, priority int, authz string) (int, string) {
	b, _ := json.Marshal(api.PriorityRequest{DTR: id, Priority: priority})
	for try := 1; ; try++ {
		m := nats.NewMsg(api.SubjectPriority + ".generator")
		m.Data = b
		m.Header.Set("Authorization", authz)
		reply, err := s.nc.RequestMsgWithContext(ctx, m)
		if err != nil {
			return http.StatusServiceUnavailable, "the scheduler did not answer (" + err.Error() + "); try again"
		}
		code := reply.Header.Get(micro.ErrorCodeHeader)
		switch {
		case code == "":
			return http.StatusOK, ""
		case code != "404":
			c, ok := ftsSchedulerCodes[code]
			if !ok {
				c = http.StatusBadGateway
			}
			return c, "priority refused by the scheduler: " + reply.Header.Get(micro.ErrorHeader)
		}
		if finals, err := s.finals(ctx, jobID); err == nil && finals[id] != nil {
			return http.StatusOK, "" // it has ended
		}
		if try == ftsPriorityTries {
			return http.StatusServiceUnavailable, fmt.Sprintf("DTR %s is not yet taken by the scheduler; try again", id)
		}
		select {
		case <-ctx.Done():
			return http.StatusServiceUnavailable, "the scheduler has not taken the job's DTRs yet; try again"
		case <-time.After(ftsPriorityPause):
		}
	}
}

// ftsVersion is what GET / answers: the versions FTS3's Python client
// reads when it makes its context (the API version of fts-rest whose
// subset is served).
var ftsVersion = map[string]any{
	"api":        map[string]int{"major": 3, "minor": 12, "patch": 0},
	"schema":     map[string]int{"major": 8, "minor": 0, "patch": 0},
	"delegation": map[string]int{"major": 1, "minor": 0, "patch": 0},
	"server":     "sluice",
}

func (a *ftsAPI) version(w http.ResponseWriter, _ *http.Request, _ auth.Caller) {
	writeJSON(w, http.StatusOK, ftsVersion)
}

// ftsWhoami is the answer of GET /whoami.
type ftsWhoami struct {
	UserDN       string   `json:"user_dn"`
	DN           []string `json:"dn"`
	VOs          []string `json:"vos"`
	VOsID        []string `json:"vos_id"`
	VOMSCred     []string `json:"voms_cred"`
	Roles        []string `json:"roles"`
	DelegationID string   `json:"delegation_id"`
	BaseID       string   `json:"base_id"`
	Method       string   `json:"method"`
	IsRoot       bool     `json:"is_root"`
}

// ftsBase is the base_id /whoami gives, from which FTS3 clients derive
// deterministic job ids; Sluice chooses random ones, so it is only a
// fixed UUID.
var ftsBase = uuid.NewSHA1(uuid.NameSpaceURL, []byte("sluice:fts3-api"))

func (a *ftsAPI) whoami(w http.ResponseWriter, _ *http.Request, c auth.Caller) {
	vos := []string{}
	for _, f := range c.Identity.FQANs {
		vo, _, _ := strings.Cut(strings.TrimPrefix(f, "/"), "/")
		if vo != "" && !slices.Contains(vos, vo) {
			vos = append(vos, vo)
		}
	}
	ids := make([]string, len(vos))
	for i, vo := range vos {
		ids[i] = uuid.NewSHA1(ftsBase, []byte(vo)).String()
	}
	writeJSON(w, http.StatusOK, ftsWhoami{
		UserDN: c.Identity.DN, DN: []string{c.Identity.DN}, VOs: vos, VOsID: ids,
		VOMSCred: append([]string{}, c.Identity.FQANs...), Roles: []string{},
		DelegationID: auth.Namespace(c.Identity.DN)[1:], BaseID: ftsBase.String(), Method: "oauth2", IsRoot: c.Admin,
	})
}

// loadOne reads one job of the caller's for a request about it, or
// answers the request (404 for a job not the caller's, 503 for records
// that cannot be read now) and returns false.
func (a *ftsAPI) loadOne(w http.ResponseWriter, r *http.Request, c auth.Caller, id string) (*ftsJob, bool) {
	j, err := a.load(r.Context(), c, id, newFTSReads())
	switch {
	case errors.Is(err, errNotYours):
		ftsError(w, http.StatusNotFound, fmt.Sprintf("unknown job %q, or not yours", id))
		return j, false
	case err != nil:
		a.s.log.Error("FTS3 API: a job's records cannot be read", "job", id, "err", err)
		ftsError(w, http.StatusServiceUnavailable, "the job's records cannot be read now; try again")
		return j, false
	}
	return j, true
}
