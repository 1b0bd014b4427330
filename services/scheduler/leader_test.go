package scheduler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func leaderBucket(t *testing.T, js jetstream.JetStream, ttl time.Duration) jetstream.KeyValue {
	t.Helper()
	ctx := context.Background()
	if err := bus.Ensure(ctx, js, bus.Setup{LeaderTTL: ttl}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, bus.BucketLeader)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func TestOneSchedulerWinsTheElectionAndAnotherOnlyOnceItsKeyIsGone(t *testing.T) {
	_, js, _ := journalServer(t)
	kv := leaderBucket(t, js, time.Second)
	ctx := context.Background()
	a, b := newElection(kv, time.Second, "a"), newElection(kv, time.Second, "b")
	if won, err := a.campaign(ctx); !won || err != nil {
		t.Fatalf("the first campaign: won %v, %v", won, err)
	}
	if won, err := b.campaign(ctx); won || err != nil {
		t.Fatalf("a second scheduler's campaign while the key is held: won %v, %v", won, err)
	}
	if err := a.renew(ctx); err != nil {
		t.Fatalf("the leader's renewal: %v", err)
	}
	l, ok, err := b.current(ctx)
	if err != nil || !ok || l.Name != "a" {
		t.Fatalf("who leads: %+v %v %v, want a", l, ok, err)
	}
	// Not renewed, the key expires with the bucket's TTL and the other
	// wins; the old leader's renewal is then refused as deposed.
	deadline := time.Now().Add(10 * time.Second)
	for {
		won, err := b.campaign(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if won {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the key of a leader that stopped renewing did not expire within 10 s of its 1 s TTL")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := a.renew(ctx); !errors.Is(err, errDeposed) {
		t.Fatalf("the deposed leader's renewal: %v, want errDeposed", err)
	}
	// A leader that resigns lets the next one in at once.
	b.resign(ctx)
	if won, err := a.campaign(ctx); !won || err != nil {
		t.Fatalf("a campaign after the leader resigned: won %v, %v", won, err)
	}
}

func TestALeaderThatCannotRenewStepsDownBeforeItsKeyCouldExpire(t *testing.T) {
	nc, js, _ := journalServer(t)
	leaderBucket(t, js, time.Second)
	// The leader's own connection, which is then cut.
	own, err := nats.Connect(nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	ojs, _ := jetstream.New(own)
	kv, err := ojs.KeyValue(context.Background(), bus.BucketLeader)
	if err != nil {
		t.Fatal(err)
	}
	e := newElection(kv, time.Second, "a")
	if won, err := e.campaign(context.Background()); !won || err != nil {
		t.Fatalf("campaign: won %v, %v", won, err)
	}
	own.Close()
	deposed := make(chan error, 1)
	var logs bytes.Buffer
	e.keepLeading(context.Background(), deposed, slog.New(slog.NewTextHandler(&logs, nil)))
	select {
	case err := <-deposed:
		if !errors.Is(err, errDeposed) {
			t.Fatalf("deposed with %v", err)
		}
		if !strings.Contains(logs.String(), "renewing the leader key: slow or failed") {
			t.Fatalf("the failed renewals before it were not logged:\n%s", logs.String())
		}
		if held := time.Since(time.Unix(0, e.renewed.Load())); held >= time.Second {
			t.Fatalf("stepped down %s after its last renewal, not before the 1 s TTL", held)
		}
	default:
		t.Fatal("keepLeading returned without stepping down")
	}
}

func TestADeposedLeadersJournalAndCheckpointWritesAreRefused(t *testing.T) {
	_, js, kv := journalServer(t)
	ctx := context.Background()
	old := newJournal(js, kv, quiet(), 1<<20, time.Hour, 1000)
	term, bucketLast, behind, err := beginTerm(ctx, js, 0, "old")
	if err != nil || behind {
		t.Fatalf("the first term: behind %v, %v", behind, err)
	}
	oldDeposed := make(chan error, 1)
	old.Lead(term, bucketLast, oldDeposed)
	d := newDTR("x")
	if err := old.Append(ctx, []record{rec(t, d, dtr.Transfer, time.Now())}); err != nil {
		t.Fatalf("the leader's append: %v", err)
	}
	// More records journaled and not yet checkpointed: a checkpoint of
	// several records, whose later ones must not slip in after a barrier.
	var more []dtr.DTR
	for i := range 5 {
		m := newDTR(fmt.Sprint("more", i))
		more = append(more, m)
		if err := old.Append(ctx, []record{rec(t, m, dtr.Transfer, time.Now())}); err != nil {
			t.Fatal(err)
		}
	}
	// A barrier that has not read the journal's last message is refused.
	if _, _, behind, err := beginTerm(ctx, js, term, "new"); err != nil || !behind {
		t.Fatalf("a barrier behind the journal: behind %v, %v", behind, err)
	}
	// Another scheduler begins a term after reading everything.
	newTerm, _, behind, err := beginTerm(ctx, js, old.ReadUpTo(), "new")
	if err != nil || behind || newTerm <= term {
		t.Fatalf("the second term %d after %d: behind %v, %v", newTerm, term, behind, err)
	}
	// The old leader's writes are refused from now on.
	err = old.Append(ctx, []record{rec(t, d, dtr.Transferring, time.Now())})
	if !errors.Is(err, errDeposed) {
		t.Fatalf("the deposed leader's append: %v, want errDeposed", err)
	}
	old.Checkpoint(ctx)
	old.Wait()
	select {
	case err := <-oldDeposed:
		if !errors.Is(err, errDeposed) {
			t.Fatalf("the deposed leader's checkpoint: %v", err)
		}
	default:
		t.Fatal("the deposed leader's checkpoint was not refused")
	}
	for _, x := range append(more, d) {
		if _, err := kv.Get(ctx, x.ID.String()); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("the deposed leader's checkpoint stored the record of %s: %v", x.Source, err)
		}
	}
	if n := journalMsgs(t, js); n != 8 {
		t.Fatalf("the journal holds %d messages, want 8 (a barrier, six records, a barrier)", n)
	}
}

func TestTheLeadersOwnWritesFollowOneAnother(t *testing.T) {
	_, js, kv := journalServer(t)
	ctx := context.Background()
	j := newJournal(js, kv, quiet(), 300, time.Hour, 1000) // small messages: an append is several
	term, bucketLast, _, err := beginTerm(ctx, js, 0, "only")
	if err != nil {
		t.Fatal(err)
	}
	j.Lead(term, bucketLast, make(chan error, 1))
	var recs []record
	for i := range 20 {
		recs = append(recs, rec(t, newDTR(string(rune('a'+i))), dtr.Transfer, time.Now()))
	}
	for range 3 {
		if err := j.Append(ctx, recs); err != nil {
			t.Fatal(err)
		}
		j.Checkpoint(ctx)
		j.Wait()
	}
	for _, r := range recs {
		if _, err := kv.Get(ctx, r.id.String()); err != nil {
			t.Fatalf("record %s not checkpointed: %v", r.id, err)
		}
	}
	if n := journalMsgs(t, js); n != 0 {
		t.Fatalf("journal holds %d messages after the checkpoints, want 0", n)
	}
}

func TestABarrierStoredWhoseAnswerWasLostBeginsItsWritersTerm(t *testing.T) {
	for _, tc := range []struct {
		name, storedBy string
		after          int // journal messages written after the stored barrier
		wantBehind     bool
	}{
		{name: "its own barrier, last", storedBy: "me", wantBehind: false},
		{name: "another's barrier", storedBy: "other", wantBehind: true},
		{name: "its own barrier, written after", storedBy: "me", after: 1, wantBehind: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, js, kv := journalServer(t)
			ctx := context.Background()
			// The journal holds a record; the barrier conditional on it was
			// stored, but its publisher heard nothing of it (nats.go sends
			// such a publish again, and the copy is refused as out of
			// sequence).
			if _, err := js.PublishMsg(ctx, conditional(nats.NewMsg(bus.SubjectJournal), 0)); err != nil {
				t.Fatal(err)
			}
			stored := conditional(nats.NewMsg(bus.SubjectJournal), 1)
			stored.Header.Set(headerTermOf, tc.storedBy)
			if _, err := js.PublishMsg(ctx, stored); err != nil {
				t.Fatal(err)
			}
			for i := range tc.after {
				if _, err := js.PublishMsg(ctx, conditional(nats.NewMsg(bus.SubjectJournal), uint64(2+i))); err != nil {
					t.Fatal(err)
				}
			}
			term, bucketLast, behind, err := beginTerm(ctx, js, 1, "me")
			if err != nil || behind != tc.wantBehind {
				t.Fatalf("beginTerm: behind %v, %v; want behind %v", behind, err, tc.wantBehind)
			}
			if tc.wantBehind {
				if n := journalMsgs(t, js); n != uint64(2+tc.after) {
					t.Fatalf("the journal holds %d messages, want %d: a barrier behind it was written", n, 2+tc.after)
				}
				return
			}
			if term != 2 {
				t.Fatalf("term %d, want 2 (the stored barrier's sequence)", term)
			}
			if n := journalMsgs(t, js); n != 2 {
				t.Fatalf("the journal holds %d messages, want 2: a second barrier was written", n)
			}
			// The term is fenced as any: its checkpoint barrier is in, and
			// a write behind the barrier is refused.
			e, err := kv.Get(ctx, termKey)
			if err != nil || string(e.Value()) != "2" || bucketLast == "" {
				t.Fatalf("checkpoint barrier: %v %q %q", err, bucketLast, e.Value())
			}
			if _, err := js.PublishMsg(ctx, conditional(nats.NewMsg(bus.SubjectJournal), 1)); !isWrongLast(err) {
				t.Fatalf("a deposed leader's append after the barrier: %v, want refused", err)
			}
		})
	}
}

func TestATermBeginsOnACheckpointBucketOverItsLimitOnceATermWasBegunOnIt(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ledOnce  bool
		wantFull bool
	}{
		{name: "a term begun on it before", ledOnce: true},
		{name: "filled before any term", wantFull: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, js, kv := journalServer(t)
			ctx := context.Background()
			readUpTo := uint64(0)
			if tc.ledOnce {
				term, _, _, err := beginTerm(ctx, js, 0, "before")
				if err != nil {
					t.Fatal(err)
				}
				readUpTo = term
			}
			for i := range 50 {
				if _, err := kv.Put(ctx, uuid.NewString(), []byte(strings.Repeat("x", 1000+i))); err != nil {
					t.Fatal(err)
				}
			}
			// The limit is set below what the bucket holds (an operator's
			// lower SLUICE_DTRS_MAX_BYTES, or a bucket filled without one).
			st, err := js.Stream(ctx, "KV_"+bus.BucketDTRs)
			if err != nil {
				t.Fatal(err)
			}
			cfg := st.CachedInfo().Config
			cfg.MaxBytes = int64(st.CachedInfo().State.Bytes / 2)
			if _, err := js.UpdateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			if _, err := kv.Put(ctx, uuid.NewString(), []byte("x")); !bus.StoreFull(err) {
				t.Fatalf("a new record in the bucket over its limit: %v, want refused for want of space", err)
			}
			term, _, behind, err := beginTerm(ctx, js, readUpTo, "after")
			if tc.wantFull {
				if !bus.StoreFull(err) {
					t.Fatalf("the first barrier in a bucket over its limit: %v, want refused for want of space", err)
				}
				return
			}
			if err != nil || behind || term != readUpTo+1 {
				t.Fatalf("the barrier in a bucket over its limit: term %d behind %v, %v", term, behind, err)
			}
			if e, err := kv.Get(ctx, termKey); err != nil || string(e.Value()) != fmt.Sprint(term) {
				t.Fatalf("the bucket's term record: %v", err)
			}
			// And the next, whose barrier names a later sequence.
			if next, _, behind, err := beginTerm(ctx, js, term, "next"); err != nil || behind || next != term+1 {
				t.Fatalf("the next barrier in a bucket over its limit: term %d behind %v, %v", next, behind, err)
			}
		})
	}
}
