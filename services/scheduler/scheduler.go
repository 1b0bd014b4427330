// Package scheduler is the scheduler service: the only holder of queues and
// shares. It consumes new DTRs, cancels and worker results from JetStream,
// feeds them to the pure core, journals every changed DTR (journal.go),
// publishes the core's grants and final DTRs as CloudEvents, and only then
// acknowledges what it consumed.
//
// scheduler.go holds the configuration and the loop of steps; submit.go
// takes new DTRs, commit.go publishes a step's output in order, publish.go
// encodes grants and final DTRs, recover.go loads the checkpoints,
// leader.go holds the election and fences a term, standby.go keeps a
// standby's copy warm, api.go serves the control requests, history.go
// records every DTR's history and stuck.go finds stuck DTRs, journal.go and
// seen.go keep the records, and core/ decides.
package scheduler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/bus/tracing"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
	"github.com/sluice-dtr/sluice/services/scheduler/fairshare"
)

// Config is the scheduler's configuration, read from SLUICE_* variables.
// The names follow ARC's [arex/data-staging] options.
type Config struct {
	// Policy is the fair-share scheme, a name in fairshare.Factories.
	Policy string `envconfig:"POLICY" default:"arc" desc:"fair-share policy: arc (proportional split by share priority), dirac (group shares, per-user division, history correction), sam (cumulative benefit, front or back of one queue) or enstore (admin category, idle groups first, owned slots)"`
	// The policies' own settings (SLUICE_DIRAC_*, SLUICE_BYTEFAIR*,
	// SLUICE_SAM_*, SLUICE_ENSTORE_*), each policy's in its struct.
	fairshare.Settings
	// SharePolicy is dn, voms:vo, voms:group, voms:role or empty (one
	// share), the first four also with +activity, or activity.
	SharePolicy string `envconfig:"SHAREPOLICY" desc:"share policy: dn, voms:vo, voms:group, voms:role or empty; each of the four with +activity (voms:vo+activity: shares such as atlas#Production Input), or activity alone"`
	// SharePriority is "share=prio,share=prio" (ARC: sharepriority lines).
	SharePriority            string `envconfig:"SHAREPRIORITY" desc:"configured share priorities, e.g. atlas:validation=80,atlas:slow-prod=20"`
	ActivityShares           string `envconfig:"ACTIVITY_SHARES" desc:"activity weights per VO as JSON, dividing a VO's priority between its activities under a +activity share policy, e.g. {\"atlas\":{\"Production Input\":0.6,\"default\":0.4}}"`
	ActivityLimits           string `envconfig:"ACTIVITY_LIMITS" desc:"per-activity transfer limits at an endpoint as JSON, e.g. [{\"activity\":\"User Subscriptions\",\"destination\":\"se.example.org:443\",\"max\":5}]; an endpoint is host:port (case and a trailing dot ignored, the scheme's default port filled in), a host name (every port of it), or * (each endpoint)"`
	MaxActivitiesPerIdentity int    `envconfig:"ACTIVITY_MAX_PER_IDENTITY" default:"16" desc:"under a +activity share policy, how many distinct activities of one VO (or DN, group, role) without an SLUICE_ACTIVITY_SHARES table make shares of their own; the rest share default"`
	MaxProcessor             int    `envconfig:"MAXPROCESSOR" default:"10" desc:"slots per pre- and post-processing state"`
	MaxDelivery              int    `envconfig:"MAXDELIVERY" default:"10" desc:"transfer slots"`
	MaxEmergency             int    `envconfig:"MAXEMERGENCY" default:"1" desc:"emergency slots per state"`
	PreferredPattern         string `envconfig:"PREFERREDPATTERN" desc:"order of a file's replicas, ARC's preferredpattern: host patterns separated by |, $ anchors at the end, ! excludes, e.g. cern.ch|.uk$|!slow.example"`
	ChainPreClean            bool   `envconfig:"CHAIN_PRECLEAN" default:"true" desc:"a QUERY_REPLICA grant also holds the DTR's PRE_CLEAN slot when PRE_CLEAN has a free slot and nothing waits there, and its processor pre-cleans right after the query under that slot, sending one result for both (half the messages and steps of pre-processing); false: each step is granted on its own"`
	MaxPerHost               int    `envconfig:"MAXPERHOST" default:"0" desc:"transfers that may run at once against one storage endpoint (host:port of a remote source or destination); 0: no limit"`
	// Optimizer is the per-link optimizer's switch and bounds (core/links.go).
	Optimizer         string        `envconfig:"OPTIMIZER" default:"on" desc:"per-link adaptive concurrency: on or off (each link, source endpoint → destination endpoint, gets a limit tuned from its throughput and failures; MAXPERHOST still caps it)"`
	OptimizerMin      int           `envconfig:"OPTIMIZER_MIN" default:"2" desc:"the lowest limit the optimizer gives a link"`
	OptimizerMax      int           `envconfig:"OPTIMIZER_MAX" default:"100" desc:"the highest limit the optimizer gives a link"`
	OptimizerStart    int           `envconfig:"OPTIMIZER_START" default:"10" desc:"a new link's limit (also after a restart)"`
	OptimizerInterval time.Duration `envconfig:"OPTIMIZER_INTERVAL" default:"10s" desc:"how often each link's limit is decided"`
	MaxPrepared       int           `envconfig:"MAXPREPARED" default:"200" desc:"staged source copies a share may hold (a DTR that outranks all of them may stage beyond it)"`
	MaxTransferTries  int           `envconfig:"MAXTRANSFERTRIES" default:"10" desc:"attempts per DTR"`
	RetryBase         time.Duration `envconfig:"RETRY_BASE" default:"10s" desc:"retry delay unit: RETRY_BASE·k² after k attempts"`
	Lease             time.Duration `envconfig:"LEASE" default:"2m" desc:"how long a grant lives without a sign of life from its worker"`
	Tick              time.Duration `envconfig:"TICK" default:"50ms" desc:"scheduling loop period"`
	AgeAfter          time.Duration `envconfig:"AGE_AFTER" default:"1h" desc:"how long a DTR waits in a queue before its priority starts to rise"`
	AgeEvery          time.Duration `envconfig:"AGE_EVERY" default:"5m" desc:"then its priority rises by 1 this often while it is below its queue's head"`
	// AgeAfterStates sets AgeAfter for some queue states, laid over ARC's
	// own deadlines (agedeadlines.go); core.ParseAgeAfterStates reads it.
	AgeAfterStates string `envconfig:"AGE_AFTER_STATES" desc:"per-state AGE_AFTER, STATE=duration,... for queue states, laid over ARC's deadlines (CHECK_CACHE=24h: a day until a cacheable DTR's cache is checked; TRANSFER=2h): a state not named keeps ARC's deadline, or AGE_AFTER if ARC gives it none. For AGE_AFTER everywhere, name CHECK_CACHE and TRANSFER with AGE_AFTER's value"`
	// CacheWaitTimeout is how long a DTR waits in CACHE_WAIT for another's
	// download of its file before it fetches the file itself.
	CacheWaitTimeout time.Duration `envconfig:"CACHE_WAIT_TIMEOUT" default:"24h" desc:"how long a DTR waits in CACHE_WAIT for another DTR's download of the same file into the cache before it gives up on the cache and fetches the file itself (ARC's day); must be positive"`
	// Heartbeat is how often workers send heartbeats (SLUICE_HEARTBEAT,
	// shared with them; internal/app sets it): the interval the scheduler
	// expects of one whose heartbeat does not say its own. 0:
	// worker.DefaultHeartbeat.
	Heartbeat time.Duration `ignored:"true"`
	// Cache says processors keep a cache of downloads (SLUICE_CACHE_DIR is
	// set); internal/app sets it.
	Cache bool `ignored:"true"`
	// StateFile, if set, is rewritten every second in ARC's dtr.state
	// format, and StateFile.prio is read for priority changes.
	StateFile string `envconfig:"STATE_FILE" desc:"dtr.state file rewritten every second (ARC format); its .prio file changes priorities"`
	// StreamReplicas is the replica count of the streams, consumers and
	// buckets that the scheduler sets up.
	// LeaderTTL and Name are for the leader election (leader.go).
	LeaderTTL      time.Duration `envconfig:"LEADER_TTL" default:"3s" desc:"how long the leader's key lives unless renewed (every third of it): a standby takes over this long after a leader dies without resigning; a leader that could not renew steps down a quarter of it earlier"`
	Name           string        `envconfig:"SCHEDULER_NAME" desc:"the name this scheduler gives in the leader election and on the web page (default: the host name)"`
	StreamReplicas int           `envconfig:"STREAM_REPLICAS" default:"1" desc:"copies of every stream, consumer and bucket that the scheduler sets up: 1 on a single NATS server, 3 on a 3-node cluster"`
	// Retention is how long the record of a final DTR, and an ended job's
	// records, are kept.
	Retention time.Duration `envconfig:"RETENTION" default:"720h" desc:"how long the record of a final DTR (bucket sluice_dtrs) and an ended job's records (sluice_jobs) are kept (720h: 30 days); 0 keeps them for ever. Past it the id is unknown: submitted again, it runs again. Needs NATS 2.11 or later"`
	// HistoryOff turns off the recording of every DTR's history
	// (history.go).
	HistoryOff bool `envconfig:"HISTORY_OFF" default:"false" desc:"true: record no DTR's history (sluice history, the web page's timeline) in SLUICE_HISTORY; recording costs about a ninth more CPU a DTR, and an eighth of the throughput, on 1 KiB files at thousands a second (BENCHMARKS.md), little on real transfers"`
	// The most bytes each stream and bucket may hold (bus.Limits).
	StoreLimits
	// CheckpointEvery and CheckpointRecords say how often the records in
	// the journal are checkpointed into the sluice_dtrs bucket (journal.go).
	CheckpointEvery   time.Duration `envconfig:"CHECKPOINT_EVERY" default:"5s" desc:"how often the DTR records of the scheduler's journal are put in the sluice_dtrs bucket (each changed DTR once) and the journal purged; a restart replays what is left"`
	CheckpointRecords int           `envconfig:"CHECKPOINT_RECORDS" default:"20000" desc:"checkpoint sooner once this many DTRs have changed since the last one"`
	// RestoreHeads is how many DTRs at the head of each share's queue
	// the restart index names (restoreindex.go).
	RestoreHeads int `envconfig:"RESTORE_HEADS" default:"64" desc:"a restarted scheduler leads once it has read, of its stored DTRs, those holding slots and this many at the head of each share's queue in each state (an index stored with each checkpoint names them), and reads the rest meanwhile; a share waits when these run out, and new submissions until all are read. 0: no index, every stored DTR is read before leading"`
	// Meter takes the service's metrics (nil: the global meter provider's).
	Meter metric.Meter `ignored:"true"`
	// Callers establishes who sent each message (admit.go); nil knows no
	// users, administrators or token issuers.
	Callers *auth.Resolver `ignored:"true"`
	// FileRoots are the directories file:// URLs must lie under
	// (SLUICE_FILE_ROOTS); internal/app sets them.
	FileRoots []string `ignored:"true"`
	// StorageTokens says whether the tokens DTRs are submitted with are
	// kept for their storage tokens, and how long transfers are expected
	// to take (tokens.go); internal/app sets it.
	StorageTokens StorageTokens `ignored:"true"`
	OwnerLimits
}

// CoreConfig turns the service configuration into the core's.
func (c Config) CoreConfig() (core.Config, error) {
	cc := core.DefaultConfig()
	p, err := core.ParseSharePolicy(c.SharePolicy)
	if err != nil {
		return cc, err
	}
	cc.SharePolicy = p
	cc.SharePriority, err = api.ParseSharePriorities(c.SharePriority)
	if err != nil {
		return cc, err
	}
	if cc.ActivityWeights, err = core.ParseActivityWeights(c.ActivityShares); err != nil {
		return cc, fmt.Errorf("SLUICE_ACTIVITY_SHARES: %w", err)
	}
	if cc.ActivityWeights != nil && !p.HasActivity() {
		return cc, fmt.Errorf("SLUICE_ACTIVITY_SHARES is set but share policy %q does not name activities: use one with +activity, such as voms:vo+activity, or activity", p)
	}
	if pol := strings.ToLower(strings.TrimSpace(c.Policy)); p.HasActivity() && pol != "" && pol != "arc" {
		return cc, fmt.Errorf("share policy %q names activities, but policy %q names its own groups, without them: activity shares need the arc policy (activity limits work under any)", p, c.Policy)
	}
	if cc.ActivityLimits, err = core.ParseActivityLimits(c.ActivityLimits); err != nil {
		return cc, fmt.Errorf("SLUICE_ACTIVITY_LIMITS: %w", err)
	}
	if c.MaxActivitiesPerIdentity < 0 {
		return cc, fmt.Errorf("SLUICE_ACTIVITY_MAX_PER_IDENTITY: %d is negative; give at least 1 (0 means the default, 16)", c.MaxActivitiesPerIdentity)
	}
	cc.MaxActivitiesPerIdentity = c.MaxActivitiesPerIdentity
	cc.MaxProcessor, cc.MaxDelivery, cc.MaxEmergency = c.MaxProcessor, c.MaxDelivery, c.MaxEmergency
	cc.MaxPrepared, cc.MaxPerHost, cc.PreferredPattern = c.MaxPrepared, c.MaxPerHost, c.PreferredPattern
	cc.Cache = c.Cache
	cc.ChainPreClean = c.ChainPreClean
	if c.MaxPerHost < 0 {
		return cc, fmt.Errorf("maxperhost %d is negative", c.MaxPerHost)
	}
	if cc.Optimizer, err = c.optimizerConfig(); err != nil {
		return cc, err
	}
	cc.MaxTransferTries, cc.RetryBase, cc.Lease = c.MaxTransferTries, c.RetryBase, c.Lease
	cc.AgeAfter, cc.AgeEvery = c.AgeAfter, c.AgeEvery
	if cc.AgeAfterState, err = ageAfterStates(c.AgeAfterStates); err != nil {
		return cc, err
	}
	if cc.CacheWaitTimeout, err = cacheWaitTimeout(c.CacheWaitTimeout); err != nil {
		return cc, err
	}
	cc.Policy, err = fairshare.Make(c.Policy, c.Settings, fairshare.Slots{Processor: c.MaxProcessor, Delivery: c.MaxDelivery})
	return cc, err
}

// Service is a running scheduler.
type Service struct {
	cfg     Config
	nc      *nats.Conn
	js      jetstream.JetStream
	core    *core.Core
	log     *slog.Logger
	queries chan *loopRequest
	// finished remembers recently finished DTRs (finishedSpan) so that a
	// redelivered submit of one is not run again.
	finished *recentIDs
	// gatherFor, if set, replaces gatherFinalsFor (tests hold final DTRs
	// for longer, to see them held).
	gatherFor time.Duration
	// historyCoalesce, if set, replaces historyCoalesce (tests gather a
	// writer's steps for longer, and hold them at most as long).
	historyCoalesce time.Duration
	stopped         chan struct{}
	mon             *monitor
	ready           atomic.Bool
	// looped is when the scheduling loop last came round (Unix ns).
	looped atomic.Int64
	// maxDTR is the largest DTR taken from dtr.submit (bus.MaxDTRBytes).
	maxDTR int
	// journal makes every step's changes durable (journal.go).
	journal *journal
	// stored has the id of every DTR with a record (seen.go).
	stored seen
	// While the stored DTRs are read in the background after a restart
	// (restoreindex.go), loads brings them and stopLoading stops it;
	// loaded is closed once every one is read. restPending says the
	// reading is still to begin (readRest).
	loads       <-chan loadChunk
	stopLoading func()
	loaded      chan struct{}
	restPending bool
	// indexAt is when the leader last handed the journal an index.
	indexAt time.Time
	// far are the DTRs that index named whose records lie far from the
	// checkpoint bucket's end, to store again (storeNearEnd).
	far []uuid.UUID
	// longestAt is when the longest-waiting DTRs were last looked up.
	longestAt time.Time
	longest   []Waiting
	// leases stops the core's lease clock while the scheduler cannot hear
	// the workers (leases.go).
	leases *leaseClock
	// parked holds the changes asked while the committer was busy with
	// the store not full (hand); the loop answers them next.
	parked []*loopRequest
	// workers are the worker processes heard from (workers.go).
	workers *workerTracker
	// name is its name in the election (Config.Name, or the host name).
	name string
	// kv is the checkpoint bucket; election this scheduler's part in
	// the leader election, term the term it leads (0 while it stands by),
	// role what it is now (roleStandby, roleLeader; empty while starting).
	kv       jetstream.KeyValue
	election *election
	// keeper keeps submitters' tokens (nil: they are not kept); rates
	// are the links' recent throughputs (tokens.go).
	keeper *tokenKeeper
	rates  *linkRates
	term   atomic.Uint64
	role   atomic.Value
	// campaignLogged is when a failed campaign was last logged.
	campaignLogged time.Time
	// history records every DTR's history, stuck finds stuck DTRs, both
	// at each sweep (history.go, stuck.go).
	history       *historyRecorder
	historyStats  *historyStats
	historyWriter atomic.Pointer[historyWriter]
	stuck         *stuckDetector
	// sweptAt is when the last sweep began; pass is the sweep under way
	// (nil: none), passHeld the history events it recorded so far.
	sweptAt  time.Time
	pass     *core.Pass
	passHeld int
}

// The roles a scheduler has in the election.
const (
	roleStandby = "standby"
	roleLeader  = "leader"
)

// New checks the configuration and prepares a scheduler on nc.
func New(cfg Config, nc *nats.Conn, log *slog.Logger) (*Service, error) {
	cc, err := cfg.CoreConfig()
	if err == nil {
		err = cfg.Limits().Check()
	}
	if err != nil {
		return nil, fmt.Errorf("scheduler config: %w", err)
	}
	if msg := ageAfterNotFollowed(cc); msg != "" {
		log.Warn(msg, "service", "scheduler")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	if cfg.Tick <= 0 {
		cfg.Tick, _ = time.ParseDuration(tagDefault("Tick"))
	}
	s := &Service{
		cfg: cfg, nc: nc, js: js, core: core.New(cc), log: log.With("service", "scheduler"),
		queries: make(chan *loopRequest), finished: newRecentIDs(finishedSpan(cfg.Retention)), stopped: make(chan struct{}),
		mon: newMonitor(cmp.Or(cfg.Policy, fairshare.Default)), rates: newLinkRates(),
	}
	s.leases = newLeaseClock(nc, js, s.core, s.log, cfg.Tick)
	s.workers = newWorkerTracker(cfg.Heartbeat, cfg.Lease)
	if s.name = cfg.Name; s.name == "" {
		s.name, _ = os.Hostname()
	}
	meter := cfg.Meter
	if meter == nil {
		meter = otel.GetMeterProvider().Meter("github.com/sluice-dtr/sluice/services/scheduler")
	}
	s.historyStats, s.stuck = &historyStats{}, newStuckDetector(s.log, cc.DeadlineFor)
	s.history = &historyRecorder{dropped: &s.historyStats.droppedQueue}
	if err := s.registerMetrics(meter); err != nil {
		return nil, err
	}
	if err := s.registerActivityMetrics(meter); err != nil {
		return nil, err
	}
	if err := s.registerHistoryMetrics(meter); err != nil {
		return nil, err
	}
	return s, nil
}

// Run takes part in the leader election until ctx ends: it stands by
// with a warm copy of the leader's state (standby.go) and, once it has won
// a term (leader.go), schedules until ctx ends or it is deposed, when it
// starts over as a standby.
func (s *Service) Run(ctx context.Context) error {
	defer close(s.stopped)
	if err := s.setUp(ctx); err != nil {
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
	s.journal = newJournal(s.js, s.kv, s.log, int(s.nc.MaxPayload())/2, every, atMost)
	s.journal.retention = s.cfg.Retention
	s.journal.indexed = s.cfg.RestoreHeads > 0
	heartbeats, err := s.hearWorkers()
	if err != nil {
		return fmt.Errorf("scheduler: %w", err)
	}
	defer func() { _ = heartbeats.Unsubscribe() }()
	// Whatever ends a term (deposed, a commit that failed, NATS gone
	// while it stood by) starts it over: the records in NATS are the
	// state, and the copy is built again from them. Failures in a row
	// wait longer, up to half a second.
	wait := bus.Backoff{Min: 50 * time.Millisecond, Max: 500 * time.Millisecond}
	var logged time.Time
	for {
		began := time.Now()
		err := s.runTerm(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(began) > time.Minute {
			wait.Reset()
		}
		if errors.Is(err, errDeposed) || errors.Is(err, errResync) || time.Since(logged) > 30*time.Second {
			logged = time.Now()
			s.log.Warn("starting over as a standby", "err", err)
		}
		s.reset()
		if !errors.Is(err, errDeposed) && !wait.Sleep(ctx) {
			return nil
		}
	}
}

// runTerm builds the standby's copy, stands by until this scheduler wins
// a term, and leads until ctx ends or it is deposed.
func (s *Service) runTerm(ctx context.Context) error {
	tail, err := s.warmUp(ctx)
	if err != nil {
		return err
	}
	defer tail.cc.Stop()
	s.ready.Store(true)
	defer s.ready.Store(false)
	s.role.Store(roleStandby)
	term, err := s.standBy(ctx, tail)
	if err != nil {
		return err
	}
	defer s.election.resign(context.WithoutCancel(ctx))
	return s.lead(ctx, term)
}

// reset forgets the copy and the state of a term lost, to build them
// again.
func (s *Service) reset() {
	cc, _ := s.cfg.CoreConfig() // checked by New
	s.core = core.New(cc)
	s.leases = newLeaseClock(s.nc, s.js, s.core, s.log, s.cfg.Tick)
	s.finished = newRecentIDs(finishedSpan(s.cfg.Retention))
	s.stored = seen{}
	s.journal.reset()
	if s.stopLoading != nil {
		s.stopLoading()
	}
	s.loads, s.stopLoading, s.restPending = nil, nil, false
	s.parked, s.far = nil, nil
	s.term.Store(0)
	s.stuck.reset()
	s.stopSweep()
	s.longest = nil
	s.history.last, s.history.more, s.history.swept = nil, nil, false
}

// lead schedules as the leader of term until ctx ends or it is deposed.
func (s *Service) lead(ctx context.Context, term uint64) error {
	s.term.Store(term)
	s.election.me.Term = term
	deposed := make(chan error, 2)
	s.journal.Deposed(deposed)
	s.log.Info("leading", "term", term, "dtrs", s.core.Len())
	s.role.Store(roleLeader)
	defer s.role.Store(roleStandby)
	defer s.stopSweep()
	// Changes asked and parked when the term ends are answered: the
	// scheduler stops leading.
	defer func() {
		for _, q := range s.parked {
			q.err = errStopped
			close(q.done)
		}
		s.parked = nil
	}()
	// The renewals stop, and are waited for, before runTerm resigns.
	var keeping sync.WaitGroup
	defer keeping.Wait()
	lctx, stopLeading := context.WithCancel(ctx)
	defer stopLeading()
	keeping.Go(func() { s.election.keepLeading(lctx, deposed, s.log) })
	// The restored grants' workers may have said more than the stored
	// records know: no lease runs out before that is taken.
	s.leases.stop(time.Now(), "this scheduler took over")
	ctx, cancel := context.WithCancel(ctx) // stops the consumers when lead returns
	defer cancel()
	// Results (and progress) come before submissions: they free slots
	// and move DTRs on, while a burst of new DTRs only fills queues.
	submits, results := make(chan jetstream.Msg, 4096), make(chan jetstream.Msg, 4096)
	loaded := s.loaded
	for src, in := range map[string]chan jetstream.Msg{bus.StreamSubmit: submits, bus.StreamResults: results} {
		// What the last leader took and never acknowledged comes back at
		// once, not after the consumer's acknowledgement wait.
		if err := bus.ResetConsumer(ctx, s.js, src, bus.ConsumerSched, s.setup()); err != nil {
			return fmt.Errorf("scheduler: %w", err)
		}
		cons, err := s.js.Consumer(ctx, src, bus.ConsumerSched)
		if err != nil {
			return fmt.Errorf("scheduler: consumer on %s: %w", src, err)
		}
		go func() {
			if src == bus.StreamSubmit {
				// New DTRs wait in their stream while the stored ones
				// are read: a resubmission is told from a new DTR by
				// the DTRs stored.
				select {
				case <-loaded:
				case <-ctx.Done():
					return
				}
			}
			_ = bus.Each(ctx, cons, 1000, func(m jetstream.Msg) {
				if s.election.lapsed(time.Now()) {
					// Taken after the term may have passed (a frozen leader
					// resumed): delivered again at once, to whoever leads.
					_ = m.Nak()
					return
				}
				select {
				case in <- m:
				case <-ctx.Done():
					_ = m.Nak()
				}
			})
		}()
	}
	// What was taken and not yet stepped on when the term ends goes back
	// at once to be delivered again.
	defer func() {
		for _, in := range []chan jetstream.Msg{submits, results} {
			for {
				select {
				case m := <-in:
					_ = m.Nak()
					continue
				default:
				}
				break
			}
		}
	}()
	kv := s.kv

	tick := time.NewTicker(s.cfg.Tick)
	defer tick.Stop()
	var dump <-chan time.Time
	if s.cfg.StateFile != "" {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		dump = t.C
		defer s.writeState()
	}
	stopHistory := s.writeHistory(ctx)
	defer stopHistory()
	sample := time.NewTicker(time.Second)
	defer sample.Stop()
	s.sample(time.Now())
	// The final DTRs the last leader may not have announced, taken from
	// the journal before the committer can begin a checkpoint.
	kept, err := s.keptFinals(ctx, time.Now())
	if err != nil {
		return fmt.Errorf("scheduler: %w", err)
	}
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
	if kept != nil && !s.hand(ctx, commits, kept) {
		return nil
	}
	// Served while this scheduler leads, and stopped first as it stops
	// leading, before the committer is waited for.
	svc, err := s.addAPI()
	if err != nil {
		return err
	}
	defer svc.Stop()
	var batch []jetstream.Msg
	for {
		batch = batch[:0]
		s.looped.Store(time.Now().UnixNano())
		if len(s.parked) > 0 { // changes asked while the committer was busy
			q := s.parked[0]
			s.parked = s.parked[1:]
			if stop, err := s.answer(ctx, kv, commits, q); stop || err != nil {
				return err
			}
			continue
		}
		if now := time.Now(); s.election.lapsed(now) {
			// Frozen, say, past the term: found out before the next step
			// (keepLeading says so too, a moment later).
			return fmt.Errorf("%w: no renewal of the leader key succeeded before %s", errDeposed, s.election.holdsUntil().Format(time.RFC3339Nano))
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-deposed:
			return err
		case err := <-failed:
			// What was not acknowledged is redelivered: a restart
			// recovers from the last durable state.
			return fmt.Errorf("scheduler: %w", err)
		case now := <-sample.C:
			s.sample(now)
			continue
		case lc, ok := <-s.loads:
			if err := s.takeLoaded(lc, ok); err != nil {
				return err
			}
			continue
		case q := <-s.queries:
			if stop, err := s.answer(ctx, kv, commits, q); stop || err != nil {
				return err
			}
			continue
		case <-dump:
			if !s.core.Loading() {
				// Not while it still reads its DTRs: a priority line for
				// one not yet read would be lost, and the state file
				// would list only those read.
				s.applyPriorityFile()
				s.writeState()
			}
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
		for _, r := range s.journal.TakeRecorded() {
			s.core.Recorded(r.id, r.seq) // where the index says to fetch it from
		}
		if now := time.Now(); now.Sub(s.indexAt) >= indexEvery && s.journal.WantIndex() {
			// The core as this step left it: its journal sequence is
			// known once the step is journaled.
			s.indexAt = now
			var ix core.Index
			c.index, ix = s.indexOf()
			s.far = farFromEnd(ix, s.core.RecordedUpTo())
		}
		if err := s.storeNearEnd(c); err != nil {
			return fmt.Errorf("scheduler: %w", err)
		}
		if !s.hand(ctx, commits, c) {
			return nil
		}
		s.readRest(ctx)
	}
}

// answer runs a query in the loop. A change is stored and its effects
// published before the caller hears it is done. stop says the loop ends.
func (s *Service) answer(ctx context.Context, kv jetstream.KeyValue, commits chan<- *commit, q *loopRequest) (stop bool, err error) {
	if q.change && s.core.Loading() {
		s.answerAside(q, errLoading)
		return false, nil
	}
	q.f()
	if !q.change {
		close(q.done)
		return false, nil
	}
	c, err := s.step(ctx, kv, nil)
	if err != nil {
		q.err = err
		close(q.done)
		if ctx.Err() != nil {
			return true, nil
		}
		return true, fmt.Errorf("scheduler: %w", err)
	}
	c.done = func(err error) { q.err = err; close(q.done) }
	return !s.hand(ctx, commits, c), nil
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

// setup is how the scheduler sets up streams, consumers and buckets.
func (s *Service) setup() bus.Setup {
	return bus.Setup{Replicas: s.cfg.StreamReplicas, ExpiringRecords: s.cfg.Retention > 0,
		Limits: s.cfg.Limits(), LeaderTTL: s.cfg.LeaderTTL, SubjectTokenTTL: s.cfg.StorageTokens.TTL}
}

// openBuckets opens the buckets the scheduler keeps its records, its
// leader and the submitters' tokens in.
func (s *Service) openBuckets(ctx context.Context) error {
	kv, err := s.js.KeyValue(ctx, bus.BucketDTRs)
	if err != nil {
		return err
	}
	lkv, err := s.js.KeyValue(ctx, bus.BucketLeader)
	if err != nil {
		return err
	}
	if s.cfg.StorageTokens.Keep {
		tkv, err := s.js.KeyValue(ctx, bus.BucketSubjectTokens)
		if err != nil {
			return err
		}
		s.keeper = newTokenKeeper(tkv, s.cfg.StorageTokens.TTL)
	}
	s.kv, s.election = kv, newElection(lkv, s.cfg.LeaderTTL, s.name)
	return nil
}

// setUp creates or checks every stream, consumer and bucket (bus.Ensure)
// and opens the buckets (openBuckets).
// While NATS cannot be reached or its JetStream is not ready (a scheduler
// started before its server, or while it restarts, when a bucket just
// checked may not be found or answer in time) it tries again after
// 50 ms, backing off to 2 s, as the other roles wait in bus.Await; it
// logs the first failure and then one every 30 s. A refusal by the server
// (a stream with other settings that it will not change, say) is returned
// at once, and so is the end of ctx.
func (s *Service) setUp(ctx context.Context) error {
	wait := bus.Backoff{Min: 50 * time.Millisecond, Max: 500 * time.Millisecond}
	var logged time.Time
	for {
		err := bus.Ensure(ctx, s.js, s.setup())
		if err == nil {
			err = s.openBuckets(ctx)
		}
		if err == nil {
			return nil
		}
		// 503: no JetStream yet; 10126: a consumer's copies exceed its
		// stream's while the stream is still being given more (a move
		// to a cluster).
		var api *jetstream.APIError
		if ctx.Err() != nil || errors.As(err, &api) && api.Code != 503 && api.ErrorCode != 10126 {
			return err
		}
		if time.Since(logged) > 30*time.Second {
			logged = time.Now()
			s.log.Warn("cannot set up streams, consumers and buckets; trying again", "err", err)
		}
		if !wait.Sleep(ctx) {
			return err
		}
	}
}

// step applies a batch of inputs, lets time pass and returns what makes
// the decisions durable and visible and then acknowledges the inputs.
func (s *Service) step(ctx context.Context, kv jetstream.KeyValue, batch []jetstream.Msg) (*commit, error) {
	now := time.Now()
	s.leases.step(now)
	if s.nc.Status() != nats.CONNECTED {
		s.workers.deafAt(now) // heartbeats are lost meanwhile: none is missed
	}
	c := &commit{}
	subs := map[jetstream.Msg]submitted{} // each submit decoded once
	for _, m := range batch {
		if api.InSubjectOf(m.Subject(), api.SubjectSubmit) {
			var sub submitted
			sub.caller, sub.err = s.caller(ctx, api.SubjectSubmit, m.Subject(), m.Headers())
			if sub.err == nil {
				sub.dtrs, sub.err = DecodeSubmits(ctx, bus.Msg(m), s.maxDTR)
			}
			if sub.err == nil {
				s.keepToken(ctx, now, m.Headers(), &sub)
			}
			subs[m] = sub
		}
	}
	taken, err := s.takenBefore(ctx, now, kv, subs)
	if err != nil {
		return nil, err
	}
	for _, m := range batch {
		if err := s.handle(ctx, now, m, c, subs[m], taken); err != nil {
			c.terms = append(c.terms, m)
		} else {
			c.acks = append(c.acks, m)
		}
	}
	s.leases.resume(ctx, now)
	s.core.Tick(now)
	dec := s.core.Take()
	c.events = s.history.step(now, s.core, dec.Changed, dec.Chained, s.term.Load())

	// The records of changed DTRs, encoded now: the core changes them
	// after this step.
	encoded := make(map[uuid.UUID][]byte, len(dec.Changed)) // reused in grants
	for i := range dec.Changed {
		d := dec.Changed[i]
		b, err := codec.EncodeJSON(d)
		if err != nil {
			return nil, fmt.Errorf("encode DTR %s: %w", d.ID, err)
		}
		encoded[d.ID] = b
		if d.State.Final() {
			c.finals = append(c.finals, record{id: d.ID, data: b, final: true})
		} else {
			c.records = append(c.records, record{id: d.ID, data: b})
		}
		c.changes = append(c.changes, api.StateChange{
			DTR: d.ID, JobID: d.JobID, State: d.State, Share: d.Share, Priority: d.Priority})
	}
	grants, err := s.grants(ctx, dec.Grants, encoded)
	if err != nil {
		return nil, err
	}
	c.publish = append(c.publish, grants...)
	// The final DTRs go out with those of the steps around it (commitLoop).
	if c.announce, err = s.finalEntries(ctx, now, dec.Final, encoded, true); err != nil {
		return nil, err
	}
	// Best-effort notices: workers to stop (at once), observers of state
	// changes (c.changes, sent with those of the steps settled with it).
	// With no unfinished DTR left, final DTRs would gather for nothing.
	c.now = len(dec.CancelRunning) > 0 || len(c.announce) > 0 && s.core.Len() == 0
	for _, g := range dec.CancelRunning {
		if m := notice(ctx, api.SubjectStopPrefix+g.ID, api.TypeStop, api.Stop{DTR: g.DTR.ID, Grant: g.ID, Term: s.term.Load()}); m != nil {
			c.notices = append(c.notices, m)
		}
	}
	return c, nil
}

// sample records the scheduler's state for the web page and the metrics,
// and goes on with the sweep (stuck.go). The longest-waiting DTRs are
// looked up every second, walking every queue, or, with more than
// longestWalk DTRs, found by each of the leader's sweeps on its way (a
// standby then shows none).
func (s *Service) sample(now time.Time) {
	switch {
	case s.core.Len() <= longestWalk && now.Sub(s.longestAt) >= time.Second:
		s.longestAt = now
		s.setLongest(now, s.core.Longest(longestShown))
	case s.core.Len() > longestWalk && s.role.Load() != roleLeader:
		s.longest = nil // a standby does not sweep
	}
	workers := s.workers.list(now)
	for i := range workers {
		current(s.core, now, &workers[i])
	}
	s.mon.sample(now, s.core, s.longest, silentGrants(s.core, now, s.workers.holders(now), nil), workers)
	if s.pass != nil || now.Sub(s.sweptAt) >= sweepEvery(s.core.Len()) {
		if s.pass == nil {
			s.sweptAt = now
		}
		s.sweepSome(now, sweepSlice)
	}
}

// longestShown is how many of the longest-waiting DTRs the web page
// shows; longestWalk is the most DTRs over which they are found by walking
// every queue at each sample.
const (
	longestShown = 10
	longestWalk  = 100_000
)

// setLongest sets the longest-waiting DTRs shown to ids, with why each
// waits.
func (s *Service) setLongest(now time.Time, ids []uuid.UUID) {
	s.longest = s.longest[:0:0]
	for _, id := range ids {
		d, _ := s.core.Get(id)
		w, err := s.core.Explain(now, id)
		if err != nil {
			continue
		}
		s.longest = append(s.longest, Waiting{Why: w, Since: d.Updated, Created: d.Created, JobID: d.JobID, Source: dtr.RedactURL(d.Source)})
	}
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

// writeState rewrites StateFile, with the host of each transfer's
// deliverer as its workers' heartbeats say.
func (s *Service) writeState() {
	holders := s.workers.holders(time.Now())
	hostOf := func(grant string) string { return holders[grant].holder.Host }
	if err := WriteFileAtomic(s.cfg.StateFile, StateLines(s.core.DTRs(), hostOf)); err != nil {
		s.log.Error("state file", "err", err)
	}
}

// finishedSpan is how long, between one and two times, finished DTRs are
// remembered: twice JetStream's 2-minute windows, or less than a shorter
// retention, past which a DTR submitted again runs again.
func finishedSpan(retention time.Duration) time.Duration {
	span := 2 * time.Minute
	if retention > 0 {
		span = min(span, max(retention/2, time.Second))
	}
	return span
}

// takenBefore finds the submitted DTRs of a batch whose ids were taken
// before: held by the core, finished, or with a stored record. A
// resubmission of any of them does not run again. Each maps to the DTR
// that took the id, where it can be read (nil where not), so that a
// different DTR under the same id is refused. The look-ups run in
// parallel.
func (s *Service) takenBefore(ctx context.Context, now time.Time, kv jetstream.KeyValue, subs map[jetstream.Msg]submitted) (map[uuid.UUID]*dtr.DTR, error) {
	var ids []uuid.UUID
	taken := make(map[uuid.UUID]*dtr.DTR)
	for _, sub := range subs {
		for _, e := range sub.dtrs {
			if e.Err != nil {
				continue
			}
			id := e.DTR.ID
			if _, ok := taken[id]; ok {
				continue
			}
			if d, ok := s.core.Get(id); ok {
				taken[id] = &d // it may finish within this batch
				continue
			}
			if s.finished.Has(id, now) {
				taken[id] = nil // finished lately: its record is read below
			} else if !s.stored.MayHave(id) {
				continue // never stored: new
			}
			if b, ok := s.journal.Lookup(id); ok {
				taken[id] = decodeRecord(b) // finished, not yet checkpointed
				continue
			}
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return taken, nil
	}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for _, id := range ids {
		g.Go(func() error {
			e, err := kv.Get(gctx, id.String())
			switch {
			case err == nil:
				d := decodeRecord(e.Value())
				mu.Lock()
				taken[id] = d
				mu.Unlock()
			case !errors.Is(err, jetstream.ErrKeyNotFound):
				return fmt.Errorf("look up DTR %s: %w", id, err)
			}
			return nil
		})
	}
	return taken, g.Wait()
}

// decodeRecord reads a stored DTR record; nil if it cannot be read.
func decodeRecord(b []byte) *dtr.DTR {
	d := new(dtr.DTR)
	if codec.DecodeJSON(b, d) != nil {
		return nil
	}
	return d
}

// handle applies one consumed message to the core. Bad input is answered
// with a rejection event on out and an error; it changes nothing else.
func (s *Service) handle(ctx context.Context, now time.Time, jm jetstream.Msg, out *commit, sub submitted, taken map[uuid.UUID]*dtr.DTR) error {
	m := bus.Msg(jm)
	switch {
	case api.InSubjectOf(m.Subject, api.SubjectSubmit):
		if sub.err != nil {
			s.reject(ctx, out, m, jm, sub.err)
			return sub.err
		}
		for i, e := range sub.dtrs {
			err := e.Err
			holds := false // a new DTR that will hold its kept token
			if err == nil {
				e.DTR.Owner = sub.caller.Owner(e.DTR.Owner)
				if _, again := taken[e.DTR.ID]; !again {
					err = s.admit(sub.caller, e.DTR) // one taken before is acknowledged as before
					e.DTR.SubmittedWithToken = sub.withToken
					if sub.tokenOwner == "" || sub.tokenOwner == e.DTR.Owner.DN {
						e.DTR.TokenRef = sub.tokenRef
					}
					holds = e.DTR.TokenRef != ""
					if err == nil && sub.withToken && e.DTR.TokenRef == "" {
						s.log.Warn("a DTR submitted with a token is admitted without it: its transfers that need a storage token will fail, not run with Sluice's own credentials",
							"dtr", e.DTR.ID, "job", e.DTR.JobID)
					}
				}
			}
			if err == nil {
				err = s.submit(ctx, now, m, e.DTR, e.TraceParent, taken)
			}
			if err == nil {
				if holds {
					s.keeper.hold(e.DTR.TokenRef)
				}
				continue
			}
			if len(sub.dtrs) == 1 && e.Data == nil {
				s.reject(ctx, out, m, jm, err) // the message was this DTR
				return err
			}
			// One DTR of several is refused alone; the others go on.
			s.rejectEntry(ctx, out, m, jm, i, e.Data, err)
		}
	case m.Subject == api.SubjectCancelCommand:
		var c api.Cancel
		if _, err := codec.DecodeData(ctx, m, api.TypeCancel, &c); err != nil {
			s.reject(ctx, out, m, jm, err)
			return err
		}
		if err := s.core.Cancel(now, c.DTR); err != nil {
			s.log.Debug("cancel", "dtr", c.DTR, "err", err)
		}
	case strings.HasPrefix(m.Subject, api.SubjectResultPrefix):
		s.leases.took(jm)
		rs, err := codec.DecodeResults(ctx, m)
		if err != nil {
			s.reject(ctx, out, m, jm, err)
			return err
		}
		stage := dtr.Stage(strings.TrimPrefix(m.Subject, api.SubjectResultPrefix))
		s.history.resultsFrom(m.Header.Get("ce-source"), rs)
		for _, r := range rs {
			var span trace.Span
			if r.TraceParent != "" {
				_, span = tracing.StartConsumerOf(ctx, r.TraceParent, m.Subject, r.Grant+".result", "result")
			} else {
				_, span = tracing.StartConsumer(ctx, m, "result")
			}
			r.Stage = stage
			if span.IsRecording() {
				if d, ok := s.core.Get(r.DTR); ok {
					tracing.SetDTR(span, &d, stage)
				}
				tracing.SetResult(span, r.Bytes, r.Error)
			}
			err := s.core.Result(now, r)
			span.End()
			if err != nil {
				s.log.Info("result ignored", "dtr", r.DTR, "grant", r.Grant, "err", err)
			}
		}
	case strings.HasPrefix(m.Subject, api.SubjectProgressPrefix):
		s.leases.took(jm)
		var p api.Progress
		if _, err := codec.DecodeData(ctx, m, api.TypeProgress, &p); err != nil {
			s.reject(ctx, out, m, jm, err)
			return err
		}
		if err := s.core.Progress(now, p.DTR, p.Grant, p.Bytes); err != nil {
			s.log.Debug("progress ignored", "dtr", p.DTR, "err", err)
		} else {
			s.workers.renewed(dtr.Stage(strings.TrimPrefix(m.Subject, api.SubjectProgressPrefix)), p)
		}
	default:
		err := fmt.Errorf("no handler for subject %s", m.Subject)
		s.reject(ctx, out, m, jm, err)
		return err
	}
	return nil
}
