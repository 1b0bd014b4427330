package scheduler

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

func TestTheRestartIndexReadsBackAsWrittenAndNothingElseIsTakenForOne(t *testing.T) {
	ix := core.Index{
		Keep:   []uuid.UUID{uuid.New(), uuid.New()},
		KeepAt: []uint64{12, 0},
		Queues: []core.QueueIndex{
			{State: dtr.QueryReplica, Share: "atlas-download", Heads: []uuid.UUID{uuid.New()}, HeadsAt: []uint64{1 << 40}, Prio: 40, Stamp: time.Now().UnixNano(), Behind: 12345},
			{State: dtr.Transfer, Share: "cms:prod-upload", Prio: 101, Stamp: -7, Behind: 1},
		},
	}
	b := encodeIndex(77, ix)
	asOf, got, err := decodeIndex(b)
	if err != nil || asOf != 77 || !reflect.DeepEqual(got, ix) {
		t.Fatalf("read back as of %d: %+v, %v; want as of 77: %+v", asOf, got, err, ix)
	}
	for _, tt := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"another version", append([]byte("sluice-index-9"), b[len(indexVersion):]...)},
		{"cut short", b[:len(b)-5]},
		{"cut in a count", b[:len(indexVersion)+1]},
		{"bytes left over", append(slices.Clone(b), 0)},
		{"a state that is none", encodeIndexWithState(t, "NOTSTATE")},
	} {
		if _, _, err := decodeIndex(tt.b); !errors.Is(err, errBadIndex) {
			t.Errorf("%s: %v, want errBadIndex", tt.name, err)
		}
	}
}

// encodeIndexWithState is an index whose one queue is in the named state.
func encodeIndexWithState(t *testing.T, state string) []byte {
	t.Helper()
	good := encodeIndex(1, core.Index{Queues: []core.QueueIndex{{State: dtr.Transfer, Share: "s"}}})
	name := dtr.Transfer.String()
	i := bytes.Index(good, []byte(name))
	if i < 0 || len(state) != len(name) {
		t.Fatalf("cannot put state %q in place of %q", state, name)
	}
	return slices.Concat(good[:i], []byte(state), good[i+len(name):])
}

// A checkpoint stores the index it is handed after its records and purges
// the journal only up to what the index shows; with none handed it purges
// no further than the last index it stored, and an empty one removes the
// bucket's index and lets the journal go.
func TestACheckpointStoresTheIndexAndPurgesTheJournalNoFurtherThanItShows(t *testing.T) {
	_, js, kv := journalServer(t)
	ctx := context.Background()
	j := newJournal(js, kv, quiet(), 1<<20, time.Hour, 1000)
	j.indexed = true
	now := time.Now()
	appendOne := func(name string) {
		t.Helper()
		if err := j.Append(ctx, []record{rec(t, newDTR(name), dtr.QueryReplica, now)}); err != nil {
			t.Fatal(err)
		}
	}
	checkpoint := func(wantJournal uint64) {
		t.Helper()
		j.Checkpoint(ctx)
		j.Wait()
		if n := journalMsgs(t, js); n != wantJournal {
			t.Fatalf("the journal holds %d messages after the checkpoint, want %d", n, wantJournal)
		}
	}
	appendOne("a")
	checkpoint(1) // no index stored yet: nothing purged
	appendOne("b")
	appendOne("c")
	ix := core.Index{Keep: []uuid.UUID{uuid.New()}}
	j.SetIndex(encodeIndex(2, ix), 2)
	checkpoint(1) // the index shows messages 1 and 2
	e, err := kv.Get(ctx, indexKey)
	if err != nil {
		t.Fatal(err)
	}
	if asOf, got, err := decodeIndex(e.Value()); err != nil || asOf != 2 || !reflect.DeepEqual(got.Keep, ix.Keep) {
		t.Fatalf("the bucket's index: as of %d, %+v, %v", asOf, got, err)
	}
	appendOne("d")
	checkpoint(2) // none handed: the bucket's is as of 2
	appendOne("e")
	j.SetIndex([]byte{}, 5)
	checkpoint(0)
	if _, err := kv.Get(ctx, indexKey); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("an empty index handed: the bucket's is still there (%v)", err)
	}
}

// A checkpoint of a leader that stores indexes says where it stored each
// record (for the core, whose index names it), and nothing of the index's
// own message; without indexes it keeps nothing.
func TestACheckpointSaysWhereItStoredEachRecord(t *testing.T) {
	for _, indexed := range []bool{true, false} {
		_, js, kv := journalServer(t)
		ctx := context.Background()
		j := newJournal(js, kv, quiet(), 1<<20, time.Hour, 1000)
		j.indexed = indexed
		var recs []record
		for _, name := range []string{"a", "b", "c"} {
			recs = append(recs, rec(t, newDTR(name), dtr.QueryReplica, time.Now()))
		}
		if err := j.Append(ctx, recs); err != nil {
			t.Fatal(err)
		}
		j.SetIndex(encodeIndex(1, core.Index{}), 1)
		j.Checkpoint(ctx)
		j.Wait()
		got := j.TakeRecorded()
		if !indexed {
			if len(got) != 0 {
				t.Fatalf("without indexes, %d places kept", len(got))
			}
			continue
		}
		if len(got) != len(recs) {
			t.Fatalf("%d places told for %d records: %+v", len(got), len(recs), got)
		}
		for _, r := range got {
			e, err := kv.Get(ctx, r.id.String())
			if err != nil || e.Revision() != r.seq {
				t.Fatalf("DTR %s told stored at %d; the bucket has it at %v (%v)", r.id, r.seq, e, err)
			}
		}
		if again := j.TakeRecorded(); len(again) != 0 {
			t.Fatalf("told again: %+v", again)
		}
	}
}

// storedState puts in the bucket, and journals after it, what a leader
// over n queued DTRs (three of them running) leaves behind, with an index
// of k heads per queue as of the bucket (if k > 0) or index as the index's
// stored form (if set). It returns the queued DTRs, a DTR that moved on in
// the journal and one that finished there.
func storedState(t *testing.T, js jetstream.JetStream, kv jetstream.KeyValue, n, k int, index []byte, stale bool) (queued []dtr.DTR, moved, finished dtr.DTR) {
	t.Helper()
	ctx := context.Background()
	now := time.Now().Add(-time.Hour)
	old := core.New(core.DefaultConfig())
	put := func(d dtr.DTR, st dtr.State, entered time.Time) {
		d.State, d.StateEntered, d.Updated = st, entered, entered
		r := rec(t, d, st, entered)
		if _, err := kv.Put(ctx, d.ID.String(), r.data); err != nil {
			t.Fatal(err)
		}
		if err := old.Restore(now, &d); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		d := newDTR(fmt.Sprint("q", i))
		d.Priority = []int{20, 50, 80}[i%3]
		put(d, dtr.QueryReplica, now.Add(time.Duration(i)*time.Millisecond))
		queued = append(queued, d)
	}
	for i := range 3 {
		d := newDTR(fmt.Sprint("r", i))
		d.Grant = d.ID.String() + ".1"
		put(d, dtr.QueryingReplica, now)
	}
	moved, finished = queued[0], queued[1]
	if k > 0 {
		index = encodeIndex(0, old.Index(k))
	}
	if index != nil {
		if _, err := kv.Put(ctx, indexKey, index); err != nil {
			t.Fatal(err)
		}
	}
	j := newJournal(js, kv, quiet(), 1<<20, time.Hour, 1000)
	if stale {
		// A message after the index's point, purged: the index misses it.
		if err := j.Append(ctx, []record{rec(t, newDTR("gone"), dtr.Done, now)}); err != nil {
			t.Fatal(err)
		}
		st, err := js.Stream(ctx, bus.StreamJournal)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Purge(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Append(ctx, []record{rec(t, moved, dtr.Transferring, now.Add(time.Minute)), rec(t, finished, dtr.Done, now.Add(time.Minute))}); err != nil {
		t.Fatal(err)
	}
	return queued, moved, finished
}

func TestARestartWithAnIndexRestoresItsDTRsFirstAndReadsTheRestMeanwhile(t *testing.T) {
	const n, k = 600, 5
	for _, tt := range []struct {
		name   string
		k      int
		index  []byte
		stale  bool
		inPart bool
	}{
		{"an index", k, nil, false, true},
		{"an index the journal was purged past", k, nil, true, false},
		{"an unreadable index", 0, []byte("not an index"), false, false},
		{"no index", 0, nil, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nc, js, kv := journalServer(t)
			queued, moved, finished := storedState(t, js, kv, n, tt.k, tt.index, tt.stale)
			s, err := New(Config{RestoreHeads: k}, nc, quiet())
			if err != nil {
				t.Fatal(err)
			}
			s.kv, s.journal = kv, newJournal(js, kv, quiet(), 1<<20, time.Hour, 1000)
			recoverAll(t, s)
			if got := s.core.Loading(); got != tt.inPart {
				t.Fatalf("loading in parts: %v, want %v", got, tt.inPart)
			}
			if tt.inPart {
				// The heads of the three priorities' queue, the running
				// ones, and what the journal changed.
				if got := s.core.Len(); got > k+3+1 {
					t.Fatalf("%d DTRs restored before the rest is read, want at most %d", got, k+3+1)
				}
				s.core.Tick(time.Now())
				for _, g := range s.core.Take().Grants {
					if g.DTR.Priority != 80 {
						t.Fatalf("granted a DTR of priority %d while DTRs of 80 are not yet read", g.DTR.Priority)
					}
				}
				// A change asked meanwhile is refused, and not made.
				ran := false
				q := &loopRequest{f: func() { ran = true }, change: true, done: make(chan struct{})}
				if stop, err := s.answer(context.Background(), kv, nil, q); stop || err != nil {
					t.Fatalf("a change while loading stopped the loop: %v", err)
				}
				<-q.done
				if ran || !errors.Is(q.err, errLoading) {
					t.Fatalf("a change while loading: ran %v, answered %v; want it refused with errLoading", ran, q.err)
				}
				s.readRest(context.Background())
				for s.loads != nil {
					select {
					case c, ok := <-s.loads:
						if err := s.takeLoaded(c, ok); err != nil {
							t.Fatal(err)
						}
					case <-time.After(10 * time.Second):
						t.Fatal("the rest was not read")
					}
				}
			}
			select {
			case <-s.loaded:
			default:
				t.Fatal("submissions still wait once every stored DTR is read")
			}
			if s.core.Loading() {
				t.Fatal("the core still loads once every stored DTR is read")
			}
			if got, want := s.core.Len(), n+3-1; got != want {
				t.Fatalf("%d DTRs held, want %d", got, want)
			}
			if d, _ := s.core.Get(moved.ID); d.State != dtr.Transferring {
				t.Fatalf("a DTR the journal moved on is in %s, want the journal's TRANSFERRING", d.State)
			}
			if _, ok := s.core.Get(finished.ID); ok {
				t.Fatal("a DTR that finished in the journal is back from its older stored record")
			}
			for _, d := range queued[2:] {
				if !s.stored.MayHave(d.ID) {
					t.Fatalf("%s is stored but not known to be", d.ID)
				}
			}
		})
	}
}

// indexingService is a scheduler, not running, whose journal stores an
// index of up to 4 heads a queue at its checkpoints, over a real bucket.
func indexingService(t *testing.T) (*Service, jetstream.KeyValue) {
	t.Helper()
	nc, js, kv := journalServer(t)
	s, err := New(Config{RestoreHeads: 4}, nc, quiet())
	if err != nil {
		t.Fatal(err)
	}
	s.kv, s.journal = kv, newJournal(js, kv, quiet(), 1<<20, time.Hour, 1000)
	s.journal.indexed = true
	return s, kv
}

// The committer gives a step's index its journal sequence once the step is
// journaled: the index is as of where the journal ended before the step,
// so a restart replays what the step changed. A step whose append is
// refused (a deposed leader) hands no index.
func TestAStepsIndexIsHandedToTheJournalOnlyOnceTheStepIsJournaled(t *testing.T) {
	s, _ := indexingService(t)
	ctx := context.Background()
	now := time.Now()
	kept := uuid.New()
	step := func() *commit {
		return &commit{records: []record{rec(t, newDTR("a"), dtr.QueryReplica, now)}, index: indexBody(core.Index{Keep: []uuid.UUID{kept}})}
	}
	if _, err := s.store(ctx, []*commit{step()}); err != nil {
		t.Fatal(err)
	}
	asOf, ix, err := decodeIndex(s.journal.index)
	if err != nil || asOf != 0 || s.journal.indexAsOf != 0 || len(ix.Keep) != 1 || ix.Keep[0] != kept {
		t.Fatalf("the journal holds an index as of %d (%d), %+v, %v; want as of 0, before the step", asOf, s.journal.indexAsOf, ix, err)
	}
	s.journal.SetIndex(nil, 0)
	s.journal.Lead(99, "", make(chan error, 2)) // the journal ends elsewhere: appends are refused
	if _, err := s.store(ctx, []*commit{step()}); !errors.Is(err, errDeposed) {
		t.Fatalf("an append after the journal moved on: %v, want errDeposed", err)
	}
	if s.journal.index != nil {
		t.Fatal("a step whose append was refused handed the journal its index")
	}
}

// A restart fetches the DTRs its index names up to a thousand and more a
// request, each with its newest record and where it is stored, and
// nothing for one deleted,
// purged or never stored; where the server answers no batched get (a
// bucket without direct gets, a server before NATS 2.11), one key at a
// time, with the same answers.
func TestTheIndexedDTRsAreFetchedInBatchesWithTheirNewestRecords(t *testing.T) {
	for _, tt := range []struct {
		name        string
		direct      bool
		maxRequests uint64
	}{
		{"batched", true, 3},
		{"one at a time where the server answers no batch", false, 3 + 2500},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nc, js, kv := journalServer(t)
			ctx := context.Background()
			const n = 2500 // three requests; the last names only DTRs never stored
			ids := make([]uuid.UUID, n)
			want, wantSeq := make([][]byte, n), make([]uint64, n)
			for i := range ids {
				ids[i] = uuid.New()
				key := ids[i].String()
				if i >= 2048 || i%5 == 0 {
					continue // never stored
				}
				put := func(v string) {
					seq, err := kv.Put(ctx, key, []byte(v))
					if err != nil {
						t.Fatal(err)
					}
					wantSeq[i] = seq
				}
				put("first " + key)
				switch i % 5 {
				case 1:
					if err := kv.Delete(ctx, key); err != nil {
						t.Fatal(err)
					}
					wantSeq[i] = 0
				case 2:
					if err := kv.Purge(ctx, key); err != nil {
						t.Fatal(err)
					}
					wantSeq[i] = 0
				case 3:
					put("newest " + key)
					want[i] = []byte("newest " + key)
				default:
					want[i] = []byte("first " + key)
				}
			}
			if !tt.direct {
				kv = withoutDirectGets(t, js)
			}
			s, err := New(Config{}, nc, quiet())
			if err != nil {
				t.Fatal(err)
			}
			s.kv = kv
			before := nc.Stats().OutMsgs
			got, seqs, err := s.fetchRecords(ctx, ids)
			requests := nc.Stats().OutMsgs - before
			if err != nil {
				t.Fatal(err)
			}
			for i := range ids {
				if !bytes.Equal(got[i], want[i]) || seqs[i] != wantSeq[i] {
					t.Fatalf("DTR %d (kind %d): got %q at %d, want %q at %d", i, i%5, got[i], seqs[i], want[i], wantSeq[i])
				}
			}
			if requests > tt.maxRequests {
				t.Fatalf("%d requests for %d DTRs, want at most %d", requests, n, tt.maxRequests)
			}
		})
	}
}

// A batched get that ends early is not taken for a complete answer: a
// server that answers some keys and then 404 Message Not Found (a record
// it found failed to load), or one that never answers (a publish refused
// by its permissions gets no reply), leaves the other keys to be asked
// one at a time; and once a request got no answer at all, the requests
// after it are not sent.
func TestABatchedGetThatEndsEarlyLeavesItsOtherKeysToBeAskedAlone(t *testing.T) {
	defer func(w time.Duration) { fetchBatchWait = w }(fetchBatchWait)
	fetchBatchWait = 200 * time.Millisecond
	for _, tt := range []struct {
		name        string
		answers     bool // the first key, then a 404
		n           int
		maxRequests int
	}{
		{"part of an answer, then 404 Message Not Found", true, 3, 1},
		{"no answer", false, 3 * fetchBatch, 2}, // the two asked at once
	} {
		t.Run(tt.name, func(t *testing.T) {
			nc, js, kv := journalServer(t)
			ctx := context.Background()
			ids := make([]uuid.UUID, tt.n)
			for i := range ids {
				ids[i] = uuid.New()
				if _, err := kv.Put(ctx, ids[i].String(), []byte("rec "+ids[i].String())); err != nil {
					t.Fatal(err)
				}
			}
			kv = withoutDirectGets(t, js) // this test answers them
			var requests atomic.Int32
			sub, err := nc.Subscribe("$JS.API.DIRECT.GET.KV_"+bus.BucketDTRs, func(m *nats.Msg) {
				requests.Add(1)
				if !tt.answers {
					return
				}
				var req struct {
					MultiLast []string `json:"multi_last"`
				}
				_ = json.Unmarshal(m.Data, &req)
				e, err := kv.Get(ctx, strings.TrimPrefix(req.MultiLast[0], "$KV."+bus.BucketDTRs+"."))
				if err != nil {
					t.Error(err)
					return
				}
				r := nats.NewMsg(m.Reply)
				r.Header.Set(jetstream.SubjectHeader, req.MultiLast[0])
				r.Header.Set(jetstream.SequenceHeader, strconv.FormatUint(e.Revision(), 10))
				r.Data = e.Value()
				nf := nats.NewMsg(m.Reply)
				nf.Header.Set("Status", "404")
				nf.Header.Set("Description", "Message Not Found")
				for _, r := range []*nats.Msg{r, nf} {
					if err := nc.PublishMsg(r); err != nil {
						t.Error(err)
					}
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			s, err := New(Config{}, nc, quiet())
			if err != nil {
				t.Fatal(err)
			}
			s.kv = kv
			recs, _, err := s.fetchRecords(ctx, ids)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range recs {
				if want := "rec " + ids[i].String(); string(r) != want {
					t.Fatalf("DTR %d: fetched %q, want %q", i, r, want)
				}
			}
			if got := int(requests.Load()); got > tt.maxRequests {
				t.Fatalf("%d batched requests, want at most %d", got, tt.maxRequests)
			}
		})
	}
}

// withoutDirectGets turns the checkpoint bucket's direct gets off (as on a
// bucket made without them) and returns the bucket, read by message gets.
func withoutDirectGets(t *testing.T, js jetstream.JetStream) jetstream.KeyValue {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, "KV_"+bus.BucketDTRs)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.AllowDirect = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, bus.BucketDTRs)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func TestTheIndexPicksItsDTRsThatLieFarFromTheBucketsEndFurthestFirst(t *testing.T) {
	id := func(i byte) uuid.UUID { return uuid.UUID{i} }
	ids := func(n int, first byte) []uuid.UUID {
		var out []uuid.UUID
		for i := range n {
			out = append(out, id(first+byte(i)))
		}
		return out
	}
	many := make([]uint64, 3*nearPerTurn) // all far, at 1..
	manyIDs := make([]uuid.UUID, len(many))
	for i := range many {
		many[i] = uint64(len(many) - i)
		binary.BigEndian.PutUint32(manyIDs[i][:], uint32(i+1))
	}
	end := 10 * nearWindow
	edge := end - nearWindow
	for _, tt := range []struct {
		name string
		ix   core.Index
		end  uint64
		want []uuid.UUID
		// window, if set, is nearWindow
		window uint64
	}{
		{"a bucket shorter than the window", core.Index{Keep: ids(2, 1), KeepAt: []uint64{1, 2}}, nearWindow, nil, 0},
		{"heads and kept DTRs beyond the window, furthest first; those inside it and those not yet placed are left",
			core.Index{Keep: ids(3, 1), KeepAt: []uint64{edge, edge + 1, 0},
				Queues: []core.QueueIndex{{Heads: ids(3, 10), HeadsAt: []uint64{5, end - 1, 7}}}},
			end, []uuid.UUID{id(10), id(12), id(1)}, 0},
		{"a DTR named twice is picked once", core.Index{Keep: ids(1, 1), KeepAt: []uint64{9},
			Queues: []core.QueueIndex{{Heads: ids(1, 1), HeadsAt: []uint64{9}}}}, end, []uuid.UUID{id(1)}, 0},
		{"an index of a pre-sequence form (no places)", core.Index{Keep: ids(2, 1)}, end, nil, 0},
		{"the window is eight times the DTRs named if that is more",
			core.Index{Queues: []core.QueueIndex{{Heads: manyIDs, HeadsAt: many}}}, 8*uint64(len(many)) + 2,
			[]uuid.UUID{manyIDs[len(many)-1], manyIDs[len(many)-2]}, 100},
		{"many, furthest first", core.Index{Queues: []core.QueueIndex{{Heads: manyIDs, HeadsAt: many}}}, end,
			slices.Collect(func(yield func(uuid.UUID) bool) {
				for i := len(many) - 1; i >= 0; i-- {
					if !yield(manyIDs[i]) {
						return
					}
				}
			}), 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.window > 0 {
				defer func(w uint64) { nearWindow = w }(nearWindow)
				nearWindow = tt.window
			}
			if got := farFromEnd(tt.ix, tt.end); !slices.Equal(got, tt.want) {
				t.Fatalf("picked %d: %v…, want %d: %v…", len(got), got[:min(len(got), 3)], len(tt.want), tt.want[:min(len(tt.want), 3)])
			}
		})
	}
}

// The leader stores again, as they are, the records of the DTRs its index
// names that lie far back in the bucket, with the step the index follows:
// the next index finds them near the end, and a restart reads them as
// they were.
func TestTheIndexsDTRsAreStoredAgainNearTheBucketsEnd(t *testing.T) {
	s, kv := indexingService(t)
	ctx := context.Background()
	now := time.Now()
	var stored []record
	for i := range 10 {
		stored = append(stored, rec(t, newDTR(fmt.Sprint("q", i)), dtr.QueryReplica, now.Add(time.Duration(i)*time.Millisecond)))
	}
	for _, r := range stored {
		e, err := kv.Put(ctx, r.id.String(), r.data)
		if err != nil {
			t.Fatal(err)
		}
		var d dtr.DTR
		if err := json.Unmarshal(r.data, &d); err != nil {
			t.Fatal(err)
		}
		if err := s.core.Restore(now, &d); err != nil {
			t.Fatal(err)
		}
		s.core.Recorded(d.ID, e)
	}
	// The bucket has moved on far past them since.
	nearWindow = 16
	defer func() { nearWindow = 256 << 10 }()
	for i := range 40 {
		e, err := kv.Put(ctx, fmt.Sprint("filler", i), []byte("{}"))
		if err != nil {
			t.Fatal(err)
		}
		s.core.Recorded(uuid.New(), e)
	}

	c := &commit{}
	var ix core.Index
	c.index, ix = s.indexOf()
	s.far = farFromEnd(ix, s.core.RecordedUpTo())
	if err := s.storeNearEnd(c); err != nil {
		t.Fatal(err)
	}
	if len(c.records) != 4 {
		t.Fatalf("%d records to store again, want the 4 heads", len(c.records))
	}
	for i, r := range c.records {
		if r.id != stored[i].id {
			t.Fatalf("stored again %s, want the head %s", r.id, stored[i].id)
		}
		before, again := dtr.DTR{}, dtr.DTR{}
		if json.Unmarshal(stored[i].data, &before) != nil || json.Unmarshal(r.data, &again) != nil {
			t.Fatal("undecodable record")
		}
		if !reflect.DeepEqual(normalized(before), normalized(again)) {
			t.Fatalf("stored again as\n%s\nwas\n%s", r.data, stored[i].data)
		}
	}
	if _, ix := s.indexOf(); len(farFromEnd(ix, s.core.RecordedUpTo())) != 0 {
		t.Fatal("the next index picks them again before their checkpoint")
	}
	if _, err := s.store(ctx, []*commit{c}); err != nil {
		t.Fatal(err)
	}
	s.journal.Checkpoint(ctx)
	s.journal.Wait()
	for _, r := range s.journal.TakeRecorded() {
		s.core.Recorded(r.id, r.seq)
	}
	_, ix = s.indexOf()
	for i, id := range ix.Queues[0].Heads {
		e, err := kv.Get(ctx, id.String())
		if err != nil {
			t.Fatal(err)
		}
		if at := ix.Queues[0].HeadsAt[i]; at != e.Revision() || at <= uint64(len(stored)) {
			t.Fatalf("the index names head %s at %d; the bucket has it at %d", id, at, e.Revision())
		}
	}
}

// normalized is d with its times in UTC and without their monotonic
// reading, as a record stores them.
func normalized(d dtr.DTR) dtr.DTR {
	for _, t := range []*time.Time{&d.Created, &d.Updated, &d.StateEntered} {
		*t = t.UTC().Round(0)
	}
	return d
}

// A leader over a bucket whose queued DTRs lie far back (finished DTRs'
// records stored after them) stores its index's DTRs again, and its
// index soon names them where they now lie, near the bucket's end.
func TestALeaderMovesItsIndexsDTRsNearTheBucketsEnd(t *testing.T) {
	nc, _, kv := journalServer(t)
	ctx := context.Background()
	defer func(w uint64) { nearWindow = w }(nearWindow)
	nearWindow = 8
	now := time.Now().Add(-time.Hour)
	for i := range 20 {
		d := newDTR(fmt.Sprint("q", i))
		d.StateEntered = now.Add(time.Duration(i) * time.Millisecond)
		if _, err := kv.Put(ctx, d.ID.String(), rec(t, d, dtr.QueryReplica, d.StateEntered).data); err != nil {
			t.Fatal(err)
		}
	}
	var end uint64
	for i := range 100 {
		r := rec(t, newDTR(fmt.Sprint("done", i)), dtr.Done, now)
		var err error
		if end, err = kv.Put(ctx, r.id.String(), r.data); err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(Config{RestoreHeads: 2, CheckpointEvery: 100 * time.Millisecond}, nc, quiet())
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("scheduler: %v", err)
		}
	}()
	var last string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the index's DTRs were not moved near the bucket's end (stored up to %d before the start): %s", end, last)
		}
		e, err := kv.Get(ctx, indexKey)
		if err != nil {
			last = err.Error()
			continue
		}
		_, ix, err := decodeIndex(e.Value())
		if err != nil {
			t.Fatal(err)
		}
		near, named := 0, 0
		check := func(ids []uuid.UUID, at []uint64) {
			for i, id := range ids {
				named++
				r, err := kv.Get(ctx, id.String())
				if err == nil && r.Revision() == at[i] && at[i] > end {
					near++
				}
			}
		}
		for _, q := range ix.Queues {
			check(q.Heads, q.HeadsAt)
		}
		check(ix.Keep, ix.KeepAt)
		if last = fmt.Sprintf("%d of the %d DTRs the index names lie past %d where it says", near, named, end); named > 0 && near == named {
			return
		}
	}
}
