package scheduler

// The committer: each step's journal records, grants, final DTRs and notices
// go out in order, and only then is what the step took in acknowledged.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
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
	// announce are the step's final DTRs, announced by the committer
	// together with those of the steps around it (gatherFinalsFor).
	announce []finalEntry
	// notices are the step's stops; changes its DTRs' new states, sent
	// as notices together with those of the steps settled with it.
	notices     []*nats.Msg
	changes     []api.StateChange
	acks, terms []jetstream.Msg
	// now says the step must not be held for final DTRs to gather: its
	// notices tell workers to stop, or it left the scheduler with no
	// unfinished DTR, so that no more would come to gather (the end of
	// a small job on a quiet scheduler is announced at once), or it
	// announces again what the last leader may not have (keptFinals).
	now bool
	// events are the step's history events: handed to the history's
	// writer once the step's records are journaled, and stored before
	// the inputs are acknowledged (awaitHistory).
	events []historyItem
	// index, if set, is the body of a restart index of the core as the
	// step left it (restoreindex.go), for the next checkpoint.
	index []byte
	// done, if set, hears the outcome.
	done func(error)
}

func (c *commit) empty() bool {
	return len(c.records)+len(c.rejections)+len(c.publish)+len(c.finals)+len(c.announce)+len(c.notices)+len(c.changes)+len(c.acks)+len(c.terms)+len(c.events) == 0 && c.index == nil
}

// gatherFinalsFor is how long the committer holds a step's final DTRs to
// announce them with those of the steps after it (and so how long the
// step's notices and the acknowledgement of its inputs wait). With ARC's
// few slots a step ends one or two DTRs, and each Finals event costs its
// publication and acknowledgement, the generator's acknowledgement, and
// two writes of the job's records in the generator with theirs: some ten
// messages, which a 1 KiB transfer's DTR would otherwise pay in full.
// Gathered for this long, they cost that once for every DTR ending in
// the window (a few dozen at a thousand DTRs a second). It is short next
// to SLUICE_TICK and to what a job takes from submission to its end,
// which grows at most by this much; grants are never held.
const gatherFinalsFor = 10 * time.Millisecond

// gatherFinalsUpTo is how many final DTRs, once gathered, go out at once:
// they fill a Finals event.
const gatherFinalsUpTo = maxFinalsPerMessage

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
// in large batches.
//
// A commit is carried out in two phases, pipelined: store (journal the
// records, then publish the rejections, grants and final DTRs) here, and
// settle (wait for the grants and final DTRs to be stored, send the
// notices, wait for the history to be stored and acknowledge the inputs)
// in a settler of its own, in the same order. While one batch of commits settles, the
// next is journaled and its grants go out: a freed slot's next grant waits
// for no publication, history store or acknowledgement of an earlier
// step. At most settleQueue batches wait to settle: a message refused for
// want of space holds the settler, and through it the committer, back.
// Every guarantee holds as before: a commit's grants are
// published only once its records are journaled, after those of every
// commit before it; its inputs are acknowledged only once its outputs and
// history are stored; and after a failure in either phase nothing more is
// published or acknowledged and the failure is reported on failed; the
// inputs of the failed and later commits stay unacknowledged and are
// redelivered, while those stored before a failure to store are settled.
//
// Final DTRs are not announced with their step's grants: once a step that
// ended some is stored, its commit and those after it are held until
// gatherFinalsFor has passed, gatherFinalsUpTo final DTRs are gathered, a
// commit comes whose caller waits for it (or that tells workers to stop,
// or after which the scheduler holds no unfinished DTR), or the committer
// stops; then the final DTRs of them all go out in as
// few Finals events as fit, and the held commits settle together, in
// order, once those are stored. A step's inputs are still acknowledged
// only once its final DTRs are stored, and its notices sent after those
// of the steps before it; a held final DTR is journaled, and the journal
// keeps it (journal.unannounced) until it is announced, so that a leader
// that dies or is frozen meanwhile leaves it to the next one to announce.
//
// Between commits it begins the journal's checkpoints when they are due.
func (s *Service) commitLoop(ctx context.Context, commits <-chan *commit, failed chan<- error) {
	defer s.journal.Wait()
	space := bus.SpaceOf(s.nc)
	s.journal.full = space
	tick := time.NewTicker(min(time.Second, s.journal.every))
	defer tick.Stop()
	// While a commit waits for room, checkpoints still begin: they purge
	// the journal, which may be what is full.
	stopWhileFull := make(chan struct{})
	var whileFull sync.WaitGroup
	whileFull.Go(func() { s.checkpointWhileFull(ctx, stopWhileFull, space) })
	defer func() { close(stopWhileFull); whileFull.Wait() }()
	st := &settler{s: s, failed: failed, in: make(chan storedBatch, settleQueue)}
	var settling sync.WaitGroup
	settling.Go(func() { st.run(ctx) })
	defer func() { close(st.in); settling.Wait() }()
	var storeErr error
	// send hands stored commits to the settler.
	send := func(b storedBatch) {
		select {
		case st.in <- b:
		case <-ctx.Done():
			for _, c := range b.cs {
				if c.done != nil {
					c.done(errStopped)
				}
			}
		}
	}
	// held are the stored commits whose final DTRs are gathered, in
	// order; heldFinals counts those.
	var held storedBatch
	heldFinals := 0
	window := cmp.Or(s.gatherFor, gatherFinalsFor)
	gathered := time.NewTimer(window)
	gathered.Stop()
	var gatheredC <-chan time.Time // gathered.C while commits are held
	// announce publishes the final DTRs of the held commits and hands
	// them to the settler. After a failure to settle nothing more is
	// published: the settler reports it to their callers.
	announce := func() {
		if len(held.cs) == 0 {
			return
		}
		b := held
		held, heldFinals, gatheredC = storedBatch{}, 0, nil
		gathered.Stop()
		if st.broken() == nil {
			p, err := s.announceFinals(ctx, b.cs, b.ps)
			if err != nil {
				b.err, storeErr = err, err
			} else {
				b.ps = append(b.ps, p)
			}
		}
		send(b)
	}
	defer announce()
	for {
		var c *commit
		select {
		case <-tick.C:
			if storeErr == nil && st.broken() == nil && s.journal.Due(time.Now()) {
				s.journal.Checkpoint(ctx)
			}
			continue
		case <-gatheredC:
			announce()
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
		// After a failure to store, nothing more is stored; the settler
		// reports it once it has settled the batches stored before it.
		err := storeErr
		if err == nil {
			err = st.broken()
		}
		var p published
		if err == nil {
			p, err = s.store(ctx, cs)
			if err == nil {
				if d := space.Stored(); d > 0 {
					s.log.Info("JetStream store has room again; the scheduler goes on", "held_back", d.Round(time.Millisecond))
				}
			}
		}
		switch finals, now := gatheredIn(cs); {
		case err != nil:
			// The commits stored before are settled first.
			announce()
			storeErr = err
			send(storedBatch{cs: cs, ps: []published{p}, err: err})
		case len(held.cs) == 0 && finals == 0:
			send(storedBatch{cs: cs, ps: []published{p}})
		default:
			// Held, and every commit after it too: notices and
			// acknowledgements keep the order of the steps.
			if len(held.cs) == 0 {
				gathered.Reset(window)
				gatheredC = gathered.C
			}
			held.cs, held.ps = append(held.cs, cs...), append(held.ps, p)
			heldFinals += finals
			if now || heldFinals >= gatherFinalsUpTo || len(held.ps) >= gatherBatchesUpTo {
				announce()
			}
		}
		if storeErr == nil && st.broken() == nil && s.journal.Due(time.Now()) {
			s.journal.Checkpoint(ctx)
		}
	}
}

// settleQueue is how many stored batches of commits may wait to settle
// before the committer stores no more: a history store that is slow holds
// the grants back only once this many steps wait for it. It holds more
// than the batches stored while the history's writer gathers a few steps'
// events (historyCoalesce: a quarter of a second of small steps, with
// ARC's slot counts).
const settleQueue = 1024

// gatherBatchesUpTo is how many stored batches of commits are held at
// most while their final DTRs are gathered.
const gatherBatchesUpTo = 64

// storedBatch is a batch of commits whose records are journaled and whose
// grants and final DTRs are published (or err, why not), to settle.
type storedBatch struct {
	cs  []*commit
	ps  []published
	err error
}

// published is what the settling of stored commits waits for: their
// grants' and final DTRs' publication (out, whose acknowledgements come
// in meanwhile), and their history (up to its ticket history). journaled
// is the journal's sequence once their records were appended; announced,
// if set, the sequence up to which final records are announced once out
// is stored.
type published struct {
	out                  *bus.Batch
	history              uint64
	journaled, announced uint64
}

// gatheredIn counts the final DTRs of commits to announce, and says
// whether one of them must not be held: its caller waits, or it says so
// (commit.now).
func gatheredIn(cs []*commit) (finals int, now bool) {
	for _, c := range cs {
		finals += len(c.announce)
		now = now || c.done != nil || c.now
	}
	return finals, now
}

// settler settles stored commits in order (commitLoop) and holds the first
// failure of either phase.
type settler struct {
	s      *Service
	failed chan<- error
	in     chan storedBatch
	mu     sync.Mutex
	err    error
}

// broken returns the first failure, nil while there is none.
func (st *settler) broken() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.err
}

// fail records a failure, the first one for good, and reports it.
func (st *settler) fail(err error) {
	st.mu.Lock()
	first := st.err == nil
	if first {
		st.err = err
	}
	st.mu.Unlock()
	if first {
		select {
		case st.failed <- err:
		default:
		}
	}
}

// run settles what comes in until in is closed; a batch that comes after
// a failure is not settled, and its callers hear the failure. The batches
// waiting when one is taken are settled with it, together (one wait for
// their history), as the committer stores those that wait together: the
// settler keeps up with the committer however small its batches.
func (st *settler) run(ctx context.Context) {
	var bs []storedBatch
	for b := range st.in {
		bs = append(bs[:0], b)
	more:
		for b.err == nil {
			select {
			case next, ok := <-st.in:
				if !ok {
					break more
				}
				b = next
				bs = append(bs, b)
			default:
				break more
			}
		}
		// Every batch before one that failed to store is settled; that
		// one and any after it hear the failure.
		var cs []*commit
		var ps []published
		for _, b := range bs {
			if b.err != nil {
				break
			}
			cs = append(cs, b.cs...)
			ps = append(ps, b.ps...)
		}
		err := st.broken()
		if err == nil && len(cs) > 0 {
			if err = st.s.settle(ctx, cs, ps); err != nil {
				st.fail(err)
			}
		}
		if err == nil {
			for _, b := range bs {
				if b.err != nil {
					st.fail(b.err)
					break
				}
			}
		}
		for _, b := range bs {
			if err == nil && b.err != nil {
				err = b.err
			}
			for _, c := range b.cs {
				if c.done != nil {
					c.done(err)
				}
			}
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

// carryOut stores commits, announces their final DTRs and settles them
// (commitLoop does the three in a pipeline).
func (s *Service) carryOut(ctx context.Context, cs []*commit) error {
	p, err := s.store(ctx, cs)
	if err != nil {
		return err
	}
	f, err := s.announceFinals(ctx, cs, []published{p})
	if err != nil {
		return err
	}
	return s.settle(ctx, cs, []published{p, f})
}

// announceFinals publishes the final DTRs of stored commits (stored as
// ps say), together, in as few Finals events as fit (without waiting:
// settle does), unless the term has lapsed since they were journaled: a
// leader frozen meanwhile leaves them to the next one, which finds them
// in the journal.
func (s *Service) announceFinals(ctx context.Context, cs []*commit, ps []published) (published, error) {
	var entries []finalEntry
	for _, c := range cs {
		entries = append(entries, c.announce...)
	}
	if len(entries) == 0 {
		return published{}, nil
	}
	if s.election != nil && s.election.lapsed(time.Now()) {
		return published{}, fmt.Errorf("%w: the term lapsed before the final DTRs were announced", errDeposed)
	}
	msgs, err := finalsMessages(ctx, entries, int(s.nc.MaxPayload())/2)
	if err != nil {
		return published{}, fmt.Errorf("announce final DTRs: %w", err)
	}
	// Every final record journaled up to the last of these commits is
	// among them or was announced before.
	var upTo uint64
	for _, p := range ps {
		upTo = max(upTo, p.journaled)
	}
	out := bus.NewBatch(ctx, s.js)
	out.Full = s.journal.full
	for _, m := range msgs {
		out.Add(m)
	}
	return published{out: out, announced: upTo}, nil
}

// store journals the records of commits, then publishes their
// rejections (and waits for them to be stored) and their grants and final
// DTRs (without waiting: settle does), and hands their history to the
// writer.
func (s *Service) store(ctx context.Context, cs []*commit) (published, error) {
	var history uint64
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
	// from the journal (keptFinals; the generator takes a final
	// DTR once).
	for _, c := range cs {
		for _, m := range c.rejections {
			out.Add(m)
		}
	}
	before := s.journal.ReadUpTo()
	if err := s.journal.Append(ctx, records(func(c *commit) []record { return append(c.records[:len(c.records):len(c.records)], c.finals...) })); err != nil {
		return published{}, fmt.Errorf("persist: %w", err)
	}
	journaled := s.journal.ReadUpTo()
	// An index of the core after one of these steps shows all the journal
	// held before them, and what they changed is journaled after that: it
	// is as of where the journal ended before them.
	var index []byte
	for _, c := range cs {
		if c.index != nil {
			index = c.index
		}
	}
	if index != nil {
		if len(index) > 0 {
			index = indexAsOf(before, index)
		}
		s.journal.SetIndex(index, before)
	}
	// Journaled: the steps happened, and their history is recorded. A
	// step whose caller waits has its history stored at once, even while
	// the settler waits for the steps before it to be gathered.
	urgent := false
	for _, c := range cs {
		history = s.history.send(c.events)
		urgent = urgent || c.done != nil && len(c.events) > 0
	}
	if w := s.historyWriter.Load(); w != nil && urgent {
		w.ask(true)
	}
	if err := out.Wait(ctx); err != nil {
		return published{}, fmt.Errorf("publish rejections: %w", err)
	}
	for _, c := range cs {
		for _, m := range c.publish {
			out.Add(m)
		}
	}
	return published{out: out, history: history, journaled: journaled}, nil
}

// settle waits for the publication of stored commits' grants and final
// DTRs (ps, in the order stored), sends their notices, and acknowledges
// (or terminates) their inputs once their history is stored.
func (s *Service) settle(ctx context.Context, cs []*commit, ps []published) error {
	var history uint64
	for _, p := range ps {
		if p.out != nil {
			if err := p.out.Wait(ctx); err != nil {
				return fmt.Errorf("publish: %w", err)
			}
		}
		if p.announced > 0 {
			s.journal.Announced(p.announced)
		}
		history = max(history, p.history)
	}
	// Notices (grants' stops, state changes) go out once the grants are
	// stored, not held for the history: a stop must not wait a second.
	// Like acknowledgements they write nothing fenced, so a leader whose
	// term may have passed (frozen between the step and now) sends none.
	if s.election != nil && s.election.lapsed(time.Now()) {
		return fmt.Errorf("%w: the term lapsed before the notices were sent", errDeposed)
	}
	for _, c := range cs {
		for _, m := range c.notices {
			_ = s.nc.PublishMsg(m)
		}
	}
	for _, m := range stateNotices(ctx, cs, int(s.nc.MaxPayload())/2) {
		_ = s.nc.PublishMsg(m)
	}
	// The inputs are acknowledged once the history is stored: the
	// settler waits for it (the committer goes on meanwhile), so that a
	// leader that dies or is frozen leaves little history unstored.
	urgent := false
	for _, c := range cs {
		urgent = urgent || c.done != nil
	}
	s.awaitHistory(ctx, history, urgent)
	// A leader whose term passed while it waited for its history just
	// above leaves its inputs to the next one.
	if s.election != nil && s.election.lapsed(time.Now()) {
		return fmt.Errorf("%w: the term lapsed before the inputs were acknowledged", errDeposed)
	}
	for _, c := range cs {
		for _, m := range c.terms {
			_ = m.Term()
		}
		for _, m := range c.acks {
			_ = m.Ack()
		}
	}
	return nil
}
