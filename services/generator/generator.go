// Package generator is the generator service: it takes job descriptions,
// makes one DTR per file, submits them, follows them until every one is
// final, cancels a job's other downloads when a download fails (uploads go
// on, as in ARC), and announces the job's end with per-file statistics.
//
// Job state lives in the sluice_jobs bucket:
//
//	<job>          the job record (counts, state), updated with compare-and-set
//	<job>.files    the job's DTRs, written once
//	<job>.f.<hash> the job's DTRs in one finals event, one JSON per line,
//	               created once (a redelivered event is a no-op)
package generator

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/bus/tracing"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
	"github.com/sluice-dtr/sluice/pkg/version"
)

// Config is the generator's configuration, read from SLUICE_GENERATOR_*.
type Config struct {
	MaxFiles int `envconfig:"MAX_FILES" default:"2000" desc:"most files one job may have (10000 needs a NATS max_payload of 8MB)"`
	// Retention is how long an ended job's records are kept (the shared
	// SLUICE_RETENTION); 0 keeps them for ever.
	Retention time.Duration `ignored:"true"`
	// Meter takes the service's metrics (nil: the global meter provider's).
	Meter metric.Meter `ignored:"true"`
	OwnerLimits
	// OwnerMaxDTRs and OwnerMaxBytes are the scheduler's
	// SLUICE_OWNER_MAX_DTRS and _BYTES: a job whose DTRs would take its
	// owner past them is refused here.
	OwnerMaxDTRs  int   `ignored:"true"`
	OwnerMaxBytes int64 `ignored:"true"`
	// Callers establishes who sent each request (pkg/auth); nil knows no
	// users, administrators or token issuers.
	Callers *auth.Resolver `ignored:"true"`
	// FileRoots are the directories file:// URLs must lie under
	// (SLUICE_FILE_ROOTS); internal/app sets them.
	FileRoots []string `ignored:"true"`
}

// keptFailures is how many failure lines an event trimmed to fit keeps.
const keptFailures = 100

// Record is a job's record as the generator stores it under <job>: its
// state (what sluice.api.job.status answers) and what its DTRs take of its
// owner's limits.
type Record struct {
	api.JobRecord
	// Footprint is about how many bytes the records of the job's DTRs
	// take (dtr.Footprint), counted for its owner while it runs.
	Footprint int64 `json:"footprint,omitempty"`
}

// encodeToFit returns ev's JSON in at most limit bytes, leaving out what it
// must: first the lines of files that ended DONE (the others say what went
// wrong), then every file line and the pending list, then the failure lines
// past the first keptFailures.
func encodeToFit(ev *api.JobEvent, limit int) ([]byte, error) {
	for step := 0; ; step++ {
		b, err := codec.EncodeJSON(ev)
		if err != nil || len(b) <= limit {
			return b, err
		}
		switch step {
		case 0:
			kept := []api.FileStat{}
			for _, f := range ev.Files {
				if f.State == dtr.Done {
					ev.FilesOmitted++
				} else {
					kept = append(kept, f)
				}
			}
			ev.Files = kept
		case 1:
			ev.FilesOmitted += len(ev.Files)
			ev.PendingOmitted += len(ev.Pending)
			ev.Files, ev.Pending = []api.FileStat{}, nil
		case 2:
			if n := len(ev.Failures); n > keptFailures {
				ev.FailuresOmitted = n - keptFailures
				ev.Failures = ev.Failures[:keptFailures]
			}
		default:
			return nil, fmt.Errorf("job %s: its event is %d bytes even without its file lines, more than the %d a message may carry here", ev.Job.ID, len(b), limit)
		}
	}
}

// eventLimit is the most bytes of JSON a job event or status answer may
// have: the server's max_payload less room for the message's headers.
func (s *Service) eventLimit() int {
	return max(int(s.nc.MaxPayload())-8<<10, 4<<10)
}

// Service is a running generator.
type Service struct {
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	log *slog.Logger
	// jobs counts jobs submitted and ended, dtrs the DTRs submitted.
	jobs, dtrs metric.Int64Counter
	// space follows the writes refused for want of space (full.go).
	space *bus.Space

	mu sync.Mutex
	// suspects are jobs whose counts may miss a final DTR (one was
	// redelivered, or this generator has just started): reconcile counts
	// them again from the stored final DTRs.
	suspects map[string]bool
	// lastFinal is when each job last counted a final DTR here: a job is
	// counted again only once it has been quiet for a while, so that the
	// recount does not race a stream of new finals.
	lastFinal map[string]time.Time
	// members caches the DTR ids of jobs whose final DTRs came lately
	// (membership.go).
	members map[string]map[uuid.UUID]struct{}
	// owners holds what each owner's running jobs hold, by DN (owners.go).
	owners map[string]ownerUse
	// started is closed once Run has the job records' bucket: the FTS3
	// API waits for it.
	started   chan struct{}
	startOnce sync.Once
}

// suspect marks a job for reconcile.
func (s *Service) suspect(jobID string) {
	s.mu.Lock()
	s.suspects[jobID] = true
	s.mu.Unlock()
}

// reconcile counts every suspect job again from its stored final DTRs and
// announces it if every DTR is final, every interval until ctx ends. At
// start every job not yet announced is suspect: a generator that died
// between storing a final DTR and counting it leaves no other trace.
func (s *Service) reconcile(ctx context.Context, every time.Duration) {
	if w, err := s.kv.WatchFiltered(ctx, []string{"*"}, jetstream.IgnoreDeletes()); err == nil {
		for e := range w.Updates() {
			if e == nil {
				break
			}
			var r Record
			if json.Unmarshal(e.Value(), &r) == nil && !r.Announced {
				s.suspect(e.Key())
			}
		}
		_ = w.Stop()
	} else {
		s.log.Error("list jobs to reconcile", "err", err)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.mu.Lock()
		jobs := make([]string, 0, len(s.suspects))
		for j := range s.suspects {
			jobs = append(jobs, j)
		}
		s.mu.Unlock()
		for _, jobID := range jobs {
			s.mu.Lock()
			busy := time.Since(s.lastFinal[jobID]) < 2*every
			s.mu.Unlock()
			if busy {
				continue
			}
			if err := s.reconcileJob(ctx, jobID); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
				if ctx.Err() == nil {
					s.log.Error("reconcile job", "job", jobID, "err", err)
				}
				continue // try again at the next tick
			}
			s.mu.Lock()
			delete(s.suspects, jobID)
			delete(s.lastFinal, jobID)
			s.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reconcileJob counts a job again from its stored final DTRs, cancels its
// downloads if one failed, and announces it if every DTR is final.
func (s *Service) reconcileJob(ctx context.Context, jobID string) error {
	rec, err := s.update(ctx, jobID, func(r *Record) error {
		if r.Announced {
			return errUnchanged
		}
		return s.recount(ctx, jobID, r)
	})
	if err == nil && rec.DownloadFailed && !rec.Announced {
		// The failed download may have been counted here first, before
		// the update that would have sent the cancels.
		err = s.cancelDownloads(ctx, jobID, uuid.Nil)
	}
	if err == nil && rec.Final() >= rec.Total && !rec.Announced {
		err = s.announce(ctx, jobID, nil)
	}
	return err
}

// tagDefault returns the default tag of Config's field: the one place a
// default is written, read here too for a Config built in code.
func tagDefault(field string) string {
	f, _ := reflect.TypeFor[Config]().FieldByName(field)
	return f.Tag.Get("default")
}

// New prepares a generator on nc.
func New(cfg Config, nc *nats.Conn, log *slog.Logger) (*Service, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("generator: %w", err)
	}
	if cfg.MaxFiles <= 0 {
		cfg.MaxFiles, _ = strconv.Atoi(tagDefault("MaxFiles"))
	}
	meter := cfg.Meter
	if meter == nil {
		meter = otel.GetMeterProvider().Meter("github.com/sluice-dtr/sluice/services/generator")
	}
	jobs, err := meter.Int64Counter("sluice.generator.jobs", metric.WithDescription("jobs by event: submitted, finished or failed"))
	if err != nil {
		return nil, fmt.Errorf("generator metrics: %w", err)
	}
	dtrs, err := meter.Int64Counter("sluice.generator.dtrs",
		metric.WithDescription("DTRs of jobs by event: submitted, finished (done), failed or cancelled"))
	if err != nil {
		return nil, fmt.Errorf("generator metrics: %w", err)
	}
	return &Service{cfg: cfg, nc: nc, js: js, log: log.With("service", "generator"), jobs: jobs, dtrs: dtrs, space: bus.SpaceOf(nc),
		suspects: map[string]bool{}, lastFinal: map[string]time.Time{}, members: map[string]map[uuid.UUID]struct{}{},
		owners: map[string]ownerUse{}, started: make(chan struct{})}, nil
}

// Run serves job submissions and follows jobs until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	if err := bus.Await(ctx, s.js, s.log, bus.Use{Stream: bus.StreamSubmit}, bus.Use{Bucket: bus.BucketJobs},
		bus.Use{Stream: bus.StreamEvents, Consumer: bus.ConsumerGen}); err != nil {
		return fmt.Errorf("generator: %w", err)
	}
	kv, err := s.js.KeyValue(ctx, bus.BucketJobs)
	if err != nil {
		return fmt.Errorf("generator: %w", err)
	}
	s.kv = kv
	s.startOnce.Do(func() { close(s.started) })
	svc, err := micro.AddService(s.nc, micro.Config{Name: "sluice-generator", Version: version.SemVer(),
		Description: "Sluice generator: jobs in, DTRs out"})
	if err != nil {
		return fmt.Errorf("generator API: %w", err)
	}
	defer func() { _ = svc.Stop() }()
	// Each on the operator's subject and on every user's own (pkg/auth).
	for _, e := range []struct {
		name, base string
		h          func(context.Context, micro.Request)
	}{{"submit", api.SubjectJobSubmit, s.handleSubmit}, {"status", api.SubjectJobStatus, s.handleStatus}, {"list", api.SubjectJobList, s.handleList}} {
		if err := svc.AddEndpoint(e.name, micro.ContextHandler(ctx, e.h), micro.WithEndpointSubject(e.base)); err != nil {
			return err
		}
		if err := svc.AddEndpoint(e.name+"-user", micro.ContextHandler(ctx, e.h), micro.WithEndpointSubject(e.base+".*")); err != nil {
			return err
		}
	}
	go s.countOwnersEvery(ctx, time.Minute)
	cons, err := s.js.Consumer(ctx, bus.StreamEvents, bus.ConsumerGen)
	if err != nil {
		return fmt.Errorf("generator: %w", err)
	}
	go s.reconcile(ctx, time.Second)
	if s.cfg.Retention > 0 {
		go s.expire(ctx, min(max(s.cfg.Retention/4, time.Second), time.Hour))
	}
	// Final DTRs are recorded in batches: whatever has come in while the
	// last batch was recorded, one record update per job.
	var full bus.Backoff
	return bus.EachBatch(ctx, cons, 500, func(ms []jetstream.Msg) {
		if err := s.onFinals(ctx, ms); err != nil {
			if ctx.Err() == nil {
				delay := time.Second
				if bus.StoreFull(err) {
					// Redelivered after a pause that grows while the
					// store stays full.
					delay = full.Next()
					if s.space.Refused(err) {
						s.log.Warn("JetStream store full: final DTRs not recorded; they will be redelivered", "reason", bus.FullReason(err), "dtrs", len(ms))
					}
				} else {
					s.log.Error("final DTRs not recorded; they will be redelivered", "err", err, "dtrs", len(ms))
				}
				for _, m := range ms {
					_ = m.NakWithDelay(delay)
				}
			}
			return
		}
		full.Reset()
		if d := s.space.Stored(); d > 0 {
			s.log.Info("JetStream store has room again; the generator goes on", "held_back", d.Round(time.Millisecond))
		}
		for _, m := range ms {
			_ = m.Ack()
		}
	})
}

// Submit makes and submits the DTRs of a job for caller c. Submitting the
// same job id again submits the same DTR ids, which the scheduler takes
// only once.
func (s *Service) Submit(ctx context.Context, c auth.Caller, j *job.Job) (api.SubmitReply, error) {
	return s.submit(ctx, c, j, nil)
}

// submit is Submit; sidecar, if set, is stored under <job>.fts with the
// job's other records (what the FTS3 API keeps of a submission), and
// removed with them if the job is refused for want of space.
func (s *Service) submit(ctx context.Context, c auth.Caller, j *job.Job, sidecar []byte) (api.SubmitReply, error) {
	if err := c.Allow(auth.ScopeCreate); err != nil {
		return api.SubmitReply{}, err
	}
	if err := ownJob(c, j); err != nil {
		return api.SubmitReply{}, err
	}
	j.Normalize()
	if err := j.Validate(); err != nil {
		return api.SubmitReply{}, err
	}
	n := len(j.Inputs) + len(j.Outputs)
	if n > s.cfg.MaxFiles {
		return api.SubmitReply{}, fmt.Errorf("job has %d files; at most %d are allowed", n, s.cfg.MaxFiles)
	}
	now := time.Now().UTC()
	ds := j.DTRs(now)
	// Every URL of every DTR, replicas too: the generator submits them as
	// the operator, whom the scheduler lets name any local path.
	confined := auth.Confinement{Roots: s.cfg.FileRoots}
	var footprint int64
	for _, d := range ds {
		if err := confined.Check(c, slices.Concat([]string{d.Source, d.Destination}, d.Replicas)...); err != nil {
			return api.SubmitReply{}, err
		}
		footprint += dtr.Footprint(d)
	}
	if err := s.admitJob(c, j, n, footprint); err != nil {
		return api.SubmitReply{}, err
	}
	refs := make([]api.FileRef, len(ds))
	reply := api.SubmitReply{JobID: j.ID}
	for i, d := range ds {
		// A random id, which no one can take before the job comes: one
		// made from the job id could be (membership.go). Submitted again,
		// the job's DTRs keep the ids stored in its file list.
		d.ID = uuid.New()
		refs[i] = api.FileRef{DTR: d.ID, Direction: d.Direction, Source: d.Source, Destination: d.Destination,
			FailureAllowed: d.Options.FailureAllowed}
		reply.DTRs = append(reply.DTRs, d.ID)
	}
	// Every DTR's message is made, and its size checked, before anything
	// is stored: a job whose DTR the scheduler could not take is refused
	// whole.
	traces := make([]string, len(ds))
	msgs, err := s.submits(ds, traces)
	if err != nil {
		return api.SubmitReply{}, err
	}
	for i, id := range traces {
		refs[i].TraceID = id
	}
	rec := Record{JobRecord: api.JobRecord{Job: *j, State: api.JobRunning, Total: len(ds), Created: now}, Footprint: footprint}
	rec.Job.Inputs, rec.Job.Outputs = nil, nil // the files are in <job>.files
	files, err := codec.EncodeJSON(refs)
	if err != nil {
		return reply, err
	}
	// Stored in this order: the file list, the job's record, its DTRs.
	// Refused for want of space before the DTRs, what this call created is
	// removed again: nothing of the job is left.
	var created []string
	if sidecar != nil {
		if _, err := s.kv.Create(ctx, j.ID+ftsSuffix, sidecar); err != nil {
			return reply, s.refuseFull(ctx, j.ID, created, fmt.Errorf("store %s%s: %w", j.ID, ftsSuffix, err))
		}
		created = append(created, j.ID+ftsSuffix)
	}
	var before []api.FileRef // the file list of this job submitted before
	sameFiles := func(stored []byte) bool {
		return json.Unmarshal(stored, &before) == nil && sameRefs(before, refs)
	}
	if isNew, err := s.create(ctx, j.ID+".files", files, sameFiles); err != nil {
		return reply, s.refuseFull(ctx, j.ID, created, err)
	} else if isNew {
		created = append(created, j.ID+".files")
	} else {
		for i := range ds {
			ds[i].ID, refs[i].DTR, reply.DTRs[i] = before[i].DTR, before[i].DTR, before[i].DTR
		}
		// The DTRs taken before go on in their traces, which the file
		// list names.
		if msgs, err = s.submits(ds, nil); err != nil {
			return reply, err
		}
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return reply, s.refuseFull(ctx, j.ID, created, err)
	}
	sameOwner := func(stored []byte) bool {
		var r Record
		return json.Unmarshal(stored, &r) == nil && r.Job.Owner.DN == j.Owner.DN
	}
	if isNew, err := s.create(ctx, j.ID, b, sameOwner); err != nil {
		return reply, s.refuseFull(ctx, j.ID, created, err)
	} else if isNew {
		created = append(created, j.ID)
		s.counted(j.Owner.DN, len(ds), footprint, +1)
	}
	out := bus.NewBatch(ctx, s.js)
	var full error // the first refusal for want of space
	refused := 0
	out.Refused = func(_ int, err error) error {
		if !bus.StoreFull(err) {
			return err
		}
		full = cmp.Or(full, err)
		refused++
		return nil
	}
	if tok := subjectToken(ctx); tok != "" && c.Via == auth.ViaToken {
		// The job's own token goes with its DTRs, for their storage
		// tokens (api.HeaderSubjectToken); never in their text.
		for _, m := range msgs {
			m.Header.Set(api.HeaderSubjectToken, tok)
		}
	}
	for _, m := range msgs {
		out.Add(m)
	}
	if err := out.Wait(ctx); err != nil {
		return reply, fmt.Errorf("submit DTRs of job %s: %w", j.ID, err)
	}
	switch {
	case refused == len(msgs):
		return reply, s.refuseFull(ctx, j.ID, created, full)
	case refused > 0:
		s.space.Refused(full)
		return reply, partlyFull(j.ID, len(msgs)-refused, len(msgs), full)
	}
	s.space.Stored()
	s.jobs.Add(ctx, 1, metric.WithAttributes(attribute.String("event", "submitted")))
	s.dtrs.Add(ctx, int64(len(ds)), dtrSubmitted)
	s.log.Info("job submitted", "job", j.ID, "files", len(ds), "owner", j.Owner.DN)
	return reply, nil
}

// subjectTokenKey is the context key of the token a job was submitted
// with.
type subjectTokenKey struct{}

// WithSubjectToken returns ctx carrying the bearer token that the caller
// of Submit sent, which Submit hands on with the job's DTRs so that their
// transfers get the submitter's rights on storage.
func WithSubjectToken(ctx context.Context, raw string) context.Context {
	return context.WithValue(ctx, subjectTokenKey{}, raw)
}

func subjectToken(ctx context.Context) string {
	s, _ := ctx.Value(subjectTokenKey{}).(string)
	return s
}

// sameRefs says whether two file lists name the same files, whatever
// their DTR ids.
func sameRefs(a, b []api.FileRef) bool {
	return slices.EqualFunc(a, b, func(x, y api.FileRef) bool {
		x.DTR, y.DTR = uuid.Nil, uuid.Nil
		x.TraceID, y.TraceID = "", ""
		return x == y
	})
}

// submitsPerMessage bounds the DTRs of one Submits event.
const submitsPerMessage = 100

// submits makes the messages that submit ds: Submits events of up to
// submitsPerMessage DTRs and at most half of a message's largest size. Each
// DTR starts its own trace here, carried in its entry. A message's id is
// its first DTR's, so a job submitted again is stored once. The trace ids
// are put in traces, if not nil.
func (s *Service) submits(ds []*dtr.DTR, traces []string) ([]*nats.Msg, error) {
	maxDTR := bus.MaxDTRBytes(s.nc.MaxPayload())
	maxBytes := min(bus.MaxMessageBytes, int(s.nc.MaxPayload())) / 2
	var msgs []*nats.Msg
	var batch api.Submits
	var first context.Context
	var firstID uuid.UUID
	size := 0
	flush := func() error {
		if len(batch.DTRs) == 0 {
			return nil
		}
		ev, err := codec.NewEvent(api.TypeSubmits, "sluice/generator", "", batch)
		if err != nil {
			return err
		}
		m, err := codec.Encode(first, api.SubjectSubmit, firstID.String()+".submits", ev)
		if err != nil {
			return err
		}
		msgs = append(msgs, m)
		batch, size = api.Submits{}, 0
		return nil
	}
	for i, d := range ds {
		// One trace per DTR, from here through every stage.
		dctx, span := tracing.StartProducer(context.Background(), api.SubjectSubmit, d.ID.String())
		tracing.SetDTR(span, d, "")
		tp := tracing.TraceParent(dctx)
		span.End()
		if sc := span.SpanContext(); traces != nil && sc.HasTraceID() { // none without a tracer provider
			traces[i] = sc.TraceID().String()
		}
		b, err := codec.EncodeJSON(d.Submission())
		if err != nil {
			return nil, err
		}
		if len(b) > maxDTR {
			return nil, fmt.Errorf("file %d (%s): its DTR is %d bytes, more than the %d that a DTR may have on this NATS server (an eighth of its max_payload, at most 1 MiB)",
				i+1, d.Direction, len(b), maxDTR)
		}
		if len(batch.DTRs) == submitsPerMessage || len(batch.DTRs) > 0 && size+len(b)+len(tp)+32 > maxBytes {
			if err := flush(); err != nil {
				return nil, err
			}
		}
		if len(batch.DTRs) == 0 {
			first, firstID = dctx, d.ID
		}
		batch.DTRs = append(batch.DTRs, api.SubmitEntry{TraceParent: tp, DTR: b})
		size += len(b) + len(tp) + 32
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return msgs, nil
}

// create stores b under a new key; true if it did. When the key is there
// already, a resubmitted job, it is fine if same says the stored value is
// the same.
func (s *Service) create(ctx context.Context, key string, b []byte, same func(stored []byte) bool) (bool, error) {
	if _, err := s.kv.Create(ctx, key, b); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return false, fmt.Errorf("store %s: %w", key, err)
		}
		e, err := s.kv.Get(ctx, key)
		if err != nil {
			return false, fmt.Errorf("store %s: %w", key, err)
		}
		if !same(e.Value()) {
			return false, fmt.Errorf("job %s exists already with other files", strings.SplitN(key, ".", 2)[0])
		}
		return false, nil
	}
	return true, nil
}

func (s *Service) handleSubmit(ctx context.Context, r micro.Request) {
	c, err := s.cfg.Callers.Caller(ctx, api.SubjectJobSubmit, r.Subject(), nats.Header(r.Headers()))
	if err != nil {
		_ = r.Error("403", err.Error(), nil)
		return
	}
	h := r.Headers()
	opt := job.XRSLOptions{SessionDir: h.Get(api.HeaderSessionDir),
		Owner: dtr.Identity{DN: h.Get(api.HeaderDN), FQANs: h.Values(api.HeaderFQAN)}}
	j, err := job.Parse(r.Data(), opt)
	if err != nil {
		_ = r.Error("400", "bad job description: "+oneLine(err), nil)
		return
	}
	if c.Via == auth.ViaToken {
		ctx = WithSubjectToken(ctx, auth.Bearer(nats.Header(h)))
	}
	reply, err := s.Submit(ctx, c, j)
	var full *fullError
	if errors.As(err, &full) {
		_ = r.Error("503", full.text, nil)
		return
	}
	if errors.Is(err, auth.ErrForbidden) {
		_ = r.Error("403", "job refused: "+oneLine(err), nil)
		return
	}
	if err != nil {
		_ = r.Error("400", "job refused: "+oneLine(err), nil)
		return
	}
	_ = r.RespondJSON(reply)
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

func (s *Service) handleStatus(ctx context.Context, r micro.Request) {
	c, err := s.cfg.Callers.Caller(ctx, api.SubjectJobStatus, r.Subject(), nats.Header(r.Headers()))
	if err == nil {
		err = c.Allow(auth.ScopeRead)
	}
	if err != nil {
		_ = r.Error("403", err.Error(), nil)
		return
	}
	jobID := strings.TrimSpace(string(r.Data()))
	if !dtr.ValidJobID(jobID) {
		_ = r.Error("400", fmt.Sprintf("job id %q is not 1–64 characters of A–Z, a–z, 0–9, '_', '-'", jobID), nil)
		return
	}
	ev, err := s.Status(ctx, jobID)
	if err == nil && !c.Owns(ev.Job.Owner) || errors.Is(err, jetstream.ErrKeyNotFound) {
		// Another owner's job is answered as an unknown one.
		text := fmt.Sprintf("unknown job %q", jobID)
		if !c.Admin {
			text += ", or not yours"
		}
		_ = r.Error("404", text, nil)
		return
	}
	if err != nil {
		// The job's records cannot be read now (NATS failing over, say):
		// the reason goes to administrators only, since it may say
		// whether the job exists.
		text := "the job's records cannot be read now; try again"
		if c.Admin {
			text = err.Error()
		}
		_ = r.Error("503", text, nil)
		return
	}
	b, err := encodeToFit(&ev, s.eventLimit())
	if err != nil {
		_ = r.Error("500", err.Error(), nil)
		return
	}
	_ = r.Respond(b)
}

// Status returns a job's record, the statistics of its final DTRs and the
// list of the others.
func (s *Service) Status(ctx context.Context, jobID string) (api.JobEvent, error) {
	return s.status(ctx, jobID, nil)
}

// status is Status with the job's final DTRs, if they have been read.
func (s *Service) status(ctx context.Context, jobID string, finals map[uuid.UUID]*dtr.DTR) (api.JobEvent, error) {
	var ev api.JobEvent
	if _, err := s.get(ctx, jobID, &ev.JobRecord); err != nil {
		return ev, fmt.Errorf("job %q: %w", jobID, err)
	}
	var refs []api.FileRef
	if _, err := s.get(ctx, jobID+".files", &refs); err != nil {
		return ev, fmt.Errorf("job %q files: %w", jobID, err)
	}
	if finals == nil {
		var err error
		if finals, err = s.finals(ctx, jobID); err != nil {
			return ev, err
		}
	}
	for _, ref := range refs {
		d, ok := finals[ref.DTR]
		if !ok {
			ev.Pending = append(ev.Pending, ref)
			continue
		}
		if ref.TraceID == "" { // a job submitted before file lists named traces
			ref.TraceID = tracing.TraceID(d.TraceParent)
		}
		ev.Files = append(ev.Files, api.FileStat{FileRef: ref, State: d.State, Size: d.Size, Started: d.Started,
			Ended: d.Ended, Checksum: d.Checksum, Attempts: d.Attempts, Error: d.Error})
	}
	return ev, nil
}

// finals reads the final DTRs stored for a job in one pass over the
// bucket's stream (a watch of "<job>.f.*"), not one request per DTR.
func (s *Service) finals(ctx context.Context, jobID string) (map[uuid.UUID]*dtr.DTR, error) {
	w, err := s.kv.WatchFiltered(ctx, []string{jobID + ".f.*"}, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("job %q final DTRs: %w", jobID, err)
	}
	defer func() { _ = w.Stop() }()
	out := map[uuid.UUID]*dtr.DTR{}
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("job %q final DTRs: the watch ended early", jobID)
			}
			if e == nil {
				return out, nil // every stored value has been seen
			}
			for line := range bytes.SplitSeq(e.Value(), []byte{'\n'}) {
				if len(line) == 0 {
					continue
				}
				d := &dtr.DTR{}
				if err := codec.DecodeJSON(line, d); err != nil {
					return nil, fmt.Errorf("stored %s: %w", e.Key(), err)
				}
				out[d.ID] = d
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (s *Service) get(ctx context.Context, key string, v any) (uint64, error) {
	e, err := s.kv.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	if err := codec.DecodeJSON(e.Value(), v); err != nil {
		return 0, fmt.Errorf("stored %s: %w", key, err)
	}
	return e.Revision(), nil
}

// errUnchanged, returned by an update's change, leaves the record as it is.
var errUnchanged = errors.New("record unchanged")

// update changes a job record with compare-and-set, retrying on conflict.
func (s *Service) update(ctx context.Context, jobID string, change func(*Record) error) (Record, error) {
	for {
		var r Record
		rev, err := s.get(ctx, jobID, &r)
		if err != nil {
			return r, err
		}
		if err := change(&r); errors.Is(err, errUnchanged) {
			return r, nil
		} else if err != nil {
			return r, err
		}
		b, _ := json.Marshal(r)
		if _, err := s.kv.Update(ctx, jobID, b, rev); err != nil {
			if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
				continue // another replica changed it first
			}
			return r, err
		}
		return r, nil
	}
}
