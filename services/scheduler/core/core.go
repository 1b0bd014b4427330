// Package core is the scheduler's algorithm: queues, shares, slot accounting,
// retries, leases and priority ageing as plain Go with no I/O. Time comes in
// as an argument to every call; decisions (grants, changed DTRs, cancels) are
// collected and handed to the caller by Take. The NATS, CloudEvents and
// telemetry plumbing lives in the scheduler service around it.
package core

import (
	"bytes"
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/url"
	"slices"
	"sort"
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
	// the same file looks again (default 2 s).
	Cache     bool
	CacheWait time.Duration
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
}

// DefaultConfig returns A-REX's defaults.
func DefaultConfig() Config {
	return Config{
		MaxProcessor:     10,
		MaxDelivery:      10,
		MaxEmergency:     1,
		MaxPrepared:      200,
		MaxTransferTries: 10,
		RetryBase:        10 * time.Second,
		Lease:            2 * time.Minute,
		AgeAfter:         time.Hour,
		AgeEvery:         5 * time.Minute,
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
}

type entry struct {
	// d is the DTR, or nil while it waits in a queue packed (pack.go).
	d      *dtr.DTR
	packed string
	seq    uint64 // arrival order, for FIFO among equal priorities
	index  int    // position in its heap
	// Times in nanoseconds since the core's epoch: a million queued entries
	// stay small.
	deadline int64   // when ageing starts or next applies
	granted  int64   // when the current grant was given
	lease    int64   // when the current grant expires
	prio     int32   // d.Priority while queued, kept here for fast sorting
	key      float64 // place in the queue under a policy that draws lots
	// share is the entry's share in the state it is queued or running in.
	share  *shareState
	queued dtr.State
	// finalised is set by a result that put the file in place, for the
	// decision that follows at once.
	finalised bool
	// refinalise marks a DTR whose post-processing is tried again: it
	// finalises even if it was cancelled meanwhile.
	refinalise bool
	// cacheKey is the source under which the DTR downloads into the cache
	// (caching): it stays when the DTR moves on to another replica.
	cacheKey string
	// footprint is about how many bytes the DTR's record takes, counted
	// for its owner (owners.go).
	footprint int64
	// recleanup marks a DTR whose cleanup grant was lost (its lease
	// expired), for the decision that follows at once: the cleanup is
	// done again before the DTR is retried or ends.
	recleanup bool
	// pinned marks a DTR that holds a staged copy, from its STAGE_PREPARE
	// grant until REQUEST_RELEASED; pinPrio is its priority when pinned.
	pinned  bool
	pinPrio int8
	// hosts are the storage endpoints of its remote ends, as 1 + their
	// number in the names table (0: a local end).
	hosts [2]uint32
	dirty bool // in Core.dirty
}

// stateQueues is the work of one queue state.
type stateQueues struct {
	state dtr.State
	// shares holds every share with work queued or running in the state,
	// order the same sorted by name. A share with neither is dropped, and
	// what it was owed with it.
	shares map[string]*shareState
	order  []*shareState
	total  int
	last   time.Time
	// Buffers for the split, indexed like order.
	demand  []ShareDemand
	deficit []float64
}

// shareState is one share's work in one queue state.
type shareState struct {
	name    string
	prio    int // the share's configured priority
	q       queue
	running int
	// For the fair hand-out of leftover slots: the share's exact quota at
	// the last tick, and the slot-seconds it is owed (quota minus use,
	// summed over time).
	quota, deficit float64
}

// share returns the state of a share, adding it if it has none.
func (c *Core) share(st *stateQueues, name string) *shareState {
	if ss, ok := st.shares[name]; ok {
		return ss
	}
	ss := &shareState{name: name, prio: c.SharePriority(name), q: queue{due: math.MaxInt64}}
	if l, ok := innermost(c.policy).(lottery); ok {
		ss.q.draw = func(prio int32) float64 { return c.rand.ExpFloat64() / l.PickWeight(int(prio)) }
	}
	st.shares[name] = ss
	i := sort.Search(len(st.order), func(i int) bool { return st.order[i].name >= name })
	st.order = slices.Insert(st.order, i, ss)
	return ss
}

// drop forgets a share that has nothing queued or running in the state.
func (st *stateQueues) drop(ss *shareState) {
	if ss.q.Len() > 0 || ss.running > 0 || st.shares[ss.name] != ss {
		return
	}
	delete(st.shares, ss.name)
	i := sort.Search(len(st.order), func(i int) bool { return st.order[i].name >= ss.name })
	st.order = slices.Delete(st.order, i, i+1)
}

// queued returns how many DTRs wait in the state.
func (st *stateQueues) queued() int {
	n := 0
	for _, ss := range st.order {
		n += ss.q.Len()
	}
	return n
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
	scratch []byte // pack's buffer
	// took holds, per queue state, a moving average of how long its grants
	// run, for estimating when a waiting DTR starts.
	took    map[dtr.State]time.Duration
	states  map[dtr.State]*stateQueues
	delayed delayQueue
	// pins holds each share's staged copies (maxprepared).
	pins map[string]*pins
	// hostBusy counts the transfers running per storage endpoint.
	hostBusy map[uint32]int
	// caching holds, per source URL, the DTR downloading it into the cache.
	caching map[string]*entry
	// policy weighs the shares; now is the time of the last tick, for
	// weighing outside one.
	policy  Policy
	now     time.Time
	rand    *rand.Rand // for policies that draw lots; seeded, so runs repeat
	active  map[uuid.UUID]*entry
	seq     uint64
	nextAge time.Time
	// leasesPaused is when the lease clock stopped (zero: it runs): the
	// scheduler could not hear from workers since (leases.go).
	leasesPaused time.Time

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
		pins:          map[string]*pins{},
		hostBusy:      map[uint32]int{},
		caching:       map[string]*entry{},
		active:        map[uuid.UUID]*entry{},
	}
	for _, s := range dtr.QueueStates {
		c.states[s] = &stateQueues{state: s, shares: map[string]*shareState{}}
	}
	c.rand = rand.New(rand.NewPCG(1, 2))
	env := PolicyEnv{ShareName: func(id dtr.Identity) string { return c.cfg.SharePolicy.ShareName(id) },
		SharePriority: c.SharePriority}
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
func (c *Core) SharePriority(share string) int { return sharePriorityIn(c.cfg.SharePriority, share) }

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

// Submit takes a NEW DTR: it is validated, placed in its share, given its
// priority and routed to its first queue. An invalid DTR is refused with the
// reason and nothing changes.
func (c *Core) Submit(now time.Time, d *dtr.DTR) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("invalid DTR: %w", err)
	}
	if _, ok := c.dtrs[d.ID]; ok {
		return fmt.Errorf("%w: %s", ErrDuplicate, d.ID)
	}
	d.State = dtr.New
	d.Share = SubShare(c.policy.Share(d), d.Direction)
	d.Priority = c.policy.Priority(d.Share, d)
	d.MaxAttempts = c.cfg.MaxTransferTries
	d.Attempts = 0
	if _, ok := c.cancelledJobs[cancelledJob(d.JobID, d.Owner.DN)]; ok && d.JobID != "" {
		d.Cancel = true // its job was cancelled before it arrived
	}
	d.Error = nil
	d.ChecksumMismatch = ""
	d.Grant = ""
	if len(d.Replicas) > 0 {
		d.Replicas = SortReplicas(append([]string{d.Source}, d.Replicas...), c.cfg.PreferredPattern)
		d.Replica, d.Source = 0, d.Replicas[0]
		if len(d.Replicas) == 1 {
			d.Replicas = nil // one source left (the others repeated it, or were excluded)
		}
	}
	if d.Created.IsZero() {
		d.Created = now
	}
	d.Updated = now
	e := &entry{d: d, index: -1}
	c.add(e)
	c.route(now, e)
	return nil
}

// add registers an unfinished DTR.
func (c *Core) add(e *entry) {
	e.d.Share = c.intern(e.d.Share)
	e.d.Owner.DN = c.intern(e.d.Owner.DN)
	c.setHosts(e)
	c.own(e)
	c.dtrs[e.d.ID] = e
}

// setHosts notes the storage endpoints of a DTR's ends.
func (c *Core) setHosts(e *entry) {
	for i, u := range [2]string{e.d.Source, e.d.Destination} {
		e.hosts[i] = 0
		if h := endpointOf(u); h != "" {
			e.hosts[i] = uint32(c.nameID(h)) + 1
		}
	}
}

// endpointOf returns the storage endpoint of a remote URL ("host:port" as
// written), "" for a local file.
func endpointOf(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.Scheme == "file" {
		return ""
	}
	return p.Host
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

// Restore puts back a DTR recovered from storage after a restart, in the
// state it was saved in. Active DTRs keep their grant and get a fresh lease;
// DTRs waiting for a retry wait on.
func (c *Core) Restore(now time.Time, d *dtr.DTR) error {
	if _, ok := c.dtrs[d.ID]; ok {
		return fmt.Errorf("%w: %s", ErrDuplicate, d.ID)
	}
	if d.State.Final() {
		return nil
	}
	e := &entry{d: d, index: -1}
	c.add(e)
	if d.Options.Stage && pinnedStates[d.State] {
		c.pin(e)
	}
	if d.Cache == dtr.CacheDownload {
		c.cacheAs(e)
	}
	switch {
	case d.State.IsQueue():
		c.enqueue(now, e)
		c.packEntry(e)
	case d.State.IsActive():
		q, _ := dtr.QueueOf(d.State)
		if d.State == dtr.TransferringCancel {
			q = dtr.Transfer
		}
		st := c.states[q]
		e.share = c.share(st, d.Share)
		e.share.running++
		st.total++
		e.queued = q
		if q == dtr.Transfer {
			c.busy(e, 1)
		}
		e.lease = c.nanos(now.Add(c.cfg.Lease))
		e.granted = c.nanos(now)
		c.active[d.ID] = e
	case (d.State == dtr.New || d.State == dtr.CacheProcessed || d.State == dtr.CacheWait) && !d.NextProcess.IsZero():
		heap.Push(&c.delayed, e)
	default:
		c.route(now, e)
	}
	return nil
}

// Result applies a worker's outcome. A result for a grant that is not the
// DTR's current one (a worker that lost its lease, a redelivery) is refused
// with ErrStaleResult and changes nothing.
func (c *Core) Result(now time.Time, r Result) error {
	e, ok := c.dtrs[r.DTR]
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknownDTR, r.DTR)
	}
	if _, running := c.active[r.DTR]; !running || e.d.Grant != r.Grant {
		v := c.peekEntry(e) // not running: it may be packed in a queue
		return fmt.Errorf("%w: dtr %s grant %s (current %q in %s)", ErrStaleResult, r.DTR, r.Grant, v.Grant, v.State)
	}
	if r.Stage != "" && r.Stage != e.queued.Stage() {
		return fmt.Errorf("%w: dtr %s grant %s is a %s grant, not %s", ErrStaleResult, r.DTR, r.Grant, e.queued.Stage(), r.Stage)
	}
	if r.Returned && e.d.State != dtr.TransferringCancel {
		c.giveBack(now, e, r.Bytes)
		return nil
	}
	c.charge(now, e, r.Bytes)
	c.release(e)
	if e.granted != 0 {
		// Moving average over about the last 16 grants of the state.
		took := now.Sub(c.when(e.granted))
		if avg, ok := c.took[e.queued]; ok {
			took = avg + (took-avg)/16
		}
		c.took[e.queued] = took
	}
	d := e.d
	switch {
	case r.Error != nil:
		// A failed step's size is what it moved, not the file's: delivery
		// and staging hold the source to d.Size.
	case e.queued == dtr.QueryReplica:
		d.Size = r.Size // what the source has now, 0 if unknown
	case r.Size > 0:
		d.Size = r.Size
	}
	if r.Bytes > 0 {
		d.Bytes = r.Bytes
	}
	if r.Checksum != "" {
		d.Checksum = r.Checksum
	}
	if r.TURL != "" {
		d.TURL = r.TURL
	}
	if e.queued == dtr.Transfer {
		d.Started, d.Ended = r.Started, r.Ended
	}
	if (e.queued == dtr.RegisterReplica || e.queued == dtr.ProcessCache && d.Cache != "") && !d.Cleanup && r.Error == nil {
		e.finalised = true // the file is in place
	}
	if e.queued == dtr.CheckCache && r.Error == nil {
		d.Cache, d.CacheFile = r.Cache, r.CacheFile
		if d.Cache == dtr.CacheDownload {
			c.cacheAs(e)
		}
	}
	if e.queued == dtr.ProcessCache {
		c.uncache(e)
	}
	// A failed cleanup keeps the error that called for it: that error, not
	// the cleanup's, decides whether the DTR is tried again.
	if r.Error != nil && !(d.Cleanup && d.Error != nil) {
		f := *r.Error
		f.State = d.State
		d.Error = &f
	}
	d.Cleanup = false
	switch {
	case d.State == dtr.TransferringCancel:
		c.must(d.Transition(dtr.Transferred, now))
	case e.queued == dtr.CheckCache && d.Cache == dtr.CacheLocked && r.Error == nil && !d.Cancel:
		// Locked by a download this scheduler does not know of (another
		// process, or one lost in a crash until its lock goes stale).
		c.must(d.Transition(dtr.CacheWait, now))
		d.NextProcess = now.Add(c.cfg.CacheWait)
		heap.Push(&c.delayed, e)
		c.markDirty(e)
		return nil
	default:
		c.must(d.Transition(e.queued.Completed(), now))
	}
	c.route(now, e)
	return nil
}

// giveBack puts a DTR whose worker returned its grant unfinished back in
// the queue it was granted from, freeing the slot and spending no attempt;
// a grant to stage a copy unpins it, and a cleanup or a refinalising is
// granted as such again. A cancelled transfer is not given back: its
// cleanup follows as after any other end.
func (c *Core) giveBack(now time.Time, e *entry, bytes int64) {
	d := e.d
	c.charge(now, e, bytes)
	c.release(e)
	if e.queued == dtr.StagePrepare {
		c.unpin(e)
	}
	e.refinalise = e.queued == dtr.RegisterReplica && !d.Cleanup // a finalise given back is granted as one again
	d.Cleanup = false
	c.must(d.Transition(e.queued, now))
	c.route(now, e)
}

// Progress renews the lease of a running grant and records the bytes moved.
func (c *Core) Progress(now time.Time, id uuid.UUID, grant string, bytes int64) error {
	e, ok := c.active[id]
	if !ok || e.d.Grant != grant {
		return fmt.Errorf("%w: dtr %s grant %s", ErrStaleResult, id, grant)
	}
	e.lease = c.nanos(now.Add(c.cfg.Lease))
	if bytes > e.d.Bytes {
		e.d.Bytes = bytes
	}
	return nil
}

// Cancel stops a DTR. A queued DTR leaves its queue at once through ARC's
// cancel mapping; a running one is flagged, its worker is told to stop, and
// it ends CANCELLED when its result (or lease expiry) comes back; a final DTR
// is left as it is. Post-processing is never interrupted: it cleans up.
func (c *Core) Cancel(now time.Time, id uuid.UUID) error {
	e, ok := c.dtrs[id]
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknownDTR, id)
	}
	if v := c.peekEntry(e); v.Cancel || v.State.Final() {
		return nil
	}
	d := c.unpackEntry(e)
	d.Cancel = true
	d.Updated = now
	c.markDirty(e)
	switch {
	case stageOf(d.State) == dtr.StagePost:
		// Post-processing runs on: it cleans up, or puts a finished file in
		// place, in which case the DTR ends DONE after all.
	case d.State.IsQueue():
		e.share.q.remove(e)
		c.states[d.State].drop(e.share)
		c.must(d.Transition(cancelMapping[d.State], now))
		c.route(now, e)
	case d.State == dtr.Transferring:
		c.must(d.Transition(dtr.TransferringCancel, now))
		c.out.CancelRunning = append(c.out.CancelRunning, c.grantOf(e))
	case d.State.IsActive() && stageOf(d.State) != dtr.StagePost:
		c.out.CancelRunning = append(c.out.CancelRunning, c.grantOf(e))
	case d.State == dtr.New || d.State == dtr.CacheWait:
		heap.Remove(&c.delayed, e.index)
		d.NextProcess = time.Time{}
		c.route(now, e)
	case d.State == dtr.CacheProcessed && !d.NextProcess.IsZero():
		// Waiting to finalise again: like post-processing, that goes on,
		// since the file may be in place already.
	}
	return nil
}

// cancelMapping is ARC's: where a cancelled queued DTR goes to clean up.
var cancelMapping = map[dtr.State]dtr.State{
	dtr.CheckCache:   dtr.CacheProcessed,
	dtr.Resolve:      dtr.ReplicaRegistered,
	dtr.QueryReplica: dtr.RequestReleased,
	dtr.PreClean:     dtr.RequestReleased,
	dtr.StagePrepare: dtr.RequestReleased,
	dtr.Transfer:     dtr.Transferred,
}

// hungMapping is ARC's: where a DTR goes whose worker stopped answering.
var hungMapping = map[dtr.State]dtr.State{
	dtr.CheckingCache:      dtr.ReplicaRegistered,
	dtr.Resolving:          dtr.RequestReleased,
	dtr.QueryingReplica:    dtr.RequestReleased,
	dtr.PreCleaning:        dtr.RequestReleased,
	dtr.StagingPreparing:   dtr.Transferred,
	dtr.Transferring:       dtr.Transferred,
	dtr.TransferringCancel: dtr.Transferred,
	dtr.ReleasingRequest:   dtr.RequestReleased,
	dtr.FinalisingReplica:  dtr.ReplicaFinalised,
	dtr.RegisteringReplica: dtr.ReplicaRegistered,
	dtr.ProcessingCache:    dtr.CacheProcessed,
}

// SetPriority changes the priority of a queued or running DTR.
func (c *Core) SetPriority(now time.Time, id uuid.UUID, prio int) error {
	if prio < 1 || prio > 100 {
		return fmt.Errorf("priority %d is outside 1–100", prio)
	}
	e, ok := c.dtrs[id]
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknownDTR, id)
	}
	d := c.unpackEntry(e)
	d.Priority = prio
	d.Updated = now
	if d.State.IsQueue() && e.index >= 0 {
		e.share.q.fix(e)
	}
	c.markDirty(e)
	return nil
}

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
				e.refinalise = true
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
	} else if !now.Before(c.nextAge) {
		c.age(now)
		c.nextAge = now.Add(min(c.cfg.AgeEvery, 10*time.Second))
	}
	for _, s := range dtr.QueueStates {
		c.schedule(now, s)
	}
}

func (c *Core) expireLeases(now time.Time) {
	var expired []*entry
	for _, e := range c.active {
		if c.nanos(now) > e.lease {
			expired = append(expired, e)
		}
	}
	sort.Slice(expired, func(i, j int) bool { return expired[i].seq < expired[j].seq })
	for _, e := range expired {
		d := e.d
		c.count.LeaseExpiries++
		c.charge(now, e, 0) // a lost worker's bytes are not known
		c.release(e)
		// A lost cleanup keeps the error that called for it (none for a
		// cancelled DTR): that error decides what follows, and the
		// cleanup is done again first.
		if d.Cleanup && d.State == dtr.RegisteringReplica {
			e.recleanup = true
		} else if !(d.Cleanup && d.Error != nil) {
			d.Error = &dtr.Failure{Kind: dtr.ErrInternalProcess, State: d.State,
				Text: fmt.Sprintf("lease of grant %s expired: no sign of life from its worker for %s", d.Grant, c.cfg.Lease)}
		}
		d.Cleanup = false
		c.must(d.Transition(hungMapping[d.State], now))
		c.route(now, e)
	}
}

// age raises by one the priority of every queued DTR whose deadline has
// passed and whose priority is below its queue's head, and sets its next
// deadline AgeEvery later. A queue whose earliest deadline is still ahead is
// not scanned.
func (c *Core) age(now time.Time) {
	at := c.nanos(now)
	for _, s := range dtr.QueueStates {
		for _, ss := range c.states[s].order {
			q := &ss.q
			if q.Len() < 2 || at < q.due {
				continue
			}
			top := q.top()
			var aged []*entry
			due := int64(math.MaxInt64)
			for _, e := range q.items {
				if at >= e.deadline && e.prio < top && e.prio < 100 {
					aged = append(aged, e)
					continue
				}
				due = min(due, e.deadline)
			}
			for _, e := range aged {
				c.unpackEntry(e).Priority++
				e.deadline = c.nanos(now.Add(c.cfg.AgeEvery))
				due = min(due, e.deadline)
				q.fix(e)
				c.markDirty(e)
			}
			q.due = due
		}
	}
}

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

// Get returns a copy of a known, unfinished DTR.
func (c *Core) Get(id uuid.UUID) (dtr.DTR, bool) {
	e, ok := c.dtrs[id]
	if !ok {
		return dtr.DTR{}, false
	}
	return *c.peekEntry(e), true
}

// Retrying returns copies of a job's DTRs that wait to be tried again after
// an error (in NEW to start over, or in CACHE_PROCESSED to finalise again),
// each with its error, its attempts so far and when it goes on
// (NextProcess), soonest first.
func (c *Core) Retrying(jobID string) []dtr.DTR {
	var out []dtr.DTR
	for _, e := range c.delayed {
		d := e.d // waiting: not packed
		if d.JobID == jobID && d.Error != nil && (d.State == dtr.New || d.State == dtr.CacheProcessed) {
			out = append(out, *d)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].NextProcess.Equal(out[j].NextProcess) {
			return out[i].NextProcess.Before(out[j].NextProcess)
		}
		return out[i].ID.String() < out[j].ID.String()
	})
	return out
}

// Queued returns how many DTRs wait in a queue state.
func (c *Core) Queued(s dtr.State) int {
	if st := c.states[s]; st != nil {
		return st.queued()
	}
	return 0
}

// Longest returns up to n DTRs that wait in a queue or for a retry, those
// that came to their queue first first.
func (c *Core) Longest(n int) []uuid.UUID {
	if n <= 0 {
		return nil
	}
	var found []*entry
	keep := func(e *entry) {
		i := sort.Search(len(found), func(i int) bool { return found[i].seq > e.seq })
		if i >= n {
			return
		}
		if len(found) < n {
			found = append(found, nil)
		}
		copy(found[i+1:], found[i:])
		found[i] = e
	}
	for _, s := range dtr.QueueStates {
		for _, ss := range c.states[s].order {
			for _, e := range ss.q.items {
				keep(e)
			}
		}
	}
	for _, e := range c.delayed {
		keep(e)
	}
	ids := make([]uuid.UUID, len(found))
	for i, e := range found {
		ids[i] = c.peekEntry(e).ID
	}
	return ids
}

// Len returns the number of unfinished DTRs.
func (c *Core) Len() int { return len(c.dtrs) }

// ShareStats is one share's load in one state.
type ShareStats struct {
	Share    string    `json:"share"`
	State    dtr.State `json:"state"`
	Priority int       `json:"priority"`
	Queued   int       `json:"queued"`
	Running  int       `json:"running"`
	// Slots is the share's part of the state's limit under the current split.
	Slots int `json:"slots"`
	// Weight is the share's weight in that split under the policy in force
	// (the configured priority under ARC's).
	Weight int64 `json:"weight"`
}

// Shares returns the load of every share in every queue state that has any,
// sorted by state then share, and the number of DTRs waiting for a retry
// per share.
func (c *Core) Shares() (stats []ShareStats, retrying map[string]int) {
	for _, s := range dtr.QueueStates {
		st := c.states[s]
		slots, _ := c.split(st)
		for i, ss := range st.order {
			stats = append(stats, ShareStats{Share: ss.name, State: s, Priority: ss.prio,
				Queued: ss.q.Len(), Running: ss.running, Slots: slots[i], Weight: st.demand[i].Weight})
		}
	}
	retrying = map[string]int{}
	for _, e := range c.delayed {
		retrying[e.d.Share]++ // waiting for a retry: not packed
	}
	return stats, retrying
}

// DTRs returns a copy of every unfinished DTR, in the order they arrived.
func (c *Core) DTRs() []dtr.DTR {
	out := make([]dtr.DTR, 0, len(c.dtrs))
	for _, e := range c.dtrs {
		out = append(out, *c.peekEntry(e))
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return bytes.Compare(out[i].ID[:], out[j].ID[:]) < 0
	})
	return out
}

// pins counts a share's staged copies by the priority they were pinned at.
type pins struct {
	n      int
	byPrio [101]int32
}

// highest returns the highest priority among the pins.
func (p *pins) highest() int {
	for prio := 100; prio > 0; prio-- {
		if p.byPrio[prio] > 0 {
			return prio
		}
	}
	return 0
}

// pinnedStates are the states of a staged DTR that holds its staged copy,
// for rebuilding the pins after a restart.
var pinnedStates = map[dtr.State]bool{
	dtr.StagingPreparing: true, dtr.StagingPreparingWait: true, dtr.StagedPrepared: true,
	dtr.Transfer: true, dtr.Transferring: true, dtr.TransferringCancel: true, dtr.Transferred: true,
	dtr.ReleaseRequest: true, dtr.ReleasingRequest: true,
}

// pin records that a DTR holds a staged copy.
func (c *Core) pin(e *entry) {
	if e.pinned {
		return
	}
	d := c.peekEntry(e)
	p := c.pins[d.Share]
	if p == nil {
		p = &pins{}
		c.pins[d.Share] = p
	}
	e.pinned, e.pinPrio = true, int8(min(max(d.Priority, 1), 100))
	p.n++
	p.byPrio[e.pinPrio]++
}

// unpin records that a DTR's staged copy is released.
func (c *Core) unpin(e *entry) {
	if !e.pinned {
		return
	}
	share := c.peekEntry(e).Share
	p := c.pins[share]
	p.n--
	p.byPrio[e.pinPrio]--
	if p.n == 0 {
		delete(c.pins, share)
	}
	e.pinned = false
}

// admit reports whether the head of a share's queue may be granted as far
// as the state's own limits go: in STAGE_PREPARE, the share must hold fewer
// than MaxPrepared staged copies, or the DTR must outrank all of them.
func (c *Core) admit(s dtr.State, ss *shareState) bool {
	if s != dtr.StagePrepare || ss.q.Len() == 0 {
		return true
	}
	p := c.pins[ss.name]
	return p == nil || p.n < c.cfg.MaxPrepared || int(ss.q.head().prio) > p.highest()
}

// charge tells the policy what an active DTR's grant used.
func (c *Core) charge(now time.Time, e *entry, bytes int64) {
	if e.queued != dtr.Transfer {
		bytes = 0
	}
	c.policy.Charge(now, e.queued, e.d, now.Sub(c.when(e.granted)), bytes)
}

// cacheable reports whether a DTR goes through the cache: a cache is kept,
// the source is remote, the destination local, and the job did not say no.
func (c *Core) cacheable(d *dtr.DTR) bool {
	return c.cfg.Cache && !d.Options.NoCache && !d.Options.Stage &&
		!strings.HasPrefix(d.Source, "file:") && strings.HasPrefix(d.Destination, "file:")
}

// waitForCache parks a DTR in CACHE_WAIT while h downloads the same file,
// and gives h the waiter's priority if it is higher (ARC does the same).
func (c *Core) waitForCache(now time.Time, e, h *entry) {
	e.d.NextProcess = now.Add(c.cfg.CacheWait)
	heap.Push(&c.delayed, e)
	if p := c.peekEntry(e).Priority; p > c.peekEntry(h).Priority {
		hd := c.unpackEntry(h)
		hd.Priority, hd.Updated = p, now
		if hd.State.IsQueue() && h.index >= 0 {
			h.share.q.fix(h)
		}
		c.markDirty(h)
	}
}

// cacheAs records that a DTR downloads its source into the cache.
func (c *Core) cacheAs(e *entry) {
	e.cacheKey = e.d.Source
	c.caching[e.cacheKey] = e
}

// uncache forgets that a DTR downloads into the cache.
func (c *Core) uncache(e *entry) {
	if e.cacheKey != "" && c.caching[e.cacheKey] == e {
		delete(c.caching, e.cacheKey)
	}
	e.cacheKey = ""
}
