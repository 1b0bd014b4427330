package core

// An entry's life: a DTR from Submit (or Restore) through the results of its
// grants, cancellation and priority changes, until decide ends it (route.go).

import (
	"container/heap"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

type entry struct {
	// Fields go from the largest to the smallest, so that an entry has no
	// padding: a million queued entries stay small (pack.go).

	// d is the DTR, or nil while it waits in a queue packed (pack.go).
	d      *dtr.DTR
	packed string
	seq    uint64 // arrival order, for FIFO among equal priorities
	// stamp is when the DTR came to its queue (DTR.EnteredState, in
	// nanoseconds since 1970): equal priorities go first come first
	// served by it, and DTRs that came in the same step (one stamp) by
	// tie, eight bytes of the DTR's id, so that a DTR restored after a
	// restart or loaded late (load.go) takes the place it had.
	stamp int64
	tie   uint64
	// record is the stream sequence of the DTR's stored record in the
	// checkpoint bucket, as far as the core was told (Recorded; 0: not
	// known): the restart index names it, for the restart to fetch its
	// DTRs in the order they are stored (restoreindex.go).
	record uint64
	// Times in nanoseconds since the core's epoch: a million queued entries
	// stay small.
	deadline int64   // when ageing starts or next applies
	granted  int64   // when the current grant was given
	lease    int64   // when the current grant expires
	key      float64 // place in the queue under a policy that draws lots
	// share is the entry's share in the state it is queued or running in.
	share *shareState
	// park is the queue of held DTRs the entry is parked in, nil when it
	// is in its share's queue (or not queued) (parking.go).
	park *parked
	// index is the entry's position in its heap, -1 in none.
	index    int32
	prio     int32  // d.Priority while queued, kept here for fast sorting
	activity uint32 // 1 + names number of its activity if a limit names it, else 0 (activitylimits.go)
	// footprint is about how many bytes the DTR's record takes, counted
	// for its owner (owners.go).
	footprint int32
	// hosts are the storage endpoints of its remote ends, as 1 + their
	// number in the names table (0: a local end).
	hosts [2]uint32
	// queued is the queue state whose slot the entry waits for or holds.
	queued dtr.State
	// post is what its post-processing does beyond what the DTR records
	// (postPhase).
	post postPhase
	// pinned marks a DTR that holds a staged copy, from its STAGE_PREPARE
	// grant until REQUEST_RELEASED; pinPrio is its priority when pinned.
	// It is the entry's membership in the core's pins, not a phase of its
	// life: a pinned DTR moves through several states and phases.
	pinned  bool
	pinPrio int8
	// dirty is the entry's membership in Core.dirty (changed since the
	// last Take), independent of where it is in its life.
	dirty bool
	// The source under which a DTR downloads into the cache is kept
	// beside the entries, in Core.cacheKeys (cache.go): few have one.
}

// postPhase is where an entry stands in post-processing beyond what its
// DTR's state, error and cancel flag say. Each phase is set by one event
// and ends at the step that acts on it, so an entry is in one at a time;
// postMoves lists the moves that may happen.
type postPhase uint8

const (
	// postAsRouted: post-processing does what the DTR says, finalising a
	// good transfer and cleaning up after a failed or cancelled one.
	postAsRouted postPhase = iota
	// postFinaliseAgain: a finalise that was given back, or whose worker
	// was lost, is granted as a finalise again even if the DTR was
	// cancelled meanwhile (the file may already be in place). Ends at
	// the grant.
	postFinaliseAgain
	// postFileInPlace: a result put the file in place, so the DTR ends
	// DONE even if it was cancelled meanwhile. Ends when it starts over.
	postFileInPlace
	// postCleanupLost: a cleanup grant was lost (its lease expired): the
	// failed transfer's temporary file may still be there, so the
	// cleanup is done again before the DTR is retried or ends. Ends at
	// the decision.
	postCleanupLost
)

// postMoves are the moves between post-processing phases: into a phase
// only from postAsRouted, out of one only back to it, except that a
// further result that puts the file in place keeps postFileInPlace.
var postMoves = [...][]postPhase{
	postAsRouted:      {postFinaliseAgain, postFileInPlace, postCleanupLost},
	postFinaliseAgain: {postAsRouted},
	postFileInPlace:   {postAsRouted, postFileInPlace},
	postCleanupLost:   {postAsRouted},
}

// setPost moves e to post-processing phase to; a move postMoves does not
// list is a bug in the core, like an illegal DTR transition.
func (e *entry) setPost(to postPhase) {
	if !slices.Contains(postMoves[e.post], to) {
		panic(fmt.Sprintf("core: post-processing phase %d cannot move to %d", e.post, to))
	}
	e.post = to
}

// endPost ends phase p if e is in it.
func (e *entry) endPost(p postPhase) {
	if e.post == p {
		e.setPost(postAsRouted)
	}
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
	d.Grant, d.Chained = "", false
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
	d.Updated, d.StateEntered = now, now
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
	c.setActivity(e)
	c.own(e)
	c.dtrs[e.d.ID] = e
}

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
	if d.Chained && d.State != dtr.QueryingReplica {
		d.Chained = false // no grant holds a slot for it: nothing to hold
	}
	if d.Options.Stage && pinnedStates[d.State] {
		c.pin(e)
	}
	if d.Cache == dtr.CacheDownload {
		c.cacheAs(e)
	}
	switch {
	case d.State.IsQueue():
		c.enqueueAt(now, e, d.EnteredState().UnixNano())
		// It ages as if it had not been restored: its state's deadline
		// counts from when it entered the state (DTR.EnteredState).
		e.deadline = c.deadlineAt(now, d.EnteredState(), d)
		e.share.q.due = min(e.share.q.due, e.deadline)
		c.packEntry(e)
	case d.State.IsActive():
		q, _ := queueOf(d.State)
		st := c.states[q]
		e.share = c.shareIn(st, d.Share)
		e.share.running++
		st.total++
		e.queued = q
		if classOf(q).PerHost {
			c.hosts.add(e, 1)
			c.activityLoad.add(e, 1)
			c.links.resume(e, d.Bytes)
		}
		c.setLease(e, c.nanos(now.Add(c.cfg.Lease)))
		e.granted = c.nanos(now)
		c.active[d.ID] = e
		if d.Chained && q == dtr.QueryReplica {
			// Its worker pre-cleans once the query succeeds: the slot it
			// holds is held again, whatever the limit is now (as the
			// grant's own).
			d.Chained = false
			c.reserve(now, e)
		}
	case (d.State == dtr.New || d.State == dtr.CacheProcessed || d.State == dtr.CacheWait) && !d.NextProcess.IsZero():
		heap.Push(&c.delayed, e)
	default:
		c.route(now, e)
	}
	return nil
}

// Renew puts a record of a DTR in place of the copy the core holds, if
// any, as Forget and then Restore do, except that a DTR still running
// under the same grant, holding the same queue's slot (running, or being
// cancelled), keeps when it was granted and its lease: a standby that
// replays a record stored again as it was, or a cancel of it, charges its
// share for the whole grant.
func (c *Core) Renew(now time.Time, d *dtr.DTR) error {
	var granted, lease int64
	same := false
	if e := c.dtrs[d.ID]; e != nil && c.active[d.ID] == e && d.Grant != "" && e.d.Grant == d.Grant { // active: not packed
		was, _ := queueOf(e.d.State)
		is, running := queueOf(d.State)
		if same = running && was == is; same {
			granted, lease = e.granted, e.lease
		}
	}
	c.Forget(d.ID)
	if err := c.Restore(now, d); err != nil {
		return err
	}
	if e := c.active[d.ID]; same && e != nil {
		e.granted = granted
		c.setLease(e, lease)
	}
	return nil
}

// Forget removes an unfinished DTR from the core as if it had never been
// submitted or restored, and reports whether the core held it; an unknown
// id returns false and changes nothing (but while the core loads, Load
// takes no record of it: load.go). It is Restore's inverse, for a
// hot-standby scheduler that keeps a warm core by applying the records the
// leader journals: for a DTR it holds, Forget then Restore(now, record)
// (just Forget for a record in a final state).
//
// It undoes every index the entry is in: the DTRs held, its owner's use,
// its place in a queue (a share left with nothing queued or running is
// dropped) or its slot (per-host counts included) or its place among the
// DTRs waiting for a retry or a cache download, its staged copy, its
// download into the cache (DTRs waiting for that download look again and
// find none), its place among the DTRs changed since the last Take, and
// any grant or stop of it decided and not yet taken. It decides nothing:
// no grant, no change record, no final DTR, no policy charge, and Counts
// stay as they are.
//
// What the core learnt from the DTR and keeps beyond it stays: the
// average time its grants took, what the policy was charged for them, a
// cancelled job's mark, interned names. Restore keeps the record it is
// given, so a standby passes it a copy of its own.
//
// Forget then Restore of the DTR's latest record rebuilds what the record
// carries, not the rest of the entry; what differs from the entry the
// core had:
//   - a queued DTR keeps its place among its equals (they go by when they
//     came to their queue, DTR.EnteredState) but comes after those that
//     came in the same nanosecond; its ageing deadline counts from its record's Updated (so a priority
//     change, which sets Updated, starts it over; a DTR aged already ages
//     once more at the next tick), and under a policy that
//     draws lots it draws a new place, which also moves the core's seeded
//     generator on;
//   - an active DTR's lease and grant time start at now;
//   - the post-processing phase (postPhase) is not in the record: a DTR
//     queued in REGISTER_REPLICA to finalise again (given back, or after a
//     lost worker: postFinaliseAgain) is granted a cleanup instead if it
//     is cancelled or has an error; a DTR queued in PROCESS_CACHE (or
//     holding a cleanup grant there) whose file was put in place
//     (postFileInPlace) and which was cancelled afterwards ends CANCELLED,
//     not DONE; and a DTR in PROCESS_CACHE after a lost cleanup
//     (postCleanupLost) is decided without that cleanup being done once
//     more;
//   - a staged copy is counted at the record's priority, not the one it
//     was pinned at (they differ after SetPriority or ageing);
//   - a download into the cache is keyed by the record's current source
//     (not the replica it began on), and one is registered for any record
//     with Cache "download", even after PROCESS_CACHE ended it (a DTR
//     waiting to retry in NEW or to finalise again): until that DTR starts
//     over, another DTR of the same source waits in CACHE_WAIT;
//   - its owner's bytes are counted from the record as it is now (its
//     source may be another replica than at Submit).
func (c *Core) Forget(id uuid.UUID) bool {
	c.let(id) // held or not: a newer record of it is on its way, if any
	e, ok := c.dtrs[id]
	if !ok {
		return false
	}
	c.unpackEntry(e) // disown and release read its DTR
	switch {
	case c.active[id] == e:
		c.release(e)
		c.unreserve(time.Time{}, e)
	case e.index >= 0 && int(e.index) < len(c.delayed) && c.delayed[e.index] == e:
		heap.Remove(&c.delayed, int(e.index))
	case e.share != nil && e.index >= 0 && int(e.index) < e.home().Len() && e.home().items[e.index] == e:
		c.unqueue(e)
		c.states[e.queued].drop(e.share)
	}
	c.unpin(e)
	c.uncache(e)
	if e.dirty {
		c.dirty = slices.DeleteFunc(c.dirty, func(o *entry) bool { return o == e })
		e.dirty = false
	}
	c.out.Grants = slices.DeleteFunc(c.out.Grants, func(g Grant) bool { return g.DTR.ID == id })
	c.out.CancelRunning = slices.DeleteFunc(c.out.CancelRunning, func(g Grant) bool { return g.DTR.ID == id })
	c.out.Chained = slices.DeleteFunc(c.out.Chained, func(g Grant) bool { return g.DTR.ID == id })
	c.disown(e)
	delete(c.dtrs, id)
	return true
}

// Result applies a worker's outcome. A result for a grant that is not the
// DTR's current one (a worker that lost its lease, a redelivery) is refused
// with ErrStaleResult and changes nothing.
func (c *Core) Result(now time.Time, r Result) error { return c.result(now, r, false) }

// result is Result; chained says r is the PRE_CLEAN outcome a chained
// grant's result carried. A grant that ran two steps (a result carrying
// the next step's outcome, or that outcome) held its slot for both: its
// time is left out of the state's and share's hold means and of the
// state's average grant time, which say how long one step takes.
func (c *Core) result(now time.Time, r Result, chained bool) error {
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
	k := classOf(e.queued)
	if k.PerHost {
		c.links.ended(now, e, r)
	}
	if r.Returned && e.d.State != k.Cancelling {
		c.giveBack(now, e, r.Bytes)
		return nil
	}
	oneStep := r.Then == nil && !chained
	if oneStep {
		c.observeHold(now, e)
	}
	c.chargePolicy(now, e, r.Bytes)
	c.release(e)
	granted := e.granted
	if e.granted != 0 && oneStep {
		// Moving average over about the last 16 grants of the state.
		took := now.Sub(c.when(e.granted))
		if avg, ok := c.took[e.queued]; ok {
			took = avg + (took-avg)/16
		}
		c.took[e.queued] = took
	}
	d := e.d
	c.record(e, r)
	// A failed cleanup keeps the error that called for it: that error, not
	// the cleanup's, decides whether the DTR is tried again.
	if r.Error != nil && !(d.Cleanup && d.Error != nil) {
		f := *r.Error
		f.State = d.State
		d.Error = &f
	}
	d.Cleanup = false
	switch {
	case d.State == k.Cancelling:
		c.must(d.Transition(e.queued.Completed(), now))
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
	if d.Chained {
		if took, err := c.chainedResult(now, e, r, granted); took {
			return err
		}
		c.unreserve(now, e) // no PRE_CLEAN outcome for it: queued as usual
	}
	c.route(now, e)
	return nil
}

// record copies into the DTR what a worker's result says: what any stage
// reports, then what the grant's own state does with it (one case per
// state that has something of its own).
func (c *Core) record(e *entry, r Result) {
	d := e.d
	// A failed step's size is what it moved, not the file's: delivery and
	// staging hold the source to d.Size.
	if r.Error == nil && r.Size > 0 {
		d.Size = r.Size
	}
	if r.Bytes > 0 {
		d.Bytes = r.Bytes
	}
	if r.Checksum != "" {
		d.Checksum = r.Checksum
	}
	if r.ChecksumSource != "" {
		d.ChecksumSource = r.ChecksumSource
	}
	if r.TURL != "" {
		d.TURL = r.TURL
	}
	if classOf(e.queued).IsTransfer {
		d.Started, d.Ended = r.Started, r.Ended
		d.TransferMethod, d.ChecksumUnverified = r.TransferMethod, r.ChecksumUnverified
		if r.Error == nil {
			// What this transfer checked, not what an earlier attempt did:
			// a copy that could verify nothing leaves neither behind.
			d.Checksum, d.ChecksumSource = r.Checksum, r.ChecksumSource
		}
	}
	switch e.queued {
	case dtr.CheckCache:
		if r.Error == nil {
			d.Cache, d.CacheFile = r.Cache, r.CacheFile
			if d.Cache == dtr.CacheDownload {
				c.cacheAs(e)
			}
		}
	case dtr.QueryReplica:
		if r.Error == nil {
			d.Size = r.Size // what the source has now, 0 if unknown
		}
	case dtr.RegisterReplica:
		if !d.Cleanup && r.Error == nil {
			e.setPost(postFileInPlace)
		}
	case dtr.ProcessCache:
		if d.Cache != "" && !d.Cleanup && r.Error == nil {
			e.setPost(postFileInPlace)
		}
		c.uncache(e)
	}
}

// giveBack puts a DTR whose worker returned its grant unfinished back in
// the queue it was granted from, freeing the slot and spending no attempt;
// a grant to stage a copy unpins it, and a cleanup or a finalise is
// granted as such again. A cancelled transfer is not given back: its
// cleanup follows as after any other end.
func (c *Core) giveBack(now time.Time, e *entry, bytes int64) {
	d := e.d
	c.chargePolicy(now, e, bytes)
	c.release(e)
	c.unreserve(now, e)
	if classOf(e.queued).Pins {
		c.unpin(e)
	}
	if e.queued == dtr.RegisterReplica && !d.Cleanup {
		e.setPost(postFinaliseAgain) // a finalise given back is granted as one again
	}
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
	c.setLease(e, c.nanos(now.Add(c.cfg.Lease)))
	if bytes > e.d.Bytes {
		e.d.Bytes = bytes
	}
	if classOf(e.queued).PerHost {
		c.links.moved(now, e, bytes)
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
		c.unqueue(e)
		c.states[d.State].drop(e.share)
		c.must(d.Transition(classOf(d.State).CancelTo, now))
		c.route(now, e)
	case d.State.IsActive():
		c.unreserve(now, e) // a cancelled DTR is not pre-cleaned
		if k := classOf(e.queued); k.Cancelling != 0 {
			c.must(d.Transition(k.Cancelling, now))
		}
		c.out.CancelRunning = append(c.out.CancelRunning, c.grantOf(e))
	case d.State == dtr.New || d.State == dtr.CacheWait:
		heap.Remove(&c.delayed, int(e.index))
		d.NextProcess = time.Time{}
		c.route(now, e)
	case d.State == dtr.CacheProcessed && !d.NextProcess.IsZero():
		// Waiting to finalise again: like post-processing, that goes on,
		// since the file may be in place already.
	}
	return nil
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
		e.home().fix(e)
	}
	c.markDirty(e)
	return nil
}
