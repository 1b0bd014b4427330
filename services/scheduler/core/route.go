package core

// Routing: where a DTR goes next in ARC's states after each result, queued
// for a slot or decided without one.

import (
	"container/heap"
	"fmt"
	"time"

	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// enqueue puts e at the back of its share's queue in its state, in priority
// order, with the time after which it ages (its state's deadline from now).
// Its DTR has just entered the state: the time it did so (its stamp) is
// made later than every stamp before, by a nanosecond or more, so that
// DTRs that came in one step keep their order across a restart too.
func (c *Core) enqueue(now time.Time, e *entry) {
	d := e.d
	stamp := d.EnteredState().UnixNano()
	if stamp <= c.lastStamp {
		stamp = c.lastStamp + 1
		d.StateEntered = time.Unix(0, stamp).UTC()
	}
	c.enqueueAt(now, e, stamp)
}

// enqueueAt is enqueue with the DTR's stamp given: a restored DTR keeps
// the one it was stored with.
func (c *Core) enqueueAt(now time.Time, e *entry, stamp int64) {
	s, d := e.d.State, e.d
	e.share = c.shareIn(c.states[s], d.Share)
	q := &e.share.q
	c.seq++
	e.seq = c.seq
	e.stamp = stamp
	c.lastStamp = max(c.lastStamp, stamp)
	e.tie = tieOf(d.ID)
	e.queued = s
	e.deadline = c.nanos(now.Add(c.cfg.DeadlineFor(s, false)))
	q.add(e)
	q.due = min(q.due, e.deadline)
	if f := e.share.fence; f != nil && f.last == d.ID {
		f.arrival.seq = e.seq // the last head, queued again, still passes
	}
}

// route moves a DTR through the states the scheduler handles itself until it
// rests in a queue, waits for a retry or for another DTR's download of the
// same file, or ends (ARC's DTR states and moves). Without a cache or staging
// it takes ARC's skips: NEW → CACHE_CHECKED → RESOLVED → QUERY_REPLICA (the
// source is checked) → PRE_CLEAN (the destination is checked and cleaned) →
// STAGED_PREPARED → TRANSFER → TRANSFERRED → REQUEST_RELEASED →
// REPLICA_FINALISED → REGISTER_REPLICA (checksum verified, file put in
// place) → CACHE_PROCESSED. A cacheable DTR goes through CHECK_CACHE (or
// CACHE_WAIT) and PROCESS_CACHE; one with options.stage through
// STAGE_PREPARE and RELEASE_REQUEST; a failed source moves on to the next
// replica from REPLICA_FINALISED.
func (c *Core) route(now time.Time, e *entry) {
	d := e.d
	c.markDirty(e)
	for {
		var next dtr.State
		failed := d.Error != nil
		switch d.State {
		case dtr.New:
			if !d.NextProcess.IsZero() && !d.Cancel {
				return
			}
			if d.Cancel {
				next = dtr.CacheProcessed
			} else {
				next = dtr.CacheChecked
				d.TransferGrant, d.TURL = "", ""
				e.endPost(postFileInPlace)
				if len(d.Replicas) > 0 && d.Replica != 0 {
					d.Replica, d.Source = 0, d.Replicas[0] // a retry starts from the first
					c.setHosts(e)
				}
				c.uncache(e)
				d.Cache, d.CacheFile = "", ""
				if c.cacheable(d) {
					next = dtr.CheckCache
					if h := c.caching.of(d.Source); h != nil && h != e {
						next = dtr.CacheWait // another DTR is downloading the same file
						c.must(d.Transition(next, now))
						c.waitForCache(now, e, h)
						return
					}
				}
			}
		case dtr.CacheChecked:
			d.Error = nil // ARC clears errors here
			next = dtr.Resolved
			if d.Cache == dtr.CacheHit {
				next = dtr.ProcessCache // linked from the cache, not transferred
			}
		case dtr.CacheWait:
			if d.Cancel {
				next = dtr.CacheProcessed
				break
			}
			if !d.NextProcess.IsZero() {
				return // waiting
			}
			if h := c.caching.of(d.Source); h != nil && h != e {
				if c.cacheWaitOver(now, d) {
					c.skipCache(now, e) // deadlines.go
					continue
				}
				c.waitForCache(now, e, h) // still downloading: look again later
				return
			}
			next = dtr.CheckCache
		case dtr.Resolved:
			next = dtr.QueryReplica
			if failed || d.Cancel {
				next = dtr.RequestReleased
			}
		case dtr.ReplicaQueried:
			next = dtr.PreClean
			if failed || d.Cancel {
				next = dtr.RequestReleased
			}
		case dtr.PreCleaned:
			next = dtr.StagedPrepared
			if d.Options.Stage {
				next = dtr.StagePrepare
			}
			if failed || d.Cancel {
				next = dtr.RequestReleased
			}
		case dtr.StagedPrepared:
			next = dtr.Transfer
			if failed || d.Cancel {
				next = dtr.Transferred
				if e.pinned {
					next = dtr.ReleaseRequest
				}
			}
		case dtr.Transferred:
			next = dtr.RequestReleased
			if e.pinned {
				next = dtr.ReleaseRequest // the staged copy is released
			}
		case dtr.RequestReleased:
			c.unpin(e)
			next = dtr.ReplicaFinalised
		case dtr.ReplicaFinalised:
			if failed && !d.Cancel && c.nextReplica(e) {
				next = dtr.QueryReplica // no retry spent (ARC's next_replica)
				break
			}
			next = dtr.RegisterReplica
			if (failed || d.Cancel) && d.TransferGrant == "" {
				next = dtr.ReplicaRegistered
			}
		case dtr.ReplicaRegistered:
			next = dtr.CacheProcessed
			if d.Cache == dtr.CacheHit || d.Cache == dtr.CacheDownload {
				next = dtr.ProcessCache // link the entry, or clean it up after a failure
			}
		case dtr.CacheProcessed:
			if !d.NextProcess.IsZero() {
				return // waiting to try post-processing again
			}
			c.decide(now, e)
			if d.State.Final() || !d.NextProcess.IsZero() {
				return
			}
			continue
		default:
			if d.State.IsQueue() {
				c.enqueue(now, e)
			}
			return
		}
		c.must(d.Transition(next, now))
	}
}

// decide ends a DTR at CACHE_PROCESSED: cancelled, done, retried after
// RetryBase·k², or failed (ARC's retry rules). As in ARC, an error
// raised in post-processing (REGISTERING_REPLICA) tries post-processing
// again, since the file may already be in place; every other retry starts
// over from NEW. A checksum mismatch is the exception: the bad copy is gone,
// so it starts over from NEW to transfer the file again. A copy whose
// checksum is not the one the job gave is copied afresh once; when the
// second copy does not match either, the source or its stated checksum is
// wrong and the DTR fails as PERMANENT_REMOTE (the first mismatch is kept
// in the DTR, so a restart between the two changes nothing).
func (c *Core) decide(now time.Time, e *entry) {
	d := e.d
	if e.post == postCleanupLost {
		// The cleanup grant was lost (its processor died, or the grant
		// waited past its lease): the failed transfer's temporary file
		// may still be there, and a retry writes under another name.
		// Clean up again after RetryBase; the decision waits for it.
		e.setPost(postAsRouted)
		d.NextProcess = now.Add(c.cfg.RetryBase)
		heap.Push(&c.delayed, e) // stays CACHE_PROCESSED until then
		return
	}
	switch {
	case d.Cancel && !(d.Error == nil && e.post == postFileInPlace):
		c.must(d.Transition(dtr.Cancelled, now))
	case d.Error == nil:
		d.Attempts++
		c.must(d.Transition(dtr.Done, now))
	default:
		d.Attempts++
		if mismatched(d) {
			if d.ChecksumMismatch == "" {
				d.ChecksumMismatch = d.Checksum
			} else {
				d.Error = mismatchedTwice(d)
			}
		}
		if d.Error.Kind.Retryable() && d.Attempts < d.MaxAttempts {
			c.count.Retries++
			d.NextProcess = now.Add(c.cfg.RetryBase * time.Duration(d.Attempts*d.Attempts))
			if d.Error.State == dtr.RegisteringReplica && d.Error.Kind != dtr.ErrTransferSpeed && d.TransferGrant != "" && !d.Cancel {
				heap.Push(&c.delayed, e) // stays CACHE_PROCESSED until then
				return
			}
			c.must(d.Transition(dtr.New, now))
			heap.Push(&c.delayed, e)
			return
		}
		c.must(d.Transition(dtr.Error, now))
	}
	c.unpin(e)
	c.uncache(e)
	switch d.State {
	case dtr.Done:
		c.count.Done++
	case dtr.Cancelled:
		c.count.Cancelled++
	default:
		c.count.Failed++
	}
	c.out.Final = append(c.out.Final, d)
	c.disown(e)
	delete(c.dtrs, d.ID)
	c.let(d.ID)

}

// mismatched reports whether d's attempt failed because the checksum of its
// copy, which delivery computed, is not the one the job gave: the
// processor's verification of the copy (a TRANSFER_SPEED error in
// REGISTERING_REPLICA, as ARC has it) found that d.Checksum is not
// d.Options.Checksum.
func mismatched(d *dtr.DTR) bool {
	want, got := d.Options.Checksum, d.Checksum
	if d.Error.Kind != dtr.ErrTransferSpeed || d.Error.State != dtr.RegisteringReplica || want == "" || got == "" {
		return false
	}
	return checksum.SameType(want, got) && !checksum.Equal(want, got)
}

// mismatchedTwice is the error of a DTR whose second fresh copy did not
// have the expected checksum either.
func mismatchedTwice(d *dtr.DTR) *dtr.Failure {
	got := d.Checksum
	if !checksum.Equal(d.ChecksumMismatch, got) {
		got = d.ChecksumMismatch + ", then " + got
	}
	return &dtr.Failure{Kind: dtr.ErrPermanentRemote, State: d.Error.State, Location: dtr.LocationSource,
		Text: fmt.Sprintf("checksum mismatch: expected %s, got %s (twice: the source or its stated checksum is wrong)", d.Options.Checksum, got)}
}

func (c *Core) markDirty(e *entry) {
	if !e.dirty {
		e.dirty = true
		c.dirty = append(c.dirty, e)
	}
}

// must panics on an illegal transition: route only takes moves in the table,
// so one that is refused is a bug in the core, not bad input.
func (c *Core) must(err error) {
	if err != nil {
		panic(err)
	}
}
