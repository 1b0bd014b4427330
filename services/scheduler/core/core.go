// Package core is the scheduler's algorithm: queues, shares, slot accounting,
// retries, leases and priority ageing as plain Go with no I/O. Time comes in
// as an argument to every call; decisions (grants, changed DTRs, cancels) are
// collected and handed to the caller by Take. The NATS, CloudEvents and
// telemetry plumbing lives in the scheduler service around it.
package core

import (
	"cmp"
	"container/heap"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// Config holds the scheduler's limits and policy (ARC's [arex/data-staging]
// options).
type Config struct {
	// Policy makes the fair-share scheme; nil means ARC's.
	Policy PolicyMaker
	// SharePolicy names shares for ARC's policy (and others that ask).
	SharePolicy SharePolicy
	// SharePriority gives configured share priorities (1–100) by share name
	// without the direction suffix; DefaultShare's entry, if any, is the
	// priority of every unconfigured share (else 50).
	SharePriority map[string]int
	// MaxProcessor limits each pre- and post-processing state separately.
	MaxProcessor int
	// MaxDelivery limits the TRANSFER state.
	MaxDelivery int
	// MaxEmergency is how many DTRs may run above the limit of a state, one
	// per share that has work queued and nothing running.
	MaxEmergency int
	// Cache says that processors keep a cache of downloads (ARC's cache):
	// a download of a remote file to a local destination is checked in it
	// first. CacheWait is how often a DTR waiting for another's download of
	// the same file looks again (default 2 s), and CacheWaitTimeout how
	// long it waits in all before it fetches the file itself (default a
	// day, as ARC's; see cacheWaitOver).
	Cache            bool
	CacheWait        time.Duration
	CacheWaitTimeout time.Duration
	// PreferredPattern orders a file's replicas (SortReplicas).
	PreferredPattern string
	// MaxPerHost is how many transfers may run at once against one storage
	// endpoint (the host of a remote source or destination), so that one
	// slow storage cannot hold every delivery slot; 0 means no limit.
	MaxPerHost int
	// MaxPrepared is how many staged (pinned) source copies a share may
	// hold; a DTR that outranks every staged DTR of its share may stage
	// beyond it (the highest-priority bypass).
	MaxPrepared int
	// MaxTransferTries is how many attempts a DTR gets.
	MaxTransferTries int
	// RetryBase is the unit of the retry delay RetryBase·k² after k attempts.
	RetryBase time.Duration
	// Lease is how long a grant stays valid without a sign of life.
	Lease time.Duration
	// AgeAfter is how long a DTR waits in a queue before ageing starts;
	// AgeEvery is how often its priority then rises by one.
	AgeAfter, AgeEvery time.Duration
	// AgeAfterState overrides AgeAfter for the DTRs queued for a state
	// (DefaultConfig has ARC's, DeadlineFor says which); nil: AgeAfter
	// for every state. See DeadlineFor.
	AgeAfterState map[dtr.State]time.Duration
	// ActivityWeights divide a share's priority between its activities
	// under an activity share policy (activities.go).
	ActivityWeights ActivityWeights
	// ActivityLimits cap the transfers of an activity at a source or a
	// destination endpoint (activitylimits.go).
	ActivityLimits []ActivityLimit
	// MaxActivitiesPerIdentity bounds the distinct activities that make
	// shares of their own for one identity without a weights table; the
	// rest go to "default". 0 means DefaultActivitiesPerIdentity.
	MaxActivitiesPerIdentity int
	// Optimizer tunes each link's concurrency (links.go); off when not
	// Enabled.
	Optimizer OptimizerConfig
	// ChainPreClean lets a QUERY_REPLICA grant hold the DTR's PRE_CLEAN
	// slot too when PRE_CLEAN can take it at once, so that one worker
	// does both steps under one grant (chain.go). Off in a zero Config
	// and DefaultConfig; the scheduler turns it on (SLUICE_CHAIN_PRECLEAN).
	ChainPreClean bool
}

// DefaultConfig returns A-REX's defaults.
func DefaultConfig() Config {
	return Config{
		MaxProcessor:             10,
		MaxDelivery:              10,
		MaxEmergency:             1,
		MaxPrepared:              200,
		MaxActivitiesPerIdentity: DefaultActivitiesPerIdentity,
		MaxTransferTries:         10,
		RetryBase:                10 * time.Second,
		Lease:                    2 * time.Minute,
		AgeAfter:                 time.Hour,
		AgeEvery:                 5 * time.Minute,
		AgeAfterState:            maps.Clone(arcAgeAfterState),
		CacheWaitTimeout:         24 * time.Hour,
	}
}

// Errors returned to callers; the edge turns them into rejections.
var (
	ErrDuplicate   = errors.New("DTR already known")
	ErrUnknownDTR  = errors.New("unknown DTR, or it has finished")
	ErrStaleResult = errors.New("result for a grant that is no longer current")
)

// Grant gives a DTR a slot in one state, and Result is a worker's outcome
// for a grant: the wire's shapes (pkg/api), so that a field added to either
// is added once.
type (
	Grant  = api.Grant
	Result = api.Result
)

// Decisions are what the core has decided since the last Take.
type Decisions struct {
	Grants []Grant
	// Changed holds every DTR whose record changed, to persist, and Final
	// the DTRs that reached DONE, CANCELLED or ERROR. Both point into the
	// core: read them before calling it again.
	Changed []*dtr.DTR
	Final   []*dtr.DTR
	// CancelRunning names grants whose workers should stop now.
	CancelRunning []Grant
	// Chained holds the PRE_CLEAN grants that chained grants' workers ran
	// (their slots held from the QUERY_REPLICA grant on) and whose
	// outcomes were applied since the last Take: each began and ended
	// within one result, so no record shows it; the history does.
	Chained []Grant
}

// Core is the scheduler's state machine. It is not safe for concurrent use.
type Core struct {
	cfg  Config
	dtrs map[uuid.UUID]*entry
	// epoch is the first time the core was told; entry times count from it
	// (so they keep the monotonic clock and stay small).
	epoch time.Time
	// cancelledJobs remembers the jobs cancelled as a whole, by job and
	// owner, so that the owner's DTRs of the job still on the way are
	// cancelled when they arrive.
	cancelledJobs map[string]time.Time
	// owners holds what each owner's unfinished DTRs hold, by DN.
	owners map[string]OwnerUse
	// names interns share names and DNs, which many DTRs have in common;
	// packed DTRs refer to them by number.
	names   []string
	nameIDs map[string]uint32
	// recordedUpTo is the latest stream sequence of a stored record the
	// core was told of (Recorded).
	recordedUpTo uint64
	scratch      []byte // pack's buffer
	// took holds, per queue state, a moving average of how long its grants
	// run, for estimating when a waiting DTR starts.
	took    map[dtr.State]time.Duration
	states  map[dtr.State]*stateQueues
	delayed delayQueue
	// pins holds each share's staged copies (pins.go).
	pins pinLedger
	// hosts counts the transfers running per storage endpoint (hosts.go).
	hosts hostLoad
	// activityLoad counts the transfers running per activity limit and
	// endpoint (activitylimits.go).
	activityLoad activityLoad
	// activitySeen bounds the activities of identities without a weights
	// table (activities.go).
	activitySeen activitySet
	// holds maps each hold with parked DTRs to the shares that have some
	// under it (parking.go).
	holds map[holdKey]map[*shareState]struct{}
	// parkClock counts parks made and DTRs put back, for the turns at a
	// hold (parking.go).
	parkClock uint64
	// back holds the DTRs put back from a hold and not yet granted or
	// parked again, and backAt counts them per hold (parking.go).
	back   map[*entry]holdKey
	backAt map[holdKey]int
	// links holds the per-link optimizer's state (links.go); nil when it
	// is off.
	links *linkSet
	// caching holds, per source URL, the DTR downloading it into the
	// cache (cache.go).
	caching cacheDownloads
	// cacheKeys holds the source under which each DTR in caching
	// downloads: it stays when the DTR moves on to another replica.
	cacheKeys map[*entry]string
	// policy weighs the shares; now is the time of the last tick, for
	// weighing outside one.
	policy Policy
	now    time.Time
	rand   *rand.Rand // for policies that draw lots; seeded, so runs repeat
	active map[uuid.UUID]*entry
	seq    uint64
	// lastStamp is the latest time a DTR came to a queue (entry.stamp).
	lastStamp int64
	nextAge   time.Time
	// limits holds the slot limits SetLimit set, plus one, by queue state
	// (0: the Config's).
	limits [256]int32
	// leasesPaused is when the lease clock stopped (zero: it runs): the
	// scheduler could not hear from workers since (leases.go).
	leasesPaused time.Time
	// leasesFrom is a time (nanos) no lease of an active DTR runs out
	// before: expireLeases looks at each active DTR only once it has
	// passed (setLease lowers it; expireLeases sets it anew).
	leasesFrom int64
	// loading is set while the core loads its DTRs in parts, and gone
	// holds the DTRs it let go meanwhile (load.go).
	loading bool
	gone    map[uuid.UUID]struct{}

	out   Decisions
	dirty []*entry // changed since the last Take, each once
	count Counts
}

// Counts are what the core has done since it was made, for metrics.
type Counts struct {
	// Grants counts grants given, EmergencyGrants those on emergency slots.
	Grants          uint64 `json:"grants"`
	EmergencyGrants uint64 `json:"emergency_grants"`
	// Retries counts failed attempts that are tried again, LeaseExpiries
	// grants whose worker stopped giving signs of life.
	Retries       uint64 `json:"retries"`
	LeaseExpiries uint64 `json:"lease_expiries"`
	// Done, Failed and Cancelled count DTRs that ended so.
	Done      uint64 `json:"done"`
	Failed    uint64 `json:"failed"`
	Cancelled uint64 `json:"cancelled"`
}

// Counts returns what the core has done since it was made.
func (c *Core) Counts() Counts { return c.count }

// New returns an empty core.
func New(cfg Config) *Core {
	def := DefaultConfig()
	if cfg.MaxProcessor <= 0 {
		cfg.MaxProcessor = def.MaxProcessor
	}
	if cfg.MaxDelivery <= 0 {
		cfg.MaxDelivery = def.MaxDelivery
	}
	if cfg.CacheWait <= 0 {
		cfg.CacheWait = 2 * time.Second
	}
	if cfg.CacheWaitTimeout <= 0 {
		cfg.CacheWaitTimeout = def.CacheWaitTimeout
	}
	if cfg.MaxPrepared <= 0 {
		cfg.MaxPrepared = def.MaxPrepared
	}
	if cfg.MaxEmergency < 0 {
		cfg.MaxEmergency = 0
	}
	if cfg.MaxTransferTries <= 0 {
		cfg.MaxTransferTries = def.MaxTransferTries
	}
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = def.RetryBase
	}
	if cfg.Lease <= 0 {
		cfg.Lease = def.Lease
	}
	if cfg.AgeAfter <= 0 {
		cfg.AgeAfter = def.AgeAfter
	}
	if cfg.AgeEvery <= 0 {
		cfg.AgeEvery = def.AgeEvery
	}
	c := &Core{
		cfg:           cfg,
		dtrs:          map[uuid.UUID]*entry{},
		nameIDs:       map[string]uint32{},
		cancelledJobs: map[string]time.Time{},
		owners:        map[string]OwnerUse{},
		took:          map[dtr.State]time.Duration{},
		states:        map[dtr.State]*stateQueues{},
		pins:          pinLedger{byShare: map[string]*sharePins{}, entries: map[*entry]struct{}{}, max: cfg.MaxPrepared},
		hosts:         hostLoad{running: map[uint32]int{}, max: cfg.MaxPerHost},
		activityLoad:  activityLoad{running: map[activityKey]int{}},
		links:         newLinkSet(cfg.Optimizer),
		caching:       cacheDownloads{},
		cacheKeys:     map[*entry]string{},
		active:        map[uuid.UUID]*entry{},
	}
	for _, s := range dtr.QueueStates {
		c.states[s] = &stateQueues{state: s, shares: map[string]*shareState{}}
	}
	c.hosts.links = c.links
	c.rand = rand.New(rand.NewPCG(1, 2))
	c.activitySeen.max = cmp.Or(cfg.MaxActivitiesPerIdentity, DefaultActivitiesPerIdentity)
	c.setActivityLimits(cfg.ActivityLimits)
	env := PolicyEnv{ShareName: func(id dtr.Identity) string { return c.cfg.SharePolicy.ShareName(id) },
		SharePriority: c.SharePriority, ShareOf: func(d *dtr.DTR) string { return c.cfg.SharePolicy.shareOf(d, c.cfg.ActivityWeights, &c.activitySeen) }}
	c.policy = ARC{env}
	if cfg.Policy != nil {
		c.policy = cfg.Policy(env)
	}
	return c
}

// Config returns the configuration in force.
func (c *Core) Config() Config { return c.cfg }

// SharePriority returns the configured priority of a share (with or without
// its direction suffix).
func (c *Core) SharePriority(share string) int {
	return sharePriorityUnder(c.cfg.SharePriority, c.cfg.SharePolicy, share)
}

func sharePriorityIn(prios map[string]int, share string) int {
	if p, ok := prios[share]; ok {
		return p
	}
	for _, suffix := range []string{"-download", "-upload"} {
		if parent, ok := strings.CutSuffix(share, suffix); ok {
			if p, ok := prios[parent]; ok {
				return p
			}
		}
	}
	if p, ok := prios[DefaultShare]; ok {
		return p
	}
	return 50
}

// nanos turns a time into nanoseconds since the core's epoch.
func (c *Core) nanos(t time.Time) int64 {
	if c.epoch.IsZero() {
		c.epoch = t
	}
	return int64(t.Sub(c.epoch))
}

// when turns nanoseconds since the epoch back into a time.
func (c *Core) when(ns int64) time.Time { return c.epoch.Add(time.Duration(ns)) }

// Tick does what time brings: retries whose delay is over go on, expired
// leases free their slots, waiting DTRs age, and free slots are granted.
func (c *Core) Tick(now time.Time) {
	c.now = now
	for c.delayed.Len() > 0 && !c.delayed[0].d.NextProcess.After(now) {
		e := heap.Pop(&c.delayed).(*entry)
		e.d.NextProcess = time.Time{}
		if e.d.State == dtr.CacheProcessed { // post-processing is tried again
			// A finalise whose worker was lost fails in REGISTERING_REPLICA
			// and tries again to put the file in place; otherwise (the
			// error of the failed transfer, or none for a cancelled DTR)
			// a lost cleanup is done again. Both are told apart by the
			// stored DTR alone, so a restarted scheduler does the same.
			if e.d.Error != nil && e.d.Error.State == dtr.RegisteringReplica {
				e.d.Error = nil
				e.setPost(postFinaliseAgain)
			}
			c.must(e.d.Transition(dtr.RegisterReplica, now))
		}
		c.route(now, e)
	}
	if c.leasesPaused.IsZero() {
		c.expireLeases(now)
	}
	if a, ok := innermost(c.policy).(ageless); ok && a.Ageless() {
		// no ageing under this policy
	} else if !c.loading && !now.Before(c.nextAge) {
		c.age(now)
		c.nextAge = now.Add(min(c.cfg.AgeEvery, 10*time.Second))
	}
	c.tickLinks(now)
	for _, s := range grantOrder {
		c.schedule(now, s)
	}
}

// grantOrder is the order in which a tick grants the queue states' slots:
// ARC's, but PRE_CLEAN before QUERY_REPLICA, so that the DTRs waiting in
// PRE_CLEAN take its free slots first and the queries granted after them
// may hold (chain) what is left. The other way round, one DTR waiting in
// PRE_CLEAN keeps every query of the tick unchained, and under steady work
// one nearly always does.
var grantOrder = func() []dtr.State {
	order := slices.Clone(dtr.QueueStates)
	q, p := slices.Index(order, dtr.QueryReplica), slices.Index(order, dtr.PreClean)
	order[q], order[p] = order[p], order[q]
	return order
}()

// Take returns and clears the decisions made since the last call.
func (c *Core) Take() Decisions {
	out := c.out
	out.Changed = make([]*dtr.DTR, 0, len(c.dirty))
	for _, e := range c.dirty {
		out.Changed = append(out.Changed, c.unpackEntry(e))
		c.packEntry(e)
		e.dirty = false
	}
	// The next decisions start with room for as many grants as these had.
	c.out = Decisions{Grants: make([]Grant, 0, len(out.Grants))}
	clear(c.dirty)
	c.dirty = c.dirty[:0]
	return out
}
