// Package scheduler is the scheduler service: the only holder of queues and
// shares. It consumes new DTRs, cancels and worker results from JetStream,
// feeds them to the pure core, journals every changed DTR (journal.go),
// publishes the core's grants and final DTRs as CloudEvents, and only then
// acknowledges what it consumed.
package scheduler

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"golang.org/x/sync/errgroup"

	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// Config is the scheduler's configuration, read from SLUICE_* variables.
// The names follow ARC's [arex/data-staging] options.
type Config struct {
	// Policy is the fair-share scheme: arc (default) or dirac.
	Policy string `envconfig:"POLICY" default:"arc" desc:"fair-share policy: arc (proportional split by share priority), dirac (group shares, per-user division, history correction), sam (cumulative benefit, front or back of one queue) or enstore (admin category, idle groups first, owned slots)"`
	// DIRAC's policy.
	DIRACGroups        string  `envconfig:"DIRAC_GROUPS" desc:"dirac policy: group=priority[:sharing][:background],... e.g. prod=100:sharing,user=50:background; groups are named by SLUICE_SHAREPOLICY"`
	DIRACSlices        string  `envconfig:"DIRAC_SLICES" desc:"dirac policy: history slices span:weight:maxcorrection,... e.g. 168h:80:2,1h:20:5; empty: no correction"`
	DIRACMaxCorrection float64 `envconfig:"DIRAC_MAX_CORRECTION" default:"5" desc:"dirac policy: the total correction stays within [1/G, G]"`
	DIRACUnit          string  `envconfig:"DIRAC_UNIT" default:"seconds" desc:"dirac policy: usage counted in seconds (slot-time), bytes (byte-fair) or files"`
	// Byte-fair shares, for any policy.
	ByteFair    time.Duration `envconfig:"BYTEFAIR" desc:"make transfer shares fair in bytes under any policy, learning each share's bytes per slot-second over this span (e.g. 10m); empty: off"`
	ByteFairMax float64       `envconfig:"BYTEFAIR_MAX" default:"20" desc:"byte-fair shares: the most a share's transfer weight is multiplied or divided by"`
	// SAM's policy.
	SAMGroups string `envconfig:"SAM_GROUPS" desc:"sam policy: group=fraction or group=priority, e.g. daq=priority,cms=0.6,atlas=0.4; priority groups rank in the order given"`
	SAMUnit   string `envconfig:"SAM_UNIT" default:"files" desc:"sam policy: benefit counted in files, bytes (byte-fair) or seconds"`
	// Enstore's policy.
	EnstoreAdmin string `envconfig:"ENSTORE_ADMIN" desc:"enstore policy: admin/DAQ rules as JSON, e.g. [{\"user\":\"/CN=joe\",\"host\":\"node1\"},{\"group\":\"daq\"}]"`
	EnstoreOwned string `envconfig:"ENSTORE_OWNED" desc:"enstore policy: slots a group owns in each state, e.g. cms=4,atlas=2"`
	// SharePolicy is dn, voms:vo, voms:group, voms:role or empty (one share).
	SharePolicy string `envconfig:"SHAREPOLICY" desc:"share policy: dn, voms:vo, voms:group, voms:role or empty"`
	// SharePriority is "share=prio,share=prio" (ARC: sharepriority lines).
	SharePriority    string        `envconfig:"SHAREPRIORITY" desc:"configured share priorities, e.g. atlas:validation=80,atlas:slow-prod=20"`
	MaxProcessor     int           `envconfig:"MAXPROCESSOR" default:"10" desc:"slots per pre- and post-processing state"`
	MaxDelivery      int           `envconfig:"MAXDELIVERY" default:"10" desc:"transfer slots"`
	MaxEmergency     int           `envconfig:"MAXEMERGENCY" default:"1" desc:"emergency slots per state"`
	PreferredPattern string        `envconfig:"PREFERREDPATTERN" desc:"order of a file's replicas, ARC's preferredpattern: host patterns separated by |, $ anchors at the end, ! excludes, e.g. cern.ch|.uk$|!slow.example"`
	MaxPerHost       int           `envconfig:"MAXPERHOST" default:"0" desc:"transfers that may run at once against one storage endpoint (host:port of a remote source or destination); 0: no limit"`
	MaxPrepared      int           `envconfig:"MAXPREPARED" default:"200" desc:"staged source copies a share may hold (a DTR that outranks all of them may stage beyond it)"`
	MaxTransferTries int           `envconfig:"MAXTRANSFERTRIES" default:"10" desc:"attempts per DTR"`
	RetryBase        time.Duration `envconfig:"RETRY_BASE" default:"10s" desc:"retry delay unit: RETRY_BASE·k² after k attempts"`
	Lease            time.Duration `envconfig:"LEASE" default:"2m" desc:"how long a grant lives without a sign of life from its worker"`
	Tick             time.Duration `envconfig:"TICK" default:"50ms" desc:"scheduling loop period"`
	AgeAfter         time.Duration `envconfig:"AGE_AFTER" default:"1h" desc:"how long a DTR waits in a queue before its priority starts to rise"`
	AgeEvery         time.Duration `envconfig:"AGE_EVERY" default:"5m" desc:"then its priority rises by 1 this often while it is below its queue's head"`
	// Cache says processors keep a cache of downloads (SLUICE_CACHE_DIR is
	// set); stack sets it.
	Cache bool `ignored:"true"`
	// StateFile, if set, is rewritten every second in ARC's dtr.state
	// format, and StateFile.prio is read for priority changes.
	StateFile string `envconfig:"STATE_FILE" desc:"dtr.state file rewritten every second (ARC format); its .prio file changes priorities"`
	// StreamReplicas is the replica count of the streams, consumers and
	// buckets that the scheduler sets up.
	StreamReplicas int `envconfig:"STREAM_REPLICAS" default:"1" desc:"copies of every stream, consumer and bucket that the scheduler sets up: 1 on a single NATS server, 3 on a 3-node cluster"`
	// Retention is how long the record of a final DTR, and an ended job's
	// records, are kept.
	Retention time.Duration `envconfig:"RETENTION" default:"0" desc:"how long the record of a final DTR (bucket sluice_dtrs) and an ended job's records (sluice_jobs) are kept, e.g. 720h; 0 keeps them for ever. Past it the id is unknown: submitted again, it runs again. Needs NATS 2.11 or later"`
	// CheckpointEvery and CheckpointRecords say how often the records in
	// the journal are checkpointed into the sluice_dtrs bucket (journal.go).
	CheckpointEvery   time.Duration `envconfig:"CHECKPOINT_EVERY" default:"5s" desc:"how often the DTR records of the scheduler's journal are put in the sluice_dtrs bucket (each changed DTR once) and the journal purged; a restart replays what is left"`
	CheckpointRecords int           `envconfig:"CHECKPOINT_RECORDS" default:"20000" desc:"checkpoint sooner once this many DTRs have changed since the last one"`
	// Meter takes the service's metrics (nil: the global meter provider's).
	Meter metric.Meter `ignored:"true"`
}

// CoreConfig turns the service configuration into the core's.
func (c Config) CoreConfig() (core.Config, error) {
	cc := core.DefaultConfig()
	p, err := core.ParseSharePolicy(c.SharePolicy)
	if err != nil {
		return cc, err
	}
	cc.SharePolicy = p
	cc.SharePriority, err = ParseSharePriorities(c.SharePriority)
	if err != nil {
		return cc, err
	}
	cc.MaxProcessor, cc.MaxDelivery, cc.MaxEmergency = c.MaxProcessor, c.MaxDelivery, c.MaxEmergency
	cc.MaxPrepared, cc.MaxPerHost, cc.PreferredPattern = c.MaxPrepared, c.MaxPerHost, c.PreferredPattern
	cc.Cache = c.Cache
	if c.MaxPerHost < 0 {
		return cc, fmt.Errorf("maxperhost %d is negative", c.MaxPerHost)
	}
	cc.MaxTransferTries, cc.RetryBase, cc.Lease = c.MaxTransferTries, c.RetryBase, c.Lease
	cc.AgeAfter, cc.AgeEvery = c.AgeAfter, c.AgeEvery
	switch strings.ToLower(c.Policy) {
	case "", "arc":
	case "dirac":
		dc := core.DIRACConfig{MaxGlobalCorrection: c.DIRACMaxCorrection}
		if dc.Groups, err = core.ParseDIRACGroups(c.DIRACGroups); err != nil {
			return cc, err
		}
		if dc.Slices, err = core.ParseDIRACSlices(c.DIRACSlices); err != nil {
			return cc, err
		}
		if dc.Unit, err = core.ParseUnit(c.DIRACUnit); err != nil {
			return cc, fmt.Errorf("DIRAC: %w", err)
		}
		cc.Policy = core.NewDIRAC(dc)
	case "sam":
		sc, err := core.ParseSAMGroups(c.SAMGroups)
		if err != nil {
			return cc, err
		}
		if sc.Unit, err = core.ParseUnit(c.SAMUnit); err != nil {
			return cc, fmt.Errorf("SAM: %w", err)
		}
		cc.Policy = core.NewSAM(sc)
	case "enstore":
		var ec core.EnstoreConfig
		if ec.Admin, err = core.ParseEnstoreAdmin(c.EnstoreAdmin); err != nil {
			return cc, err
		}
		if ec.Owned, err = core.ParseOwned(c.EnstoreOwned); err != nil {
			return cc, err
		}
		owned := 0
		for _, n := range ec.Owned {
			owned += n
		}
		if owned > min(c.MaxDelivery, c.MaxProcessor) && c.MaxDelivery > 0 && c.MaxProcessor > 0 {
			return cc, fmt.Errorf("Enstore owned slots add up to %d, more than the %d slots of the smallest state", owned, min(c.MaxDelivery, c.MaxProcessor))
		}
		cc.Policy = core.NewEnstore(ec)
	default:
		return cc, fmt.Errorf("policy %q is not arc, dirac, sam or enstore", c.Policy)
	}
	if c.ByteFair < 0 {
		return cc, fmt.Errorf("byte-fair span %s is negative", c.ByteFair)
	}
	if c.ByteFair > 0 {
		cc.Policy = core.ByteFair(cc.Policy, c.ByteFair, c.ByteFairMax)
	}
	return cc, nil
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

// Service is a running scheduler.
type Service struct {
	cfg     Config
	nc      *nats.Conn
	js      jetstream.JetStream
	core    *core.Core
	log     *slog.Logger
	queries chan *query
	// finished remembers recently finished DTRs so that a redelivered
	// submit of one is not run again.
	finished map[uuid.UUID]time.Time
	stopped  chan struct{}
	mon      *monitor
	ready    atomic.Bool
	// looped is when the scheduling loop last came round (Unix ns).
	looped atomic.Int64
	// maxDTR is the largest DTR taken from dtr.submit (bus.MaxDTRBytes).
	maxDTR int
	// journal makes every step's changes durable (journal.go).
	journal *journal
	// stored has the id of every DTR with a record (seen.go).
	stored seen
	// longestAt is when the longest-waiting DTRs were last looked up.
	longestAt time.Time
	longest   []Waiting
}

// New checks the configuration and prepares a scheduler on nc.
func New(cfg Config, nc *nats.Conn, log *slog.Logger) (*Service, error) {
	cc, err := cfg.CoreConfig()
	if err != nil {
		return nil, fmt.Errorf("scheduler config: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	if cfg.Tick <= 0 {
		cfg.Tick = 50 * time.Millisecond
	}
	s := &Service{
		cfg: cfg, nc: nc, js: js, core: core.New(cc), log: log.With("service", "scheduler"),
		queries: make(chan *query), finished: map[uuid.UUID]time.Time{}, stopped: make(chan struct{}),
		mon: newMonitor(cmp.Or(cfg.Policy, "arc")),
	}
	meter := cfg.Meter
	if meter == nil {
		meter = otel.GetMeterProvider().Meter("github.com/sluice-dtr/sluice/services/scheduler")
	}
	if err := s.registerMetrics(meter); err != nil {
		return nil, err
	}
	return s, nil
}

// Run recovers the saved DTRs and schedules until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	defer close(s.stopped)
	if err := s.setUp(ctx); err != nil {
		return fmt.Errorf("scheduler: %w", err)
	}
	kv, err := s.js.KeyValue(ctx, bus.BucketDTRs)
	if err != nil {
		return fmt.Errorf("scheduler: %w", err)
	}
	s.maxDTR = bus.MaxDTRBytes(s.nc.MaxPayload())
	every, atMost := s.cfg.CheckpointEvery, s.cfg.CheckpointRecords
	if every <= 0 {
		every = 5 * time.Second
	}
	if atMost <= 0 {
		atMost = 20000
	}
	s.journal = newJournal(s.js, kv, s.log, int(s.nc.MaxPayload())/2, every, atMost)
	s.journal.retention = s.cfg.Retention
	if err := s.recover(ctx, kv); err != nil {
		return fmt.Errorf("scheduler recovery: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx) // stops the consumers when Run returns
	defer cancel()
	// Results (and progress) come before submissions: they free slots
	// and move DTRs on, while a burst of new DTRs only fills queues.
	submits, results := make(chan jetstream.Msg, 4096), make(chan jetstream.Msg, 4096)
	for src, in := range map[string]chan jetstream.Msg{bus.StreamSubmit: submits, bus.StreamResults: results} {
		cons, err := s.js.Consumer(ctx, src, bus.ConsumerSched)
		if err != nil {
			return fmt.Errorf("scheduler: consumer on %s: %w", src, err)
		}
		go func() {
			_ = bus.Each(ctx, cons, 1000, func(m jetstream.Msg) {
				select {
				case in <- m:
				case <-ctx.Done():
				}
			})
		}()
	}
	svc, err := s.addAPI()
	if err != nil {
		return err
	}
	defer svc.Stop()
	s.ready.Store(true)
	defer s.ready.Store(false)

	tick := time.NewTicker(s.cfg.Tick)
	defer tick.Stop()
	var dump <-chan time.Time
	if s.cfg.StateFile != "" {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		dump = t.C
		defer s.writeState()
	}
	sample := time.NewTicker(time.Second)
	defer sample.Stop()
	s.sample(time.Now())
	// Decisions are made here and made durable by the committer, which
	// stores and publishes a step's outputs while the next step is made.
	// The hand-over waits for the committer: what comes in meanwhile goes
	// into one larger next step.
	commits := make(chan *commit)
	failed := make(chan error, 1)
	committed := make(chan struct{})
	cctx, stopCommits := context.WithCancel(context.WithoutCancel(ctx))
	defer stopCommits()
	go func() {
		defer close(committed)
		s.commitLoop(cctx, commits, failed)
	}()
	defer func() {
		// The steps made are stored and published, for a while.
		close(commits)
		select {
		case <-committed:
		case <-time.After(commitTimeout):
			stopCommits()
			<-committed
		}
	}()
	var batch []jetstream.Msg
	for {
		batch = batch[:0]
		s.looped.Store(time.Now().UnixNano())
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			// What was not acknowledged is redelivered: a restart
			// recovers from the last durable state.
			return fmt.Errorf("scheduler: %w", err)
		case now := <-sample.C:
			s.sample(now)
			continue
		case q := <-s.queries:
			q.f()
			if !q.change {
				close(q.done)
				continue
			}
			// A change is stored and its effects published before the
			// caller hears it is done.
			c, err := s.step(ctx, kv, nil)
			if err != nil {
				q.err = err
				close(q.done)
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("scheduler: %w", err)
			}
			c.done = func(err error) { q.err = err; close(q.done) }
			if !s.hand(ctx, commits, c) {
				return nil
			}
			continue
		case <-dump:
			s.applyPriorityFile()
			s.writeState()
		case m := <-results:
			batch = drain(append(batch, m), results, submits)
		case m := <-submits:
			batch = drain(append(batch, m), results, submits)
		case <-tick.C:
		}
		c, err := s.step(ctx, kv, batch)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("scheduler: %w", err)
		}
		if !s.hand(ctx, commits, c) {
			return nil
		}
	}
}

// The most a step takes in: messages, and bytes of their data.
const (
	maxStepMessages = 2000
	maxStepBytes    = 64 << 10
)

// drain adds to a step what has come in, results first, up to
// maxStepMessages messages or maxStepBytes: a burst of submissions goes
// into several steps, and the first grants go out while the rest is taken.
func drain(batch []jetstream.Msg, results, submits <-chan jetstream.Msg) []jetstream.Msg {
	size := 0
	for _, m := range batch {
		size += len(m.Data())
	}
	for len(batch) < maxStepMessages && size < maxStepBytes {
		var m jetstream.Msg
		select {
		case m = <-results:
		default:
			select {
			case m = <-results:
			case m = <-submits:
			default:
				return batch
			}
		}
		batch = append(batch, m)
		size += len(m.Data())
	}
	return batch
}

// hand gives a step's commit to the committer, waiting while it is busy
// with earlier ones; false if ctx ended first.
func (s *Service) hand(ctx context.Context, commits chan<- *commit, c *commit) bool {
	if c.empty() {
		if c.done != nil {
			c.done(nil)
		}
		return true
	}
	select {
	case commits <- c:
		return true
	case <-ctx.Done():
		if c.done != nil {
			c.done(errStopped)
		}
		return false
	}
}

// commit is what one step leaves to do, in order: journal the records of
// the changed DTRs (and publish rejections); publish grants and final
// DTRs; journal the records of the final DTRs; send the best-effort
// notices; and only then acknowledge the step's inputs (or terminate the
// refused ones).
type commit struct {
	records, finals     []record
	rejections, publish []*nats.Msg
	notices             []*nats.Msg
	acks, terms         []jetstream.Msg
	// done, if set, hears the outcome.
	done func(error)
}

func (c *commit) empty() bool {
	return len(c.records)+len(c.rejections)+len(c.publish)+len(c.finals)+len(c.notices)+len(c.acks)+len(c.terms) == 0
}

// commitTimeout bounds how long the committer goes on storing the outputs
// of steps already made once the scheduler stops.
const commitTimeout = 5 * time.Second

// commitLoop carries out commits in the order made. Commits that wait
// while one is carried out are carried out together, each phase of all of
// them before the next phase, so that a busy scheduler stores and publishes
// in large batches. After a failure nothing more is published and the
// failure is reported on failed; the inputs of the failed and later
// commits stay unacknowledged and are redelivered. Between commits it
// begins the journal's checkpoints when they are due.
func (s *Service) commitLoop(ctx context.Context, commits <-chan *commit, failed chan<- error) {
	defer s.journal.Wait()
	var broken error
	tick := time.NewTicker(min(time.Second, s.journal.every))
	defer tick.Stop()
	for {
		var c *commit
		select {
		case <-tick.C:
			if broken == nil && s.journal.Due(time.Now()) {
				s.journal.Checkpoint(ctx)
			}
			continue
		case next, ok := <-commits:
			if !ok {
				return
			}
			c = next
		}
		cs := []*commit{c}
	more:
		for {
			select {
			case c, ok := <-commits:
				if !ok {
					break more
				}
				cs = append(cs, c)
			default:
				break more
			}
		}
		err := broken
		if err == nil {
			err = s.carryOut(ctx, cs)
		}
		for _, c := range cs {
			if c.done != nil {
				c.done(err)
			}
		}
		if err != nil && broken == nil {
			broken = err
			select {
			case failed <- err:
			default:
			}
		}
		if broken == nil && s.journal.Due(time.Now()) {
			s.journal.Checkpoint(ctx)
		}
	}
}

func (s *Service) carryOut(ctx context.Context, cs []*commit) error {
	out := bus.NewBatch(ctx, s.js)
	// records are the latest record of each DTR in the commits.
	records := func(of func(*commit) []record) []record {
		var recs []record
		at := map[uuid.UUID]int{}
		for _, c := range cs {
			for _, r := range of(c) {
				if i, ok := at[r.id]; ok {
					recs[i] = r
					continue
				}
				at[r.id] = len(recs)
				recs = append(recs, r)
			}
		}
		return recs
	}
	// A final DTR is announced before its record says final: if the
	// scheduler dies in between, the input that finished it is
	// redelivered and it is announced again (the generator takes a final
	// DTR once).
	for _, c := range cs {
		for _, m := range c.rejections {
			out.Add(m)
		}
	}
	if err := s.journal.Append(ctx, records(func(c *commit) []record { return c.records })); err != nil {
		return fmt.Errorf("persist: %w", err)
	}
	if err := out.Wait(ctx); err != nil {
		return fmt.Errorf("publish rejections: %w", err)
	}
	for _, c := range cs {
		for _, m := range c.publish {
			out.Add(m)
		}
	}
	if err := out.Wait(ctx); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	if err := s.journal.Append(ctx, records(func(c *commit) []record { return c.finals })); err != nil {
		return fmt.Errorf("persist final: %w", err)
	}
	for _, c := range cs {
		for _, m := range c.notices {
			_ = s.nc.PublishMsg(m)
		}
		for _, m := range c.terms {
			_ = m.Term()
		}
		for _, m := range c.acks {
			_ = m.Ack()
		}
	}
	return nil
}

// setUp creates or checks every stream, consumer and bucket (bus.Ensure).
// While NATS cannot be reached or its JetStream is not ready (a scheduler
// started before its server, or while it restarts) it tries again after
// 50 ms, backing off to 2 s, as the other roles wait in bus.Await; it
// logs the first failure and then one every 30 s. A refusal by the server
// (a stream with other settings that it will not change, say) is returned
// at once, and so is the end of ctx.
func (s *Service) setUp(ctx context.Context) error {
	wait := 50 * time.Millisecond
	var logged time.Time
	for {
		err := bus.Ensure(ctx, s.js, bus.Setup{Replicas: s.cfg.StreamReplicas, ExpiringRecords: s.cfg.Retention > 0})
		if err == nil {
			return nil
		}
		var api *jetstream.APIError
		if ctx.Err() != nil || errors.As(err, &api) && api.Code != 503 {
			return err
		}
		if time.Since(logged) > 30*time.Second {
			logged = time.Now()
			s.log.Warn("cannot set up streams, consumers and buckets; trying again", "err", err)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// step applies a batch of inputs, lets time pass and returns what makes
// the decisions durable and visible and then acknowledges the inputs.
func (s *Service) step(ctx context.Context, kv jetstream.KeyValue, batch []jetstream.Msg) (*commit, error) {
	now := time.Now()
	c := &commit{}
	subs := map[jetstream.Msg]submitted{} // each submit decoded once
	for _, m := range batch {
		if m.Subject() == bus.SubjectSubmit {
			ds, err := DecodeSubmits(ctx, bus.Msg(m), s.maxDTR)
			subs[m] = submitted{ds, err}
		}
	}
	stored, err := s.storedBefore(ctx, kv, subs)
	if err != nil {
		return nil, err
	}
	for _, m := range batch {
		if err := s.handle(ctx, now, m, c, subs[m], stored); err != nil {
			c.terms = append(c.terms, m)
		} else {
			c.acks = append(c.acks, m)
		}
	}
	s.core.Tick(now)
	dec := s.core.Take()

	// The records of changed DTRs, encoded now: the core changes them
	// after this step.
	var changes bus.StateChanges
	encoded := make(map[uuid.UUID][]byte, len(dec.Changed)) // reused in grants
	for i := range dec.Changed {
		d := dec.Changed[i]
		b, err := bus.EncodeJSON(d)
		if err != nil {
			return nil, fmt.Errorf("encode DTR %s: %w", d.ID, err)
		}
		encoded[d.ID] = b
		if d.State.Final() {
			c.finals = append(c.finals, record{id: d.ID, data: b, final: true})
		} else {
			c.records = append(c.records, record{id: d.ID, data: b})
		}
		changes.Changes = append(changes.Changes, bus.StateChange{
			DTR: d.ID, JobID: d.JobID, State: d.State, Share: d.Share, Priority: d.Priority})
	}
	grants, err := s.grants(ctx, dec.Grants, encoded)
	if err != nil {
		return nil, err
	}
	c.publish = append(c.publish, grants...)
	finals, err := s.finals(ctx, now, dec.Final, encoded)
	if err != nil {
		return nil, err
	}
	c.publish = append(c.publish, finals...)
	// Best-effort notices: workers to stop, observers of state changes
	// (one event for the step).
	for _, g := range dec.CancelRunning {
		if m := notice(ctx, bus.SubjectStopPrefix+g.ID, bus.TypeStop, bus.Stop{DTR: g.DTR.ID, Grant: g.ID}); m != nil {
			c.notices = append(c.notices, m)
		}
	}
	if len(changes.Changes) > 0 {
		if m := notice(ctx, bus.SubjectDTRState, bus.TypeDTRStates, changes); m != nil {
			c.notices = append(c.notices, m)
		}
	}
	if len(dec.Final) > 0 {
		s.forget(now)
	}
	return c, nil
}

// sample records the scheduler's state for the web page and the metrics.
// The longest-waiting DTRs are looked up every second, or every ten with
// more than 100,000 DTRs, since that walks every queue.
func (s *Service) sample(now time.Time) {
	every := time.Second
	if s.core.Len() > 100_000 {
		every = 10 * time.Second
	}
	if now.Sub(s.longestAt) >= every {
		s.longestAt = now
		s.longest = s.longest[:0:0]
		for _, id := range s.core.Longest(10) {
			d, _ := s.core.Get(id)
			w, err := s.core.Explain(now, id)
			if err != nil {
				continue
			}
			s.longest = append(s.longest, Waiting{Why: w, Since: d.Updated, Created: d.Created, JobID: d.JobID, Source: d.Source})
		}
	}
	s.mon.sample(now, s.core, s.longest)
}

// applyPriorityFile applies the priorities of StateFile.prio, if there is
// one. A malformed line is reported and skipped; the others are applied.
func (s *Service) applyPriorityFile() {
	changes, err := readPriorityFile(s.cfg.StateFile)
	if err != nil {
		s.log.Error("priority file", "err", err)
	}
	now := time.Now()
	for _, c := range changes {
		if err := s.core.SetPriority(now, c.DTR, c.Priority); err != nil {
			s.log.Warn("priority file", "dtr", c.DTR, "err", err)
		} else {
			s.log.Info("priority changed by file", "dtr", c.DTR, "priority", c.Priority)
		}
	}
}

// writeState rewrites StateFile.
func (s *Service) writeState() {
	if err := WriteFileAtomic(s.cfg.StateFile, StateLines(s.core.DTRs())); err != nil {
		s.log.Error("state file", "err", err)
	}
}

// storedBefore finds the submitted DTRs of a batch that the core does not
// hold but that have a stored record: they were taken before (and have
// finished), so a resubmission does not run them again. The look-ups run
// in parallel.
func (s *Service) storedBefore(ctx context.Context, kv jetstream.KeyValue, subs map[jetstream.Msg]submitted) (map[uuid.UUID]bool, error) {
	var ids, held []uuid.UUID
	stored := make(map[uuid.UUID]bool)
	for _, sub := range subs {
		for _, e := range sub.dtrs {
			if e.Err != nil {
				continue
			}
			d := e.DTR
			if _, ok := s.core.Get(d.ID); ok {
				held = append(held, d.ID) // it may finish within this batch
				continue
			}
			if _, ok := s.finished[d.ID]; ok {
				continue
			}
			if !s.stored.MayHave(d.ID) {
				continue // never stored: new
			}
			if _, ok := s.journal.Lookup(d.ID); ok {
				stored[d.ID] = true // finished, not yet checkpointed
				continue
			}
			ids = append(ids, d.ID)
		}
	}
	for _, id := range held {
		stored[id] = true
	}
	if len(ids) == 0 {
		return stored, nil
	}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for _, id := range ids {
		g.Go(func() error {
			_, err := kv.Get(gctx, id.String())
			switch {
			case err == nil:
				mu.Lock()
				stored[id] = true
				mu.Unlock()
			case !errors.Is(err, jetstream.ErrKeyNotFound):
				return fmt.Errorf("look up DTR %s: %w", id, err)
			}
			return nil
		})
	}
	return stored, g.Wait()
}

// handle applies one consumed message to the core. Bad input is answered
// with a rejection event on out and an error; it changes nothing else.
func (s *Service) handle(ctx context.Context, now time.Time, jm jetstream.Msg, out *commit, sub submitted, stored map[uuid.UUID]bool) error {
	m := bus.Msg(jm)
	switch {
	case m.Subject == bus.SubjectSubmit:
		if sub.err != nil {
			s.reject(ctx, out, m, jm, sub.err)
			return sub.err
		}
		for i, e := range sub.dtrs {
			err := e.Err
			if err == nil {
				err = s.submit(ctx, now, m, e.DTR, e.TraceParent, stored)
			}
			if err == nil {
				continue
			}
			if len(sub.dtrs) == 1 && e.Data == nil {
				s.reject(ctx, out, m, jm, err) // the message was this DTR
				return err
			}
			// One DTR of several is refused alone; the others go on.
			s.rejectEntry(ctx, out, m, jm, i, e.Data, err)
		}
	case m.Subject == bus.SubjectCancel:
		var c bus.Cancel
		if _, err := bus.DecodeData(ctx, m, bus.TypeCancel, &c); err != nil {
			s.reject(ctx, out, m, jm, err)
			return err
		}
		if err := s.core.Cancel(now, c.DTR); err != nil {
			s.log.Debug("cancel", "dtr", c.DTR, "err", err)
		}
	case strings.HasPrefix(m.Subject, bus.SubjectResultPrefix):
		rs, err := bus.DecodeResults(ctx, m)
		if err != nil {
			s.reject(ctx, out, m, jm, err)
			return err
		}
		stage := dtr.Stage(strings.TrimPrefix(m.Subject, bus.SubjectResultPrefix))
		for _, r := range rs {
			var span trace.Span
			if r.TraceParent != "" {
				_, span = bus.StartConsumerOf(ctx, r.TraceParent, m.Subject, r.Grant+".result", "result")
			} else {
				_, span = bus.StartConsumer(ctx, m, "result")
			}
			err := s.core.Result(now, core.Result{DTR: r.DTR, Grant: r.Grant, Stage: stage, Failure: r.Error, Size: r.Size,
				Bytes: r.Bytes, Checksum: r.Checksum, TURL: r.TURL, Cache: r.Cache, CacheFile: r.CacheFile,
				Started: r.Started, Ended: r.Ended, Returned: r.Returned})
			span.End()
			if err != nil {
				s.log.Info("result ignored", "dtr", r.DTR, "grant", r.Grant, "err", err)
			}
		}
	case strings.HasPrefix(m.Subject, bus.SubjectProgressPrefix):
		var p bus.Progress
		if _, err := bus.DecodeData(ctx, m, bus.TypeProgress, &p); err != nil {
			s.reject(ctx, out, m, jm, err)
			return err
		}
		if err := s.core.Progress(now, p.DTR, p.Grant, p.Bytes); err != nil {
			s.log.Debug("progress ignored", "dtr", p.DTR, "err", err)
		}
	default:
		err := fmt.Errorf("no handler for subject %s", m.Subject)
		s.reject(ctx, out, m, jm, err)
		return err
	}
	return nil
}

// submit gives the core a new DTR, unless it was taken before.
func (s *Service) submit(ctx context.Context, now time.Time, m *nats.Msg, d *dtr.DTR, traceparent string, stored map[uuid.UUID]bool) error {
	if _, done := s.finished[d.ID]; done || stored[d.ID] {
		s.log.Debug("DTR already taken", "dtr", d.ID)
		return nil // a resubmission or redelivery of a DTR seen before
	}
	// The publisher's trace goes on: the DTR's own traceparent in a
	// Submits event, else the message's traceparent header, else the
	// event's distributed-tracing extension.
	var cctx context.Context
	var span trace.Span
	if traceparent != "" {
		cctx, span = bus.StartConsumerOf(ctx, traceparent, m.Subject, d.ID.String(), "schedule")
	} else {
		cctx, span = bus.StartConsumer(bus.Context(ctx, d.TraceParent), m, "schedule")
	}
	d.TraceParent = bus.TraceParent(cctx)
	span.End()
	if err := s.core.Submit(now, d); err != nil {
		if errors.Is(err, core.ErrDuplicate) {
			return nil
		}
		return err
	}
	s.stored.Add(d.ID) // its record is journaled with this step
	return nil
}

// submitted is a decoded message from dtr.submit: its DTRs, or why the
// whole message is refused.
type submitted struct {
	dtrs []Submitted
	err  error
}

// Submitted is one DTR of a message on dtr.submit, or why it is refused.
type Submitted struct {
	DTR *dtr.DTR
	Err error
	// In a Submits event: the DTR's traceparent and its JSON as sent.
	TraceParent string
	Data        []byte
}

// DecodeSubmits reads the DTRs of a message on dtr.submit. A Submits event
// (org.sluice.dtr.submits.v1, binary mode) holds several, each taken or
// refused alone; any other message holds one, as DecodeSubmit reads it. No
// DTR may be larger than maxDTR bytes. An error refuses the whole message.
func DecodeSubmits(ctx context.Context, m *nats.Msg, maxDTR int) ([]Submitted, error) {
	if m.Header.Get("ce-type") != bus.TypeSubmits {
		if err := checkSize(m.Data, maxDTR); err != nil {
			return nil, err
		}
		d, err := DecodeSubmit(ctx, m)
		if err != nil {
			return nil, err
		}
		return []Submitted{{DTR: d}}, nil
	}
	var batch bus.Submits
	if _, err := bus.DecodeData(ctx, m, bus.TypeSubmits, &batch); err != nil {
		return nil, err
	}
	if len(batch.DTRs) == 0 {
		return nil, errors.New("a submits event without DTRs")
	}
	out := make([]Submitted, len(batch.DTRs))
	for i, e := range batch.DTRs {
		out[i].Data = e.DTR
		err := checkSize(e.DTR, maxDTR)
		if err == nil {
			out[i].DTR, err = decodeSubmission(e.DTR)
		}
		if err != nil {
			out[i].Err = fmt.Errorf("dtrs[%d]: %w", i, err)
			continue
		}
		if bus.ValidTraceParent(e.TraceParent) { // else ignored, as W3C Trace Context says
			out[i].TraceParent = e.TraceParent
		}
	}
	return out, nil
}

// DecodeSubmit reads a new DTR from a message on dtr.submit: a binary or
// structured CloudEvent of type org.sluice.dtr.submit.v1, or plain DTR JSON.
// Unknown fields are refused by name.
func DecodeSubmit(ctx context.Context, m *nats.Msg) (*dtr.DTR, error) {
	data := m.Data
	ev, err := bus.Decode(ctx, m)
	switch {
	case err == nil:
		if ev.Type() != bus.TypeSubmit {
			return nil, fmt.Errorf("event type %q, want %q", ev.Type(), bus.TypeSubmit)
		}
		data = ev.Data()
	case !errors.Is(err, bus.ErrNotCloudEvent):
		return nil, err
	}
	d, err := decodeSubmission(data)
	if err != nil {
		return nil, err
	}
	if ev != nil {
		// CloudEvents' distributed-tracing extension: a ce-traceparent
		// header, or "traceparent" in a structured event. One that is not
		// a valid traceparent is ignored, as W3C Trace Context says.
		if tp, _ := ev.Extensions()["traceparent"].(string); bus.ValidTraceParent(tp) {
			d.TraceParent = tp
		}
	}
	return d, nil
}

// decodeSubmission reads a dtr.Submission and checks the DTR it asks for.
func decodeSubmission(data []byte) (*dtr.DTR, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("empty DTR")
	}
	var sub dtr.Submission
	if err := decodeStrict(data, &sub); err != nil {
		return nil, fmt.Errorf("DTR JSON: %w", err)
	}
	d := sub.DTR()
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return d, nil
}

// rejectEntry publishes why the i-th DTR of a Submits event is refused.
func (s *Service) rejectEntry(ctx context.Context, out *commit, m *nats.Msg, jm jetstream.Msg, i int, data []byte, reason error) {
	msgID := m.Header.Get(nats.MsgIdHdr)
	s.log.Warn("rejected", "subject", m.Subject, "msg_id", msgID, "dtr", i, "reason", reason)
	r := bus.Rejection{Subject: m.Subject, MsgID: msgID, Reason: reason.Error(), Payload: rejectionPayload(data)}
	ev, err := bus.NewEvent(bus.TypeRejected, "sluice/scheduler", msgID, r)
	if err != nil {
		return
	}
	id := ""
	if meta, err := jm.Metadata(); err == nil {
		id = fmt.Sprintf("reject.%s.%d.%d", meta.Stream, meta.Sequence.Stream, i)
	}
	if rm, err := bus.Encode(ctx, bus.SubjectRejected, id, ev); err == nil {
		out.rejections = append(out.rejections, rm)
	}
}

func (s *Service) reject(ctx context.Context, out *commit, m *nats.Msg, jm jetstream.Msg, reason error) {
	msgID := m.Header.Get(nats.MsgIdHdr)
	s.log.Warn("rejected", "subject", m.Subject, "msg_id", msgID, "reason", reason)
	r := bus.Rejection{Subject: m.Subject, MsgID: msgID, Reason: reason.Error(), Payload: rejectionPayload(m.Data)}
	ev, err := bus.NewEvent(bus.TypeRejected, "sluice/scheduler", msgID, r)
	if err != nil {
		return
	}
	id := ""
	if meta, err := jm.Metadata(); err == nil {
		id = fmt.Sprintf("reject.%s.%d", meta.Stream, meta.Sequence.Stream)
	}
	if rm, err := bus.Encode(ctx, bus.SubjectRejected, id, ev); err == nil {
		out.rejections = append(out.rejections, rm)
	}
}

// maxFinalsPerMessage bounds the DTRs of one Finals event.
const maxFinalsPerMessage = 100

// finals encodes a step's final DTRs as Finals events of up to
// maxFinalsPerMessage DTRs and half of the server's max_payload, each DTR
// with the span that announced it. A message's id is a digest of its DTRs'
// ids: announced again after a crash, the same DTRs are stored once, and
// other groupings of them are taken (the generator takes each DTR once).
func (s *Service) finals(ctx context.Context, now time.Time, ds []*dtr.DTR, encoded map[uuid.UUID][]byte) ([]*nats.Msg, error) {
	maxBytes := int(s.nc.MaxPayload()) / 2
	var msgs []*nats.Msg
	var data []byte // the Finals event's data, written here: each DTR's JSON is ready
	var first context.Context
	n := 0
	digest := sha256.New()
	flush := func() error {
		if n == 0 {
			return nil
		}
		ev, err := bus.NewEvent(bus.TypeDTRFinals, "sluice/scheduler", "", append(data, "]}"...))
		if err != nil {
			return err
		}
		m, err := bus.Encode(first, bus.SubjectDTRFinal, fmt.Sprintf("finals.%x", digest.Sum(nil)[:16]), ev)
		if err != nil {
			return err
		}
		msgs = append(msgs, m)
		data, n = nil, 0
		digest.Reset()
		return nil
	}
	for _, d := range ds {
		s.finished[d.ID] = now
		s.mon.final(d)
		b, ok := encoded[d.ID]
		if !ok {
			var err error
			if b, err = bus.EncodeJSON(d); err != nil {
				return nil, fmt.Errorf("encode DTR %s: %w", d.ID, err)
			}
		}
		fctx, span := bus.StartProducer(bus.Context(ctx, d.TraceParent), bus.SubjectDTRFinal, d.ID.String()+".final")
		tp := bus.TraceParent(fctx)
		span.End()
		if s.log.Enabled(ctx, slog.LevelInfo) { // its arguments cost even when not logged
			s.log.Info("dtr final", "dtr", d.ID, "job", d.JobID, "state", d.State, "attempts", d.Attempts,
				"trace_id", span.SpanContext().TraceID())
		}
		if n == maxFinalsPerMessage || n > 0 && len(data)+len(b)+len(tp)+40 > maxBytes {
			if err := flush(); err != nil {
				return nil, err
			}
		}
		if n == 0 {
			first = fctx
			data = append(data, `{"dtrs":[`...)
		} else {
			data = append(data, ',')
		}
		data = append(data, `{"traceparent":`...)
		data = strconv.AppendQuote(data, tp)
		data = append(data, `,"dtr":`...)
		data = append(data, b...)
		data = append(data, '}')
		digest.Write(d.ID[:])
		n++
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return msgs, nil
}

// maxGrantsPerMessage bounds the grants of one Grants event.
const maxGrantsPerMessage = 32

// grants encodes a step's grants as Grants events, one stage's per event.
// A stage's grants are spread over at least four events, or one per grant
// if fewer (so that they go to several worker processes, each taking
// messages for its free workers: a message's grants all run where it is
// taken), and over more when maxGrantsPerMessage requires. No event is larger than half of the server's
// max_payload. Each grant carries the span that sent it.
func (s *Service) grants(ctx context.Context, gs []core.Grant, encoded map[uuid.UUID][]byte) ([]*nats.Msg, error) {
	byStage := map[dtr.Stage][]encodedGrant{}
	for _, g := range gs {
		gctx, span := bus.StartProducer(bus.Context(ctx, g.DTR.TraceParent), bus.GrantSubject(g.Stage), g.ID)
		// The DTR as its record was just encoded (a granted DTR is always
		// among the changed ones), not encoded again.
		d, ok := encoded[g.DTR.ID]
		if !ok {
			var err error
			if d, err = bus.EncodeJSON(g.DTR); err != nil {
				span.End()
				return nil, fmt.Errorf("encode grant %s: %w", g.ID, err)
			}
		}
		data := grantWire{Grant: g.ID, Stage: g.Stage, State: g.State,
			LeaseSeconds: g.Lease.Seconds(), Cleanup: g.Cleanup, Emergency: g.Emergency, TraceParent: bus.TraceParent(gctx)}
		span.End()
		b, err := data.encode(d)
		if err != nil {
			return nil, fmt.Errorf("encode grant %s: %w", g.ID, err)
		}
		byStage[g.Stage] = append(byStage[g.Stage], encodedGrant{g.ID, b})
	}
	maxBytes := int(s.nc.MaxPayload()) / 2
	var msgs []*nats.Msg
	for _, stage := range bus.Stages {
		enc := byStage[stage]
		per := max((len(enc)+maxGrantsPerMessage-1)/maxGrantsPerMessage, min(len(enc), 4))
		size := (len(enc) + per - 1) / max(per, 1)
		for len(enc) > 0 {
			n, bytes := 0, 0
			for n < len(enc) && n < size && (n == 0 || bytes+len(enc[n].data) < maxBytes) {
				bytes += len(enc[n].data) + 1
				n++
			}
			m, err := grantsMessage(ctx, stage, enc[:n])
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, m)
			enc = enc[n:]
		}
	}
	return msgs, nil
}

// grantWire is bus.Grant but its DTR, which encode adds already encoded.
type grantWire struct {
	Grant        string    `json:"grant"`
	Stage        dtr.Stage `json:"stage"`
	State        dtr.State `json:"state"`
	LeaseSeconds float64   `json:"lease_seconds"`
	Cleanup      bool      `json:"cleanup,omitempty"`
	Emergency    bool      `json:"emergency,omitempty"`
	TraceParent  string    `json:"traceparent,omitempty"`
}

// encode writes the grant with d, a DTR's JSON, as its "dtr" (last, and
// not checked again as a json.RawMessage would be).
func (g grantWire) encode(d []byte) ([]byte, error) {
	b, err := bus.EncodeJSON(g)
	if err != nil {
		return nil, err
	}
	b = append(b[:len(b)-1], `,"dtr":`...)
	b = append(b, d...)
	return append(b, '}'), nil
}

type encodedGrant struct {
	id   string
	data []byte
}

// grantsMessage makes one Grants event of encoded grants. Its message id
// is the first grant's id: a grant is sent in one message only.
func grantsMessage(ctx context.Context, stage dtr.Stage, enc []encodedGrant) (*nats.Msg, error) {
	size := len(`{"grants":[]}`)
	for _, g := range enc {
		size += len(g.data) + 1
	}
	data := append(make([]byte, 0, size), `{"grants":[`...)
	for i, g := range enc {
		if i > 0 {
			data = append(data, ',')
		}
		data = append(data, g.data...)
	}
	data = append(data, "]}"...)
	// The data is JSON already: the CloudEvents SDK takes it as it is.
	ev, err := bus.NewEvent(bus.TypeGrants, "sluice/scheduler", "", data)
	if err != nil {
		return nil, err
	}
	return bus.Encode(ctx, bus.GrantSubject(stage), enc[0].id+".grants", ev)
}

// notice encodes a best-effort event for core NATS; nil if it cannot be.
func notice(ctx context.Context, subject, typ string, data any) *nats.Msg {
	ev, err := bus.NewEvent(typ, "sluice/scheduler", "", data)
	if err != nil {
		return nil
	}
	m, err := bus.Encode(ctx, subject, "", ev)
	if err != nil {
		return nil
	}
	return m
}

// forget drops finished DTRs older than twice the redelivery window.
func (s *Service) forget(now time.Time) {
	if len(s.finished) < 100000 {
		return
	}
	for id, t := range s.finished {
		if now.Sub(t) > 2*time.Minute {
			delete(s.finished, id)
		}
	}
}

// recover loads every saved DTR: the checkpoint in the bucket, then the
// journal written since. Unfinished DTRs go back into the core in the order
// they last changed; DTRs that finished after the checkpoint are
// remembered as finished.
func (s *Service) recover(ctx context.Context, kv jetstream.KeyValue) error {
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer w.Stop()
	var ds []*dtr.DTR
	now := time.Now()
	// Decoding is most of the work: records are decoded in chunks, each
	// on every core.
	type raw struct {
		key  string
		data []byte
	}
	var chunk []raw
	decode := func(keep func(d *dtr.DTR, data []byte)) {
		out := make([]*dtr.DTR, len(chunk))
		var wg sync.WaitGroup
		workers := runtime.GOMAXPROCS(0)
		for k := range workers {
			wg.Go(func() {
				for i := k; i < len(chunk); i += workers {
					d := &dtr.DTR{}
					if err := bus.DecodeJSON(chunk[i].data, d); err != nil {
						s.log.Error("unreadable saved DTR skipped", "key", chunk[i].key, "err", err)
						continue
					}
					out[i] = d
				}
			})
		}
		wg.Wait()
		for i, d := range out {
			if d != nil {
				keep(d, chunk[i].data)
			}
		}
		chunk = chunk[:0]
	}
	checkpointed := func(d *dtr.DTR, _ []byte) {
		if !d.State.Final() { // a resubmission of a final one is found by storedBefore
			ds = append(ds, d)
		}
	}
	for e := range w.Updates() {
		if e == nil {
			break // caught up
		}
		if id, err := uuid.Parse(e.Key()); err == nil {
			s.stored.Add(id)
		}
		if chunk = append(chunk, raw{e.Key(), e.Value()}); len(chunk) == 8192 {
			decode(checkpointed)
		}
	}
	decode(checkpointed)
	// The journal: later records replace earlier ones. Each DTR's latest
	// record stays in the journal's keeping until the next checkpoint.
	journaled := map[uuid.UUID]*dtr.DTR{}
	keep := func(d *dtr.DTR, data []byte) {
		journaled[d.ID] = d
		s.stored.Add(d.ID)
		s.journal.Keep(d.ID, data, d.State.Final())
	}
	if err := s.journal.Replay(ctx, func(data []byte) {
		if chunk = append(chunk, raw{"journal", data}); len(chunk) == 8192 {
			decode(keep)
		}
	}); err != nil {
		return err
	}
	decode(keep)
	if len(journaled) > 0 {
		ds = slices.DeleteFunc(ds, func(d *dtr.DTR) bool { return journaled[d.ID] != nil })
		for _, d := range journaled {
			if d.State.Final() {
				s.finished[d.ID] = now
			} else {
				ds = append(ds, d)
			}
		}
	}
	sort.SliceStable(ds, func(i, j int) bool { return ds[i].Updated.Before(ds[j].Updated) })
	for _, d := range ds {
		if err := s.core.Restore(now, d); err != nil {
			s.log.Error("saved DTR not restored", "dtr", d.ID, "err", err)
		}
	}
	if len(ds) > 0 || len(journaled) > 0 {
		s.log.Info("recovered", "dtrs", len(ds), "from_journal", len(journaled))
	}
	return nil
}

// addAPI serves the scheduler's request/reply endpoints as a micro service.
func (s *Service) addAPI() (micro.Service, error) {
	svc, err := micro.AddService(s.nc, micro.Config{Name: "sluice-scheduler", Version: "0.1.0",
		Description: "Sluice scheduler: shares and DTRs"})
	if err != nil {
		return nil, fmt.Errorf("scheduler API: %w", err)
	}
	if err := svc.AddEndpoint("shares", micro.HandlerFunc(s.handleShares), micro.WithEndpointSubject(bus.SubjectAPIShares)); err != nil {
		return nil, err
	}
	if err := svc.AddEndpoint("dtr", micro.HandlerFunc(s.handleDTR), micro.WithEndpointSubject(bus.SubjectAPIDTR)); err != nil {
		return nil, err
	}
	if err := svc.AddEndpoint("priority", micro.HandlerFunc(s.handlePriority), micro.WithEndpointSubject(bus.SubjectAPIPriority)); err != nil {
		return nil, err
	}
	if err := svc.AddEndpoint("cancel", micro.HandlerFunc(s.handleCancel), micro.WithEndpointSubject(bus.SubjectAPICancel)); err != nil {
		return nil, err
	}
	if err := svc.AddEndpoint("reconfigure", micro.HandlerFunc(s.handleReconfigure), micro.WithEndpointSubject(bus.SubjectAPIReconfigure)); err != nil {
		return nil, err
	}
	return svc, nil
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
	return bus.DecodeJSONStrict(data, v)
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

// PriorityRequest is the body of sluice.api.priority.
type PriorityRequest struct {
	DTR      uuid.UUID `json:"dtr"`
	Priority int       `json:"priority"`
}

// decodePriorityRequest reads a sluice.api.priority request: a DTR id and
// a priority 1–100.
func decodePriorityRequest(data []byte) (PriorityRequest, error) {
	var req PriorityRequest
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

func (s *Service) handlePriority(r micro.Request) {
	req, err := decodePriorityRequest(r.Data())
	if err != nil {
		respondErr(r, err)
		return
	}
	var d dtr.DTR
	if cerr := s.change(func() {
		if err = s.core.SetPriority(time.Now(), req.DTR, req.Priority); err == nil {
			d, _ = s.core.Get(req.DTR)
		}
	}); cerr != nil {
		_ = r.Error("503", cerr.Error(), nil)
		return
	}
	if err != nil {
		respondErr(r, err)
		return
	}
	s.log.Info("priority changed", "dtr", req.DTR, "priority", req.Priority)
	_ = r.RespondJSON(DTRReply{DTR: d})
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

// decodeCancelRequest reads a sluice.api.cancel request: either a DTR id
// or a job id.
func decodeCancelRequest(data []byte) (CancelRequest, error) {
	var req CancelRequest
	if err := decodeRequest(data, &req); err != nil {
		return req, err
	}
	if (req.DTR == uuid.Nil) == (req.Job == "") {
		return req, errors.New("name either a dtr or a job to cancel")
	}
	return req, nil
}

func (s *Service) handleCancel(r micro.Request) {
	req, err := decodeCancelRequest(r.Data())
	if err != nil {
		respondErr(r, err)
		return
	}
	var n int
	cerr := s.change(func() {
		now := time.Now()
		if req.Job != "" {
			n, err = s.core.CancelJob(now, req.Job)
			return
		}
		if _, ok := s.core.Get(req.DTR); !ok {
			err = fmt.Errorf("%w: %s", core.ErrUnknownDTR, req.DTR)
			return
		}
		n, err = 1, s.core.Cancel(now, req.DTR)
	})
	if cerr != nil {
		_ = r.Error("503", cerr.Error(), nil)
		return
	}
	if err != nil {
		respondErr(r, err)
		return
	}
	s.log.Info("cancelled", "dtr", req.DTR, "job", req.Job, "dtrs", n)
	_ = r.RespondJSON(CancelReply{Cancelled: n})
}

// ReconfigureRequest is the body of sluice.api.reconfigure: the share
// priorities that replace the configured ones until the scheduler restarts.
type ReconfigureRequest struct {
	SharePriority map[string]int `json:"sharepriority"`
}

// decodeReconfigureRequest reads a sluice.api.reconfigure request: share
// names, none empty, with priorities 1–100.
func decodeReconfigureRequest(data []byte) (ReconfigureRequest, error) {
	var req ReconfigureRequest
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
	s.log.Info("share priorities reconfigured", "sharepriority", req.SharePriority)
	s.handleShares(r)
}

// SharesReply is the answer of sluice.api.shares.
type SharesReply struct {
	Shares   []core.ShareStats `json:"shares"`
	Retrying map[string]int    `json:"retrying,omitempty"`
	Limits   map[string]int    `json:"limits"`
}

func (s *Service) handleShares(r micro.Request) {
	var reply SharesReply
	s.query(func() {
		reply.Shares, reply.Retrying = s.core.Shares()
		reply.Limits = map[string]int{"maxprocessor": s.cfg.MaxProcessor, "maxdelivery": s.cfg.MaxDelivery, "maxemergency": s.cfg.MaxEmergency, "maxprepared": s.cfg.MaxPrepared, "maxperhost": s.cfg.MaxPerHost}
	})
	_ = r.RespondJSON(reply)
}

// DTRReply is the answer of sluice.api.dtr: the DTR and, while it is
// unfinished, why it is where it is.
type DTRReply struct {
	DTR dtr.DTR   `json:"dtr"`
	Why *core.Why `json:"why,omitempty"`
}

func (s *Service) handleDTR(r micro.Request) {
	id, err := uuid.Parse(strings.TrimSpace(string(r.Data())))
	if err != nil {
		_ = r.Error("400", fmt.Sprintf("DTR id %q is not a UUID", r.Data()), nil)
		return
	}
	var d dtr.DTR
	var ok bool
	var why *core.Why
	s.query(func() {
		if d, ok = s.core.Get(id); ok {
			if w, err := s.core.Explain(time.Now(), id); err == nil {
				why = &w
			}
		}
	})
	if !ok {
		if b, found := s.journal.Lookup(id); found {
			ok = json.Unmarshal(b, &d) == nil
		}
	}
	if !ok {
		kv, err := s.js.KeyValue(context.Background(), bus.BucketDTRs)
		if err == nil {
			if e, err := kv.Get(context.Background(), id.String()); err == nil {
				ok = json.Unmarshal(e.Value(), &d) == nil
			}
		}
	}
	if !ok {
		_ = r.Error("404", "unknown DTR "+id.String(), nil)
		return
	}
	_ = r.RespondJSON(DTRReply{DTR: d, Why: why})
}

// query runs f in the scheduling loop, which owns the core.
func (s *Service) query(f func()) { _ = s.run(f, false) }

// change runs f in the scheduling loop and returns once what f changed is
// stored, or an error if the scheduler stopped first or could not store it.
func (s *Service) change(f func()) error { return s.run(f, true) }

type query struct {
	f      func()
	change bool
	done   chan struct{}
	err    error
}

// errStopped answers requests that reach a scheduler on its way out.
var errStopped = errors.New("the scheduler is stopping; try again")

func (s *Service) run(f func(), change bool) error {
	q := &query{f: f, change: change, done: make(chan struct{})}
	select {
	case s.queries <- q:
		<-q.done
		return q.err
	case <-s.stopped:
		return errStopped
	}
}
