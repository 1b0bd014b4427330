package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// testInputs publishes n inputs on a stream of the test's own and takes
// them, unacknowledged, as a step takes its inputs; the consumer tells
// how many are still unacknowledged.
func testInputs(t *testing.T, js jetstream.JetStream, n int) ([]jetstream.Msg, jetstream.Consumer) {
	t.Helper()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "INPUTS", Subjects: []string{"inputs"}}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateConsumer(ctx, "INPUTS", jetstream.ConsumerConfig{Durable: "in", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		if _, err := js.Publish(ctx, "inputs", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var ms []jetstream.Msg
	for m := range batch.Messages() {
		ms = append(ms, m)
	}
	if len(ms) != n {
		t.Fatalf("took %d inputs, want %d", len(ms), n)
	}
	return ms, cons
}

// unacknowledged is how many of the test's inputs are not acknowledged.
func unacknowledged(t *testing.T, nc *nats.Conn, cons jetstream.Consumer) int {
	t.Helper()
	if err := nc.Flush(); err != nil { // any acknowledgement sent reaches the server
		t.Fatal(err)
	}
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.NumAckPending
}

// finalStep is the commit of a step that ended n DTRs of job "job" and
// took input (if set): their final records and their entries to announce.
func finalStep(t *testing.T, s *Service, n int, input jetstream.Msg) (*commit, []uuid.UUID) {
	t.Helper()
	c := &commit{}
	var ds []*dtr.DTR
	encoded := map[uuid.UUID][]byte{}
	var ids []uuid.UUID
	for i := range n {
		d := newDTR(fmt.Sprint(i))
		d.State, d.Ended = dtr.Done, time.Now()
		r := rec(t, d, dtr.Done, time.Now())
		c.finals = append(c.finals, r)
		c.changes = append(c.changes, api.StateChange{DTR: d.ID, JobID: d.JobID, State: dtr.Done, Share: d.Share})
		ds, encoded[d.ID], ids = append(ds, &d), r.data, append(ids, d.ID)
	}
	var err error
	if c.announce, err = s.finalEntries(context.Background(), time.Now(), ds, encoded, false); err != nil {
		t.Fatal(err)
	}
	if input != nil {
		c.acks = []jetstream.Msg{input}
	}
	return c, ids
}

// plainStep is the commit of a step that changed a DTR, ended none, and
// took input.
func plainStep(t *testing.T, input jetstream.Msg) *commit {
	t.Helper()
	d := newDTR("on its way")
	return &commit{records: []record{rec(t, d, dtr.Transferring, time.Now())}, acks: []jetstream.Msg{input},
		changes: []api.StateChange{{DTR: d.ID, JobID: d.JobID, State: dtr.Transferring, Share: d.Share}}}
}

// finalsEvents hears the Finals events stored: the DTR ids of each.
func finalsEvents(t *testing.T, nc *nats.Conn) <-chan []uuid.UUID {
	t.Helper()
	events := make(chan []uuid.UUID, 100)
	sub, err := nc.Subscribe(api.SubjectDTRFinal, func(m *nats.Msg) {
		fs, err := codec.DecodeFinals(context.Background(), m)
		if err != nil {
			t.Errorf("a Finals event that does not decode: %v", err)
			return
		}
		var ids []uuid.UUID
		for _, f := range fs {
			ids = append(ids, f.DTR.ID)
		}
		events <- ids
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return events
}

// stateChangesHeard hears the state-change notices: the changes of each.
func stateChangesHeard(t *testing.T, nc *nats.Conn) <-chan []api.StateChange {
	t.Helper()
	notices := make(chan []api.StateChange, 100)
	sub, err := nc.Subscribe(api.SubjectDTRState, func(m *nats.Msg) {
		var ch api.StateChanges
		if _, err := codec.DecodeData(context.Background(), m, api.TypeDTRStates, &ch); err != nil {
			t.Errorf("a state-change notice that does not decode: %v", err)
			return
		}
		notices <- ch.Changes
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return notices
}

// finalsStored is how many Finals events the events stream holds.
func finalsStored(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	st, err := js.Stream(context.Background(), bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background(), jetstream.WithSubjectFilter(api.SubjectDTRFinal))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// waitFor polls cond for up to 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 20 s for %s", what)
		}
	}
}

// TestTheFinalDTRsOfConsecutiveStepsGoOutInOneEventAndTheirInputsAreAcknowledgedOnceItIsStored:
// the committer holds the steps after one that ended DTRs, publishing their
// grants but neither their final DTRs nor their notices nor their
// acknowledgements, until what ends the gathering comes; then one Finals
// event carries the DTRs of every step, one notice their changes in order,
// and every step's inputs are acknowledged once the event is stored.
func TestTheFinalDTRsOfConsecutiveStepsGoOutInOneEventAndTheirInputsAreAcknowledgedOnceItIsStored(t *testing.T) {
	for _, tt := range []struct {
		name   string
		window time.Duration
		// finals are the DTRs each held step ends (a step of none is
		// held behind the others all the same).
		finals []int
		// end, if set, is the step that ends the gathering, handed after
		// the held ones; else it ends by itself (the window, or closing).
		end   func(t *testing.T, s *Service, input jetstream.Msg) (*commit, []uuid.UUID)
		close bool // the committer stops
	}{
		{name: "the window passes with nothing more to do", window: 200 * time.Millisecond, finals: []int{1, 0, 2}},
		{name: "a hundred final DTRs are gathered", window: time.Hour, finals: []int{40, 0, 40},
			end: func(t *testing.T, s *Service, input jetstream.Msg) (*commit, []uuid.UUID) {
				return finalStep(t, s, 20, input)
			}},
		{name: "a caller waits for its step", window: time.Hour, finals: []int{1, 0, 1},
			end: func(t *testing.T, s *Service, input jetstream.Msg) (*commit, []uuid.UUID) {
				c := plainStep(t, input)
				c.done = func(err error) {
					if err != nil {
						t.Errorf("the caller heard %v", err)
					}
				}
				return c, nil
			}},
		{name: "a step stops workers or leaves no DTR unfinished", window: time.Hour, finals: []int{1, 1},
			end: func(t *testing.T, s *Service, input jetstream.Msg) (*commit, []uuid.UUID) {
				c := plainStep(t, input)
				c.now = true
				return c, nil
			}},
		{name: "the committer stops", window: time.Hour, finals: []int{2, 0, 1}, close: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := journaledService(t)
			nc, js := s.nc, s.js
			ctx := context.Background()
			s.gatherFor = tt.window
			steps := len(tt.finals)
			if tt.end != nil {
				steps++
			}
			inputs, cons := testInputs(t, js, steps)
			events, notices := finalsEvents(t, nc), stateChangesHeard(t, nc)
			commits, failed := make(chan *commit), make(chan error, 1)
			stopped := make(chan struct{})
			go func() { defer close(stopped); s.commitLoop(ctx, commits, failed) }()
			defer func() {
				if !tt.close {
					close(commits)
				}
				<-stopped
			}()

			var want []uuid.UUID
			var journaled []uuid.UUID // every DTR the held steps changed
			var changes []api.StateChange
			for i, n := range tt.finals {
				var c *commit
				if n == 0 {
					c = plainStep(t, inputs[i])
				} else {
					var ids []uuid.UUID
					c, ids = finalStep(t, s, n, inputs[i])
					want = append(want, ids...)
				}
				for _, r := range slices.Concat(c.records, c.finals) {
					journaled = append(journaled, r.id)
				}
				changes = append(changes, c.changes...)
				commits <- c
			}
			if tt.window == time.Hour {
				// Journaled, the steps are held: nothing announced,
				// nothing acknowledged.
				waitFor(t, "the held steps to be journaled", func() bool {
					for _, id := range journaled {
						if _, ok := s.journal.Lookup(id); !ok {
							return false
						}
					}
					return true
				})
				if n := finalsStored(t, js); n != 0 {
					t.Fatalf("%d Finals events stored while the steps are held", n)
				}
				if n := unacknowledged(t, nc, cons); n != steps {
					t.Fatalf("%d inputs unacknowledged while their steps are held, want all %d", n, steps)
				}
				select {
				case got := <-notices:
					t.Fatalf("a notice of %d changes sent while the steps are held", len(got))
				default:
				}
			}
			switch {
			case tt.end != nil:
				c, ids := tt.end(t, s, inputs[steps-1])
				want = append(want, ids...)
				changes = append(changes, c.changes...)
				commits <- c
			case tt.close:
				close(commits)
			}

			select {
			case got := <-events:
				if !slices.Equal(got, want) {
					t.Fatalf("the Finals event names %d DTRs %v, want the %d of every step in order %v", len(got), got, len(want), want)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("no Finals event")
			}
			waitFor(t, "every input to be acknowledged", func() bool { return unacknowledged(t, nc, cons) == 0 })
			select {
			case got := <-notices:
				if !slices.Equal(got, changes) {
					t.Fatalf("the notice holds %d changes %+v, want the %d of every step in order %+v", len(got), got, len(changes), changes)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("no state-change notice")
			}
			select {
			case got := <-notices:
				t.Fatalf("a second notice, of %d changes: the steps settled together send one", len(got))
			default:
			}
			if n := finalsStored(t, js); n != 1 {
				t.Fatalf("%d Finals events stored, want 1", n)
			}
			select {
			case err := <-failed:
				t.Fatalf("the committer failed: %v", err)
			default:
			}
		})
	}
}

// TestACheckpointKeepsTheJournalFromTheFirstFinalDTRNotYetAnnounced: a
// checkpoint puts every record in the bucket, but purges the journal only
// before the first message whose final DTRs are not yet announced, so
// that the next leader finds them there; once they are announced the next
// checkpoint purges the rest.
func TestACheckpointKeepsTheJournalFromTheFirstFinalDTRNotYetAnnounced(t *testing.T) {
	_, js, kv := journalServer(t)
	ctx := context.Background()
	j := newJournal(js, kv, quiet(), 1<<20, time.Hour, 1<<30)
	moving, ending, later := newDTR("moving"), newDTR("ending"), newDTR("later")
	for _, recs := range [][]record{
		{rec(t, moving, dtr.Transferring, time.Now())},
		{rec(t, ending, dtr.Done, time.Now())},
		{rec(t, later, dtr.Transfer, time.Now())},
	} {
		if err := j.Append(ctx, recs); err != nil {
			t.Fatal(err)
		}
	}
	j.Checkpoint(ctx)
	j.Wait()
	for _, d := range []dtr.DTR{moving, ending, later} {
		if _, err := kv.Get(ctx, d.ID.String()); err != nil {
			t.Fatalf("%s not in the bucket after the checkpoint: %v", d.Source, err)
		}
	}
	if n := journalMsgs(t, js); n != 2 {
		t.Fatalf("the journal holds %d messages, want 2: from the one whose final DTR is not announced", n)
	}
	if kept := j.KeptFinals(); len(kept) != 0 {
		t.Fatalf("%d final records kept after the checkpoint, want none (a new leader reads them from the journal)", len(kept))
	}
	j.Announced(j.ReadUpTo())
	if err := j.Append(ctx, []record{rec(t, later, dtr.Transferring, time.Now())}); err != nil {
		t.Fatal(err)
	}
	j.Checkpoint(ctx)
	j.Wait()
	if n := journalMsgs(t, js); n != 0 {
		t.Fatalf("the journal holds %d messages once its final DTRs are announced, want 0", n)
	}
}

// TestFinalDTRsHeldByALeaderThatFailsAreAnnouncedByTheNext: a leader
// journals a step that ended a DTR and fails while it holds the DTR to
// announce, after a checkpoint has put the record in the bucket. The next
// leader announces it from the journal; a leader frozen past its term that
// resumes announces nothing and acknowledges nothing.
func TestFinalDTRsHeldByALeaderThatFailsAreAnnouncedByTheNext(t *testing.T) {
	for _, tt := range []struct {
		name   string
		frozen bool // resumed after the next leader took over; else killed
	}{
		{name: "killed"},
		{name: "frozen past its term, then resumed", frozen: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nc, js, kv := journalServer(t)
			ctx := context.Background()
			first, err := New(Config{}, nc, quiet())
			if err != nil {
				t.Fatal(err)
			}
			first.journal = newJournal(js, kv, quiet(), 1<<20, time.Hour, 1<<30)
			first.gatherFor = time.Hour
			inputs, cons := testInputs(t, js, 1)
			events := finalsEvents(t, nc)
			c, ids := finalStep(t, first, 1, inputs[0])
			commits, failed := make(chan *commit), make(chan error, 1)
			stopped := make(chan struct{})
			if tt.frozen {
				// Its term runs out a moment after the step.
				first.election = &election{ttl: 4 * time.Second}
				first.election.renewed.Store(time.Now().Add(-3500 * time.Millisecond).UnixNano())
				go func() { defer close(stopped); first.commitLoop(ctx, commits, failed) }()
				commits <- c
			} else {
				// Killed once the step is stored: what the committer does
				// before it holds the step, and nothing after.
				if _, err := first.store(ctx, []*commit{c}); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, "the step to be journaled", func() bool { _, ok := first.journal.Lookup(ids[0]); return ok })
			first.journal.Checkpoint(ctx)
			first.journal.Wait()
			if _, err := kv.Get(ctx, ids[0].String()); err != nil {
				t.Fatalf("the final record is not in the bucket after the checkpoint: %v", err)
			}
			if n := journalMsgs(t, js); n != 1 {
				t.Fatalf("the checkpoint left %d journal messages, want the 1 with the final DTR not announced", n)
			}
			if n := finalsStored(t, js); n != 0 {
				t.Fatalf("%d Finals events stored by the failed leader", n)
			}

			nc2, err := nats.Connect(nc.ConnectedUrl())
			if err != nil {
				t.Fatal(err)
			}
			defer nc2.Close()
			next, err := New(Config{Name: "next"}, nc2, quiet())
			if err != nil {
				t.Fatal(err)
			}
			nctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- next.Run(nctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("next scheduler: %v", err)
				}
			}()
			select {
			case got := <-events:
				if !slices.Equal(got, ids) {
					t.Fatalf("the next leader announced %v, want %v", got, ids)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the next leader never announced the final DTR")
			}

			waitFor(t, "the next leader's Finals event to be stored", func() bool { return finalsStored(t, js) == 1 })
			if tt.frozen {
				close(commits)
				<-stopped
				if err := nc.Flush(); err != nil { // anything it published reaches the server
					t.Fatal(err)
				}
				if err := <-failed; !errors.Is(err, errDeposed) {
					t.Fatalf("the resumed leader's committer failed with %v, want its term found lapsed", err)
				}
				if n := finalsStored(t, js); n != 1 {
					t.Fatalf("%d Finals events stored, want only the next leader's", n)
				}
			}
			if n := unacknowledged(t, nc, cons); n != 1 {
				t.Fatalf("%d inputs unacknowledged, want the failed leader's 1 left to be delivered again", n)
			}
		})
	}
}

// TestTheFinalDTRsANewLeaderAnnouncesAgainStayInTheJournalUntilTheirEventIsStored:
// the last leader journaled a step that ended a DTR and died; the new
// leader, recovered from the journal, announces the DTR again. Its
// checkpoints, due at once, put the record in the bucket but purge the
// journal only before the message that holds it until the new leader's
// Finals event is stored, and then the rest: should the announcement fail,
// or the new leader die before it is stored, the leader after it finds the
// DTR in the journal (the bucket alone announces nothing) and announces it.
func TestTheFinalDTRsANewLeaderAnnouncesAgainStayInTheJournalUntilTheirEventIsStored(t *testing.T) {
	for _, tt := range []struct {
		name string
		// stored says the new leader's Finals event is stored; else
		// failed says the announcement fails (no stream takes it), or
		// the leader dies once the step is stored.
		stored, failed bool
	}{
		{name: "its Finals event is stored", stored: true},
		{name: "its announcement is never stored", failed: true},
		{name: "it dies before its Finals event is stored"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nc, js, kv := journalServer(t)
			ctx := context.Background()
			last := newJournal(js, kv, quiet(), 1<<20, time.Hour, 1<<30)
			ended := newDTR("ended")
			if err := last.Append(ctx, []record{rec(t, ended, dtr.Done, time.Now())}); err != nil {
				t.Fatal(err)
			}
			endedIn := last.ReadUpTo() // the journal message that holds it

			s, err := New(Config{}, nc, quiet())
			if err != nil {
				t.Fatal(err)
			}
			// Its checkpoints are due at once, and every millisecond.
			s.kv, s.journal = kv, newJournal(js, kv, quiet(), 1<<20, time.Millisecond, 1<<30)
			recoverAll(t, s)
			term, bucketLast, behind, err := beginTerm(ctx, js, s.journal.ReadUpTo(), "new")
			if err != nil || behind {
				t.Fatalf("the new leader's term: behind %v, %v", behind, err)
			}
			s.journal.Lead(term, bucketLast, make(chan error, 1))
			kept, err := s.keptFinals(ctx, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if kept == nil || len(kept.announce) != 1 || kept.announce[0].id != ended.ID {
				t.Fatalf("the new leader announces again %+v, want the DTR the last one ended", kept)
			}
			time.Sleep(5 * time.Millisecond) // a checkpoint is due

			switch {
			case tt.stored:
				commits, failed := make(chan *commit), make(chan error, 1)
				stopped := make(chan struct{})
				go func() { defer close(stopped); s.commitLoop(ctx, commits, failed) }()
				commits <- kept
				waitFor(t, "the Finals event to be stored", func() bool { return finalsStored(t, js) == 1 })
				waitFor(t, "a checkpoint to purge the journal up to the term's barrier", func() bool { return journalMsgs(t, js) == 0 })
				close(commits)
				<-stopped
				select {
				case err := <-failed:
					t.Fatalf("the committer failed: %v", err)
				default:
				}
			case tt.failed:
				if err := js.DeleteStream(ctx, bus.StreamEvents); err != nil {
					t.Fatal(err)
				}
				commits, failed := make(chan *commit), make(chan error, 1)
				stopped := make(chan struct{})
				go func() { defer close(stopped); s.commitLoop(ctx, commits, failed) }()
				commits <- kept
				select {
				case <-failed:
				case <-time.After(30 * time.Second):
					t.Fatal("the committer did not fail though no stream takes the Finals event")
				}
				close(commits)
				<-stopped
			default:
				// Killed once the step is stored, after a checkpoint
				// began: what the committer does before it announces.
				if _, err := s.store(ctx, []*commit{kept}); err != nil {
					t.Fatal(err)
				}
				s.journal.Checkpoint(ctx)
			}
			s.journal.Wait()
			if _, err := kv.Get(ctx, ended.ID.String()); err != nil {
				t.Fatalf("the final record is not in the bucket after the new leader's checkpoints: %v", err)
			}
			if tt.stored {
				return
			}
			st, err := js.Stream(ctx, bus.StreamJournal)
			if err != nil {
				t.Fatal(err)
			}
			info, err := st.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Msgs == 0 || info.State.FirstSeq > endedIn {
				t.Fatalf("the journal begins at %d (%d messages): the message %d with the final DTR not yet announced again was purged",
					info.State.FirstSeq, info.State.Msgs, endedIn)
			}

			// The leader after it announces the DTR.
			nc2, err := nats.Connect(nc.ConnectedUrl())
			if err != nil {
				t.Fatal(err)
			}
			defer nc2.Close()
			events := finalsEvents(t, nc)
			next, err := New(Config{Name: "next"}, nc2, quiet())
			if err != nil {
				t.Fatal(err)
			}
			nctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- next.Run(nctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("next scheduler: %v", err)
				}
			}()
			select {
			case got := <-events:
				if !slices.Equal(got, []uuid.UUID{ended.ID}) {
					t.Fatalf("the next leader announced %v, want %v", got, ended.ID)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the next leader never announced the final DTR")
			}
		})
	}
}

// journaledService is a scheduler of its own NATS server, with a journal
// and nothing else running.
func journaledService(t *testing.T) *Service {
	t.Helper()
	nc, js, kv := journalServer(t)
	s, err := New(Config{}, nc, quiet())
	if err != nil {
		t.Fatal(err)
	}
	s.js = js
	s.journal = newJournal(js, kv, quiet(), 1<<20, time.Hour, 1<<30)
	return s
}

// TestTheFinalDTRsOfAStepThatFailedAfterItsAppendStayInTheJournal: held
// steps that ended DTRs are announced when a later step fails to store
// after its records were journaled (its rejection finds no stream); they
// are marked announced up to their own journal messages, not the
// journal's end, so that a checkpoint keeps the failed step's message and
// the next leader announces its final DTR.
func TestTheFinalDTRsOfAStepThatFailedAfterItsAppendStayInTheJournal(t *testing.T) {
	s := journaledService(t)
	nc, js, kv := s.nc, s.js, s.journal.kv
	ctx := context.Background()
	s.gatherFor = time.Hour
	held, _ := finalStep(t, s, 1, nil)
	failing, failingIDs := finalStep(t, s, 1, nil)
	rejection := nats.NewMsg("nowhere.no.stream")
	rejection.Data = []byte("x")
	failing.rejections = []*nats.Msg{rejection}
	commits, failed := make(chan *commit), make(chan error, 1)
	stopped := make(chan struct{})
	go func() { defer close(stopped); s.commitLoop(ctx, commits, failed) }()
	commits <- held
	waitFor(t, "the held step to be journaled", func() bool { return journalMsgs(t, js) == 1 })
	commits <- failing
	select {
	case <-failed:
	case <-time.After(30 * time.Second):
		t.Fatal("the committer did not fail though the step's rejection finds no stream")
	}
	close(commits)
	<-stopped
	if n := finalsStored(t, js); n != 1 {
		t.Fatalf("%d Finals events stored, want the held step's 1", n)
	}
	s.journal.Checkpoint(ctx)
	s.journal.Wait()
	if n := journalMsgs(t, js); n != 1 {
		t.Fatalf("the journal holds %d messages after a checkpoint, want 1: the failed step's, whose final DTR is not announced", n)
	}
	if kept := s.journal.KeptFinals(); len(kept) != 0 {
		t.Fatalf("%d final records kept after the checkpoint, want none (a new leader reads them from the journal)", len(kept))
	}
	// A new leader finds the failed step's final DTR in the journal.
	next, err := New(Config{}, nc, quiet())
	if err != nil {
		t.Fatal(err)
	}
	next.kv, next.journal = kv, newJournal(js, kv, quiet(), 1<<20, time.Hour, 1<<30)
	recoverAll(t, next)
	kept, err := next.keptFinals(ctx, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if kept == nil || len(kept.announce) != 1 || kept.announce[0].id != failingIDs[0] {
		t.Fatalf("a new leader announces again %+v, want the failed step's DTR", kept)
	}
}
