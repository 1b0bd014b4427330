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

// maxFTSBody bounds the body of a submission: 2,000 files of long URLs
// and metadata fit with room to spare.
const maxFTSBody = 16 << 20

// ftsWait bounds how long a request waits for the generator to start and
// for a token's issuer to answer.
const ftsWait = 10 * time.Second

// ftsRoutes are the routes the FTS3 API serves, method and pattern; the
// OpenAPI document is held to them by a test.
var ftsRoutes = []struct {
	method, pattern string
	handle          func(*ftsAPI, http.ResponseWriter, *http.Request, auth.Caller)
}{
	{http.MethodPost, "/jobs", (*ftsAPI).submit},
	{http.MethodGet, "/jobs/{ids}", (*ftsAPI).jobs},
	{http.MethodGet, "/jobs/{id}/files", (*ftsAPI).files},
	{http.MethodPost, "/jobs/{ids}", (*ftsAPI).modify},
	{http.MethodDelete, "/jobs/{ids}", (*ftsAPI).cancel},
	{http.MethodGet, "/whoami", (*ftsAPI).whoami},
	{http.MethodGet, "/{$}", (*ftsAPI).version},
}

// ftsAPI serves the FTS3 API of a generator.
type ftsAPI struct{ s *Service }

// FTSHandler returns the FTS3 REST API of the generator. It answers 503
// until Run has started.
func (s *Service) FTSHandler() http.Handler {
	a := &ftsAPI{s: s}
	mux := http.NewServeMux()
	for _, r := range ftsRoutes {
		mux.HandleFunc(r.method+" "+r.pattern, func(w http.ResponseWriter, req *http.Request) {
			a.serve(w, req, r.handle)
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
func (a *ftsAPI) serve(w http.ResponseWriter, r *http.Request, h func(*ftsAPI, http.ResponseWriter, *http.Request, auth.Caller)) {
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
	select {
	case <-a.s.started:
	case <-ctx.Done():
		ftsError(w, http.StatusServiceUnavailable, "the generator is starting; try again")
		return
	}
	h(a, w, r.WithContext(ctx), c)
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
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxFTSBody))
	if err != nil {
		ftsError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", maxFTSBody))
		return
	}
	sub, err := parseFTSSubmission(body, c, time.Now().UTC())
	if err != nil {
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
	switch {
	case errors.As(err, &full):
		ftsError(w, http.StatusServiceUnavailable, full.text)
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

// load reads a job for c.
func (a *ftsAPI) load(ctx context.Context, c auth.Caller, id string) (*ftsJob, error) {
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
	j.live = a.s.liveDTRs(ctx, j.refs, j.finals)
	return j, nil
}

// maxLive bounds the DTR records one request reads for the live state of
// a job's unfinished files; past it they are SUBMITTED.
const maxLive = 500

// liveDTRs reads the scheduler's records of a job's unfinished DTRs (the
// sluice_dtrs bucket) for their live state. It is a best effort: a record
// not found or not readable leaves its file SUBMITTED.
func (s *Service) liveDTRs(ctx context.Context, refs []api.FileRef, finals map[uuid.UUID]*dtr.DTR) map[uuid.UUID]*dtr.DTR {
	out := map[uuid.UUID]*dtr.DTR{}
	if len(refs)-len(finals) > maxLive || len(refs) == len(finals) {
		return out
	}
	kv, err := s.js.KeyValue(ctx, bus.BucketDTRs)
	if err != nil {
		return out
	}
	for _, ref := range refs {
		if _, final := finals[ref.DTR]; final {
			continue
		}
		if e, err := kv.Get(ctx, ref.DTR.String()); err == nil {
			d := &dtr.DTR{}
			if codec.DecodeJSON(e.Value(), d) == nil {
				out[ref.DTR] = d
			}
		}
	}
	return out
}

// maxJobsAsked bounds the jobs one request may name: Rucio asks for a few
// hundred at most.
const maxJobsAsked = 1000

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
	a.each(w, r, c, func(j *ftsJob) map[string]any {
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
		return v
	})
}

// each answers a request about the jobs its path names: one job as an
// object (404 if not the caller's), several as a list with each job's
// http_status (207), as fts-rest does.
func (a *ftsAPI) each(w http.ResponseWriter, r *http.Request, c auth.Caller, answer func(*ftsJob) map[string]any) {
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
	for _, id := range list {
		j, err := a.load(r.Context(), c, id)
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
		v := answer(j)
		v["http_status"] = httpStatus(http.StatusOK)
		out = append(out, v)
	}
	if len(list) == 1 {
		code := http.StatusOK
		if out[0]["http_status"] != httpStatus(http.StatusOK) {
			code = http.StatusNotFound
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
	j, err := a.load(r.Context(), c, id)
	switch {
	case errors.Is(err, errNotYours):
		ftsError(w, http.StatusNotFound, fmt.Sprintf("unknown job %q, or not yours", id))
		return
	case err != nil:
		a.s.log.Error("FTS3 API: a job's records cannot be read", "job", id, "err", err)
		ftsError(w, http.StatusServiceUnavailable, "the job's records cannot be read now; try again")
		return
	}
	writeJSON(w, http.StatusOK, j.fileViews())
}

func (a *ftsAPI) cancel(w http.ResponseWriter, r *http.Request, c auth.Caller) {
	if err := c.Allow(auth.ScopeCancel); err != nil {
		ftsError(w, http.StatusForbidden, err.Error())
		return
	}
	a.each(w, r, c, func(j *ftsJob) map[string]any {
		if err := a.s.cancelFTS(r.Context(), j, c); err != nil {
			a.s.log.Error("FTS3 API: cancel", "job", j.rec.Job.ID, "err", err)
			v := j.view()
			v["reason"] = "the cancel could not be sent; try again"
			return v
		}
		return j.view()
	})
}

// cancelFTS cancels a job's unfinished files: it notes the cancel in the
// job's FTS3 record (so that the job is CANCELED from now on, as in FTS3)
// and asks the scheduler to cancel each DTR. A job whose files have all
// ended is left as it is.
func (s *Service) cancelFTS(ctx context.Context, j *ftsJob, c auth.Caller) error {
	if len(j.finals) >= len(j.refs) {
		return nil
	}
	if j.fts.Cancelled.IsZero() {
		j.fts.Cancelled = time.Now().UTC()
		b, err := json.Marshal(j.fts)
		if err != nil {
			return err
		}
		if _, err := s.kv.Put(ctx, j.rec.Job.ID+ftsSuffix, b); err != nil {
			return fmt.Errorf("note the cancel of job %s: %w", j.rec.Job.ID, err)
		}
	}
	var pending []uuid.UUID
	for _, ref := range j.refs {
		if _, final := j.finals[ref.DTR]; !final {
			pending = append(pending, ref.DTR)
		}
	}
	s.log.Info("FTS3 job cancelled by its owner", "job", j.rec.Job.ID, "caller", c.String(), "dtrs", len(pending))
	return s.cancelDTRs(ctx, j.rec.Job.ID, pending, "cancelled by its owner over the FTS3 API")
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
	j, err := a.load(r.Context(), c, id)
	switch {
	case errors.Is(err, errNotYours):
		ftsError(w, http.StatusNotFound, fmt.Sprintf("unknown job %q, or not yours", id))
		return
	case err != nil:
		a.s.log.Error("FTS3 API: a job's records cannot be read", "job", id, "err", err)
		ftsError(w, http.StatusServiceUnavailable, "the job's records cannot be read now; try again")
		return
	}
	for _, ref := range j.refs {
		if _, final := j.finals[ref.DTR]; final {
			continue
		}
		b, _ := json.Marshal(api.PriorityRequest{DTR: ref.DTR, Priority: sluicePriority})
		m := nats.NewMsg(api.SubjectPriority)
		m.Data = b
		m.Header.Set("Authorization", r.Header.Get("Authorization"))
		reply, err := a.s.nc.RequestMsgWithContext(r.Context(), m)
		if err != nil {
			ftsError(w, http.StatusServiceUnavailable, "the scheduler did not answer ("+err.Error()+"); try again")
			return
		}
		// 404: the DTR has finished meanwhile, which leaves nothing to change.
		if code := reply.Header.Get(micro.ErrorCodeHeader); code != "" && code != "404" {
			ftsError(w, http.StatusForbidden, "priority refused: "+reply.Header.Get(micro.ErrorHeader))
			return
		}
	}
	j.fts.Priority = *req.Params.Priority
	if b, err := json.Marshal(j.fts); err == nil {
		if _, err := a.s.kv.Put(r.Context(), id+ftsSuffix, b); err != nil {
			a.s.log.Error("FTS3 API: note a job's priority", "job", id, "err", err)
		}
	}
	writeJSON(w, http.StatusOK, j.view())
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
