package scheduler

// The committer: each step's journal records, grants, final DTRs and notices
// go out in order, and only then is what the step took in acknowledged.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/bus"
)

// hand gives a step's commit to the committer, waiting while it is busy
// with earlier ones; false if ctx ended first. While it waits the loop
// still answers queries that change nothing; one that would change
// something is parked, to be answered once the commit is handed over, or,
// while the store is full (which holds the committer back), refused with
// errStoreFull before it changes anything.
func (s *Service) hand(ctx context.Context, commits chan<- *commit, c *commit) bool {
	if c.empty() {
		if c.done != nil {
			c.done(nil)
		}
		return true
	}
	for {
		select {
		case commits <- c:
			return true
		case q := <-s.queries:
			s.answerAside(q, nil)
		case <-ctx.Done():
			if c.done != nil {
				c.done(errStopped)
			}
			return false
		}
	}
}

// errStoreFull answers the changes asked of a scheduler whose committer
// waits for room in the store.
var errStoreFull = errors.New("503 store full: JetStream has no space for the scheduler's records; nothing was changed; try again later")

// commit is what one step leaves to do, in order: journal the records of
// the changed DTRs, final ones too (and publish rejections); publish
// grants and final DTRs; send the best-effort notices; and only then
// acknowledge the step's inputs (or terminate the refused ones).
type commit struct {
	records, finals     []record
	rejections, publish []*nats.Msg
	notices             []*nats.Msg
	acks, terms         []jetstream.Msg
	// events are the step's history events: handed to the history's
	// writer once the step's records are journaled, and stored before
	// the inputs are acknowledged (awaitHistory).
	events []historyItem
	// done, if set, hears the outcome.
	done func(error)
}

func (c *commit) empty() bool {
	return len(c.records)+len(c.rejections)+len(c.publish)+len(c.finals)+len(c.notices)+len(c.acks)+len(c.terms)+len(c.events) == 0
}

// commitTimeout bounds how long the committer goes on storing the outputs
// of steps already made once the scheduler stops.
const commitTimeout = 5 * time.Second

// commitLoop carries out commits in the order made. A message that
// JetStream refuses for want of space (bus.StoreFull) is published again,
// after a pause growing from 100 ms to 5 s, until it is stored: the commit
// waits where it is, its inputs unacknowledged, and the next steps wait
// for it; the role reports the full store (bus.Space) meanwhile. Commits that wait
// while one is carried out are carried out together, each phase of all of
// them before the next phase, so that a busy scheduler stores and publishes
// in large batches. After a failure nothing more is published and the
// failure is reported on failed; the inputs of the failed and later
// commits stay unacknowledged and are redelivered. Between commits it
// begins the journal's checkpoints when they are due.
func (s *Service) commitLoop(ctx context.Context, commits <-chan *commit, failed chan<- error) {
	defer s.journal.Wait()
	space := bus.SpaceOf(s.nc)
	s.journal.full = space
	var broken error
	tick := time.NewTicker(min(time.Second, s.journal.every))
	defer tick.Stop()
	// While a commit waits for room, checkpoints still begin: they purge
	// the journal, which may be what is full.
	stopWhileFull := make(chan struct{})
	var whileFull sync.WaitGroup
	whileFull.Go(func() { s.checkpointWhileFull(ctx, stopWhileFull, space) })
	defer func() { close(stopWhileFull); whileFull.Wait() }()
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
			if err == nil {
				if d := space.Stored(); d > 0 {
					s.log.Info("JetStream store has room again; the scheduler goes on", "held_back", d.Round(time.Millisecond))
				}
			}
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

// checkpointWhileFull begins the journal's checkpoints when they are due
// while the role's writes are refused for want of space, until stop is
// closed.
// A checkpoint that begins while an Append waits covers only the records
// appended before it, and purges no journal message after them.
func (s *Service) checkpointWhileFull(ctx context.Context, stop <-chan struct{}, space *bus.Space) {
	t := time.NewTicker(min(time.Second, s.journal.every))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			if full, _, _ := space.Full(); full && s.journal.Due(now) {
				s.journal.Checkpoint(ctx)
			}
		}
	}
}

func (s *Service) carryOut(ctx context.Context, cs []*commit) error {
	out := bus.NewBatch(ctx, s.js)
	out.Full = s.journal.full
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
	// Every record, final ones too, is journaled before anything is
	// published: a leader deposed since has its append refused and
	// publishes nothing. A final DTR whose announcement was lost (the
	// scheduler died in between) is announced again by the next leader,
	// from the journal (announceKeptFinals; the generator takes a final
	// DTR once).
	for _, c := range cs {
		for _, m := range c.rejections {
			out.Add(m)
		}
	}
	if err := s.journal.Append(ctx, records(func(c *commit) []record { return append(c.records[:len(c.records):len(c.records)], c.finals...) })); err != nil {
		return fmt.Errorf("persist: %w", err)
	}
	// Journaled: the steps happened, and their history is recorded.
	var history uint64
	for _, c := range cs {
		history = s.history.send(c.events)
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
	// The inputs are acknowledged once the history is stored, without
	// the committer waiting for it (historyacks.go).
	if s.ackWhenStored(history, cs) {
		return nil
	}
	s.awaitHistory(ctx, history)
	// Acknowledgements write nothing fenced: a leader whose term may have
	// passed (it was frozen between the step and now, or waiting for its
	// history just above) leaves its inputs to the next one.
	if s.election != nil && s.election.lapsed(time.Now()) {
		return fmt.Errorf("%w: the term lapsed before the inputs were acknowledged", errDeposed)
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
