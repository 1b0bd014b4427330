package scheduler

// Standing by: a scheduler that does not lead keeps a warm copy of the
// leader's state, so that it can take over in a moment.
//
// It loads the checkpoint bucket once and then applies every record the
// leader appends to the journal, read by a tail (an ordered consumer from
// the journal's first message), to a core of its own: the DTR's entry is
// forgotten and restored from the newer record (core.Renew, which keeps
// when a grant still running began).
// The core never ticks, so it makes no decision, and its lease clock
// stands still. The records not yet checkpointed are kept as the leader
// keeps them, and forgotten once the journal's first message has passed
// them (the leader's checkpoint put them in the bucket).
//
// The tail is started before the bucket is read: a journal message purged
// before the tail brought it was checkpointed before the bucket was read,
// and so is in the copy. Once the tail has begun, its messages must follow
// one another; a gap (a purge that overtook a standby far behind) makes it
// start over.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// errResync is the error of a standby whose tail missed journal messages:
// it starts over.
var errResync = errors.New("the journal moved on past this standby's copy")

// errStandby answers changes asked of a standby (its web page's).
var errStandby = errors.New("503 this scheduler stands by: the leader makes changes (sluice shares, priority and cancel reach it); try again")

// journalTail reads the journal as it is written. What it brings waits in
// a queue of its own however long the standby is busy (loading the
// checkpoints, say), so that a busy leader's purges do not overtake it.
type journalTail struct {
	cc    jetstream.ConsumeContext
	mu    sync.Mutex
	queue []jetstream.Msg
	// ready hears that the queue has messages.
	ready chan struct{}
	// first is the latest sequence the first message may have; last is
	// the sequence of the last message read (0: none yet).
	first, last uint64
}

// take returns the messages queued so far.
func (t *journalTail) take() []jetstream.Msg {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.queue
	t.queue = nil
	return q
}

// startTail starts reading the journal from its first message.
func (s *Service) startTail(ctx context.Context) (*journalTail, error) {
	cons, err := s.js.OrderedConsumer(ctx, bus.StreamJournal, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return nil, fmt.Errorf("journal tail: %w", err)
	}
	t := &journalTail{ready: make(chan struct{}, 1)}
	t.cc, err = cons.Consume(func(m jetstream.Msg) {
		t.mu.Lock()
		t.queue = append(t.queue, m)
		t.mu.Unlock()
		select {
		case t.ready <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return nil, fmt.Errorf("journal tail: %w", err)
	}
	st, err := s.js.Stream(ctx, bus.StreamJournal)
	if err != nil {
		t.cc.Stop()
		return nil, fmt.Errorf("journal tail: %w", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.cc.Stop()
		return nil, fmt.Errorf("journal tail: %w", err)
	}
	t.first = info.State.FirstSeq
	if info.State.Msgs == 0 {
		t.first = info.State.LastSeq + 1
	}
	// What was purged before is in the checkpoints, read next.
	s.journal.Read(t.first - 1)
	return t, nil
}

// warmUp builds the standby's copy: the tail, then the checkpoints.
func (s *Service) warmUp(ctx context.Context) (*journalTail, error) {
	s.leases.stop(time.Now(), "standing by") // no lease runs out in a copy
	tail, err := s.startTail(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.restore(ctx, tail.first); err != nil {
		tail.cc.Stop()
		return nil, fmt.Errorf("scheduler recovery: %w", err)
	}
	return tail, nil
}

// standBy keeps the copy warm and tries to lead four times a second; it
// returns the term once this scheduler has won one and written its
// barriers (the tail is then stopped).
func (s *Service) standBy(ctx context.Context, tail *journalTail) (uint64, error) {
	campaign := time.NewTicker(250 * time.Millisecond)
	defer campaign.Stop()
	prune := time.NewTicker(2 * time.Second)
	defer prune.Stop()
	sample := time.NewTicker(time.Second)
	defer sample.Stop()
	// While the store is too full for anyone to be elected, this standby
	// answers the queries (and refuses changes), as a leader would.
	var readOnly *apiService
	defer func() {
		if readOnly != nil {
			readOnly.Stop()
		}
	}()
	try := true
	began := time.Now()
	for {
		s.looped.Store(time.Now().UnixNano())
		if s.restPending && time.Since(began) > s.election.ttl {
			s.readRest(ctx)
		}
		if try {
			try = false
			term, full, err := s.tryToLead(ctx, tail)
			if err != nil || term != 0 {
				return term, err
			}
			switch {
			case full && readOnly == nil:
				if readOnly, err = s.addAPI(); err != nil {
					readOnly = nil
				}
			case !full && readOnly != nil:
				readOnly.Stop()
				readOnly = nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tail.ready:
			if err := s.applyTail(tail, tail.take()); err != nil {
				return 0, err
			}
		case lc, ok := <-s.loads:
			if err := s.takeLoaded(lc, ok); err != nil {
				return 0, err
			}
		case <-campaign.C:
			try = true
		case <-prune.C:
			s.pruneKept(ctx)
		case q := <-s.queries:
			s.answerAside(q, errStandby)
		case now := <-sample.C:
			s.sample(now)
		}
	}
}

// tryToLead campaigns; won, it catches up with the journal and begins
// its term. 0 and no error: it does not lead (yet); full says the store
// refused the campaign for want of space.
func (s *Service) tryToLead(ctx context.Context, tail *journalTail) (term uint64, full bool, err error) {
	space := bus.SpaceOf(s.nc)
	won, err := s.election.campaign(ctx)
	if bus.StoreFull(err) {
		if space.Refused(err) {
			s.log.Warn("the store is full: no scheduler can be elected until it has room; answering queries meanwhile", "err", err)
		}
		return 0, true, nil
	}
	if err != nil {
		if time.Since(s.campaignLogged) > 30*time.Second { // tried four times a second
			s.campaignLogged = time.Now()
			s.log.Warn("cannot take part in the leader election; trying again", "err", err)
		}
		return 0, false, nil
	}
	if d := space.Stored(); d > 0 {
		s.log.Info("JetStream store has room again", "held_back", d.Round(time.Millisecond))
	}
	if !won {
		return 0, false, nil
	}
	for try := 0; ; try++ {
		if err := s.drainTail(tail); err != nil {
			s.election.resign(ctx)
			return 0, false, err
		}
		bctx, cancel := context.WithTimeout(ctx, s.election.ttl/2)
		term, bucketLast, behind, err := beginTerm(bctx, s.js, s.journal.ReadUpTo(), s.election.me.Name+" "+s.election.me.Instance)
		cancel()
		if err != nil {
			full := bus.StoreFull(err)
			switch {
			case !full:
				s.log.Warn("won the election but could not begin the term; standing by", "err", err)
			case time.Since(s.campaignLogged) > 30*time.Second: // tried four times a second
				// A bucket over its limit (set below what it holds)
				// takes no key it does not hold yet: the first term's
				// barrier is refused until it has room.
				s.campaignLogged = time.Now()
				s.log.Warn("won the election but the store refused the term's barrier for want of space (is bucket "+bus.BucketDTRs+" over its limit, SLUICE_DTRS_MAX_BYTES?); standing by and trying again", "err", err)
			}
			s.election.resign(ctx)
			return 0, full, nil
		}
		if !behind {
			tail.cc.Stop()
			s.pruneKept(ctx)
			s.journal.Lead(term, bucketLast, nil)
			return term, false, nil
		}
		// The journal has more than the tail brought: wait for it.
		if time.Now().After(s.election.holdsUntil().Add(-s.election.ttl/4)) || try == 100 {
			s.log.Warn("won the election but could not catch up with the journal in time; standing by")
			s.election.resign(ctx)
			return 0, false, nil
		}
		select {
		case <-tail.ready:
			if err := s.applyTail(tail, tail.take()); err != nil {
				s.election.resign(ctx)
				return 0, false, err
			}
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			s.election.resign(context.WithoutCancel(ctx))
			return 0, false, ctx.Err()
		}
	}
}

// drainTail applies what the tail has brought so far.
func (s *Service) drainTail(tail *journalTail) error {
	return s.applyTail(tail, tail.take())
}

// applyTail applies journal messages to the copy, in order.
func (s *Service) applyTail(tail *journalTail, msgs []jetstream.Msg) error {
	for len(msgs) > 0 {
		var recs [][]byte
		var seqs []uint64
		for len(msgs) > 0 && len(recs) < 8192 {
			m := msgs[0]
			msgs = msgs[1:]
			md, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("journal tail: %w", err)
			}
			seq := md.Sequence.Stream
			if tail.last == 0 && seq > tail.first || tail.last != 0 && seq != tail.last+1 {
				return fmt.Errorf("%w: journal message %d came after %d (the first to expect was %d)", errResync, seq, tail.last, tail.first)
			}
			tail.last = seq
			s.journal.Read(seq)
			for line := range bytes.Lines(m.Data()) {
				if line = bytes.TrimSuffix(line, []byte{'\n'}); len(line) > 0 {
					recs, seqs = append(recs, line), append(seqs, seq)
				}
			}
		}
		now := time.Now()
		for i, d := range decodeRecords(recs, s.log) {
			if d != nil {
				s.applyRecord(now, d, recs[i], seqs[i])
			}
		}
		s.core.Take() // the copy decides nothing: what Restore routed is dropped
	}
	return nil
}

// applyRecord puts a DTR's newer record in the copy.
func (s *Service) applyRecord(now time.Time, d *dtr.DTR, data []byte, seq uint64) {
	final := d.State.Final()
	s.stored.Add(d.ID)
	s.journal.Keep(d.ID, data, final, seq)
	if final {
		s.core.Forget(d.ID)
		s.finished.Add(d.ID, now)
		return
	}
	if err := s.core.Renew(now, d); err != nil {
		s.log.Error("journaled DTR not restored", "dtr", d.ID, "err", err)
	}
}

// pruneKept forgets the kept records that the journal no longer holds.
func (s *Service) pruneKept(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := s.js.Stream(ctx, bus.StreamJournal)
	if err != nil {
		return
	}
	info, err := st.Info(ctx)
	if err != nil {
		return
	}
	first := info.State.FirstSeq
	if info.State.Msgs == 0 {
		first = info.State.LastSeq + 1
	}
	s.journal.Prune(first)
}
