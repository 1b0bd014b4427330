package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/bustest"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/bus/tracing"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// journalServer is a real JetStream server with Sluice's streams and
// buckets set up.
func journalServer(t *testing.T) (*nats.Conn, jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	nc, js := bustest.Server(t)
	kv, err := js.KeyValue(context.Background(), bus.BucketDTRs)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, kv
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// rec is a record of d in state st, changed at updated.
func rec(t *testing.T, d dtr.DTR, st dtr.State, updated time.Time) record {
	t.Helper()
	d.State, d.Updated = st, updated
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return record{id: d.ID, data: b, final: d.State.Final()}
}

func newDTR(name string) dtr.DTR {
	return dtr.DTR{ID: uuid.New(), JobID: "job", Source: "file:///src/" + name, Destination: "file:///dst/" + name,
		Share: "_default-download", Priority: 50, MaxAttempts: 10, Created: time.Now()}
}

func journalMsgs(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	st, err := js.Stream(context.Background(), bus.StreamJournal)
	if err != nil {
		t.Fatal(err)
	}
	return st.CachedInfo().State.Msgs
}

func TestAJournalMessageHoldsWholeRecordsUpToItsSize(t *testing.T) {
	r := func(n int) record { return record{id: uuid.New(), data: []byte(strings.Repeat("x", n))} }
	tests := []struct {
		name     string
		recs     []record
		maxBytes int
		want     []int // records per message
	}{
		{"none", nil, 100, nil},
		{"all in one", []record{r(10), r(10), r(10)}, 100, []int{3}},
		{"split at the size", []record{r(40), r(40), r(40)}, 90, []int{2, 1}},
		{"a record larger than a message goes alone", []record{r(10), r(200), r(10)}, 100, []int{1, 1, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := &journal{maxBytes: tt.maxBytes}
			msgs, _ := j.messages(tt.recs)
			var got []int
			ids := map[string]bool{}
			for _, m := range msgs {
				got = append(got, strings.Count(string(m.Data), "\n"))
				if len(m.Data) > tt.maxBytes && strings.Count(string(m.Data), "\n") > 1 {
					t.Errorf("a message of %d bytes holds more than one record", len(m.Data))
				}
				id := m.Header.Get(jetstream.MsgIDHeader)
				if id == "" || ids[id] {
					t.Errorf("message id %q missing or repeated", id)
				}
				ids[id] = true
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("records per message %v, want %v", got, tt.want)
			}
		})
	}
}

func TestACheckpointStoresEachChangedDTROnceAndPurgesTheJournal(t *testing.T) {
	_, js, kv := journalServer(t)
	ctx := context.Background()
	j := newJournal(js, kv, quiet(), 1<<20, time.Hour, 1000)
	a, b := newDTR("a"), newDTR("b")
	now := time.Now()
	for _, recs := range [][]record{
		{rec(t, a, dtr.New, now), rec(t, b, dtr.New, now)},
		{rec(t, a, dtr.PreClean, now.Add(time.Second))},
		{rec(t, a, dtr.Transferring, now.Add(2*time.Second))},
	} {
		if err := j.Append(ctx, recs); err != nil {
			t.Fatal(err)
		}
	}
	if n := journalMsgs(t, js); n != 3 {
		t.Fatalf("journal holds %d messages, want 3 (one per append)", n)
	}
	if _, err := kv.Get(ctx, a.ID.String()); err == nil {
		t.Fatal("a record is in the bucket before any checkpoint")
	}
	if got, ok := j.Lookup(a.ID); !ok || !strings.Contains(string(got), `"TRANSFERRING"`) {
		t.Fatalf("Lookup(a) = %s, %v; want its latest record", got, ok)
	}

	j.Checkpoint(ctx)
	j.Wait()

	for _, tt := range []struct {
		d    dtr.DTR
		want string
	}{{a, `"TRANSFERRING"`}, {b, `"NEW"`}} {
		e, err := kv.Get(ctx, tt.d.ID.String())
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(e.Value()), tt.want) {
			t.Errorf("bucket holds %s, want state %s", e.Value(), tt.want)
		}
		if e.Revision() != 1 && e.Revision() != 2 {
			t.Errorf("revision %d", e.Revision())
		}
	}
	st, _ := js.Stream(ctx, "KV_"+bus.BucketDTRs)
	if n := st.CachedInfo().State.LastSeq; n != 2 {
		t.Errorf("the bucket took %d writes for two DTRs, want 2", n)
	}
	if n := journalMsgs(t, js); n != 0 {
		t.Errorf("journal holds %d messages after the checkpoint, want 0", n)
	}
	if _, ok := j.Lookup(a.ID); ok {
		t.Error("a checkpointed record is still looked up in the journal")
	}
	if j.Due(time.Now()) {
		t.Error("a checkpoint is due with nothing changed")
	}
}

func TestACheckpointThatFailsKeepsTheJournalAndTheRecords(t *testing.T) {
	_, js, kv := journalServer(t)
	ctx := context.Background()
	j := newJournal(js, kv, quiet(), 1<<20, time.Hour, 1)
	a := newDTR("a")
	if err := j.Append(ctx, []record{rec(t, a, dtr.New, time.Now())}); err != nil {
		t.Fatal(err)
	}
	if !j.Due(time.Now()) {
		t.Fatal("no checkpoint due with more changed DTRs than CheckpointRecords")
	}
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	j.Checkpoint(stopped) // cannot store anything
	j.Wait()
	if n := journalMsgs(t, js); n != 1 {
		t.Fatalf("journal holds %d messages after a failed checkpoint, want 1", n)
	}
	if _, ok := j.Lookup(a.ID); !ok {
		t.Fatal("the record is lost after a failed checkpoint")
	}
	j.Checkpoint(ctx)
	j.Wait()
	if _, err := kv.Get(ctx, a.ID.String()); err != nil {
		t.Fatalf("the next checkpoint did not store the record: %v", err)
	}
	if n := journalMsgs(t, js); n != 0 {
		t.Fatalf("journal holds %d messages, want 0", n)
	}
}

func TestRecoveryReplaysTheJournalOverTheCheckpoint(t *testing.T) {
	nc, js, kv := journalServer(t)
	ctx := context.Background()
	now := time.Now().Add(-time.Minute)
	moved, queued, finished, checkpointedOnly := newDTR("moved"), newDTR("queued"), newDTR("finished"), newDTR("old")
	// The checkpoint: three DTRs as they were.
	for _, r := range []record{rec(t, moved, dtr.QueryReplica, now), rec(t, finished, dtr.Transfer, now),
		rec(t, checkpointedOnly, dtr.Transfer, now)} {
		if _, err := kv.Put(ctx, r.id.String(), r.data); err != nil {
			t.Fatal(err)
		}
	}
	// The journal since: one moved on twice, one is new, one finished.
	old := newJournal(js, kv, quiet(), 1<<20, time.Hour, 1000)
	for _, recs := range [][]record{
		{rec(t, moved, dtr.Transfer, now.Add(time.Second)), rec(t, queued, dtr.QueryReplica, now.Add(time.Second))},
		{rec(t, moved, dtr.Transferring, now.Add(2*time.Second)), rec(t, finished, dtr.Done, now.Add(2*time.Second))},
	} {
		if err := old.Append(ctx, recs); err != nil {
			t.Fatal(err)
		}
	}

	s, err := New(Config{}, nc, quiet())
	if err != nil {
		t.Fatal(err)
	}
	s.kv, s.journal = kv, newJournal(js, kv, quiet(), 1<<20, time.Hour, 1000)
	recoverAll(t, s)
	for _, tt := range []struct {
		d    dtr.DTR
		want dtr.State
	}{{moved, dtr.Transferring}, {queued, dtr.QueryReplica}, {checkpointedOnly, dtr.Transfer}} {
		got, ok := s.core.Get(tt.d.ID)
		if !ok {
			t.Errorf("%s not recovered", tt.d.Source)
			continue
		}
		if got.State != tt.want {
			t.Errorf("%s recovered in %s, want %s", tt.d.Source, got.State, tt.want)
		}
	}
	if _, ok := s.core.Get(finished.ID); ok {
		t.Error("a DTR that finished in the journal is back in the core")
	}
	if !s.finished.Has(finished.ID, time.Now()) {
		t.Error("a DTR that finished in the journal is not remembered as finished")
	}
	// What was replayed is checkpointed later, and the journal then purged.
	s.journal.Checkpoint(ctx)
	s.journal.Wait()
	e, err := kv.Get(ctx, finished.ID.String())
	if err != nil || !strings.Contains(string(e.Value()), `"DONE"`) {
		t.Fatalf("the finished DTR's record after the checkpoint: %v", err)
	}
	if n := journalMsgs(t, js); n != 0 {
		t.Fatalf("journal holds %d messages, want 0", n)
	}
}

func TestFinalDTRsGoOutAHundredToAnEventWhoseIdNamesThem(t *testing.T) {
	nc, _, _ := journalServer(t)
	s, err := New(Config{}, nc, quiet())
	if err != nil {
		t.Fatal(err)
	}
	var ds []*dtr.DTR
	encoded := map[uuid.UUID][]byte{}
	for i := range 250 {
		d := newDTR(fmt.Sprint(i))
		d.State, d.TraceParent = dtr.Done, fmt.Sprintf("00-4bf92f3577b34da6a3ce929d0e0e%04x-00f067aa0ba902b7-01", i)
		ds = append(ds, &d)
		encoded[d.ID], _ = json.Marshal(d)
	}
	// announce makes the Finals events of final DTRs, as the committer
	// does with those of the steps it gathered.
	announce := func(ds []*dtr.DTR) []*nats.Msg {
		entries, err := s.finalEntries(context.Background(), time.Now(), ds, encoded, true)
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := finalsMessages(context.Background(), entries, int(nc.MaxPayload())/2)
		if err != nil {
			t.Fatal(err)
		}
		return msgs
	}
	ids := func(ds []*dtr.DTR) string {
		var out []string
		for _, m := range announce(ds) {
			out = append(out, m.Header.Get(nats.MsgIdHdr))
		}
		return strings.Join(out, " ")
	}
	msgs := announce(ds)
	var sizes []int
	i := 0
	for _, m := range msgs {
		fs, err := codec.DecodeFinals(context.Background(), m)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(fs))
		for _, f := range fs {
			if f.DTR.ID != ds[i].ID || string(f.Data) != string(encoded[ds[i].ID]) {
				t.Fatalf("final %d is %s, want %s as encoded", i, f.DTR.ID, ds[i].ID)
			}
			if !tracing.ValidTraceParent(f.TraceParent) {
				t.Fatalf("final %d has traceparent %q", i, f.TraceParent)
			}
			i++
		}
		if !s.finished.Has(ds[0].ID, time.Now()) {
			t.Fatal("a DTR announced final is not remembered as finished")
		}
	}
	if !slices.Equal(sizes, []int{100, 100, 50}) {
		t.Fatalf("DTRs per event %v, want [100 100 50]", sizes)
	}
	// Announced again after a crash, the same DTRs are the same messages to
	// JetStream; grouped otherwise, they are others.
	if a, b := ids(ds[:3]), ids(ds[:3]); a != b {
		t.Errorf("the same finals got ids %s and %s", a, b)
	}
	if a, b := ids(ds[:3]), ids(ds[:2]); a == b {
		t.Errorf("finals %s and a message with one more DTR share the id %s", b, a)
	}
}

// TestWithARetentionTheRecordOfAFinalDTRExpiresAndOthersStay: with
// SLUICE_RETENTION set, a checkpoint stores a final DTR's record with that
// time to live, and the record of a DTR still on its way without one.
func TestWithARetentionTheRecordOfAFinalDTRExpiresAndOthersStay(t *testing.T) {
	_, js, kv := journalServer(t)
	ctx := context.Background()
	if err := bus.Ensure(ctx, js, bus.Setup{ExpiringRecords: true}); err != nil {
		t.Fatal(err)
	}
	j := newJournal(js, kv, quiet(), 1<<20, time.Hour, 1000)
	j.retention = time.Second
	done, queued := newDTR("done"), newDTR("queued")
	if err := j.Append(ctx, []record{rec(t, done, dtr.Done, time.Now()), rec(t, queued, dtr.Transfer, time.Now())}); err != nil {
		t.Fatal(err)
	}
	j.Checkpoint(ctx)
	j.Wait()
	for _, d := range []dtr.DTR{done, queued} {
		if _, err := kv.Get(ctx, d.ID.String()); err != nil {
			t.Fatalf("record of %s not stored: %v", d.Source, err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := kv.Get(ctx, done.ID.String())
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the final DTR's record is still there 10 s after its 1 s retention: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := kv.Get(ctx, queued.ID.String()); err != nil {
		t.Fatalf("the queued DTR's record expired too: %v", err)
	}
}

func TestWithoutARetentionNoRecordExpires(t *testing.T) {
	_, js, kv := journalServer(t)
	ctx := context.Background()
	j := newJournal(js, kv, quiet(), 1<<20, time.Hour, 1000)
	done := newDTR("done")
	if err := j.Append(ctx, []record{rec(t, done, dtr.Done, time.Now())}); err != nil {
		t.Fatal(err)
	}
	j.Checkpoint(ctx)
	j.Wait()
	e, err := kv.Get(ctx, done.ID.String())
	if err != nil {
		t.Fatal(err)
	}
	st, _ := js.Stream(ctx, "KV_"+bus.BucketDTRs)
	if st.CachedInfo().Config.AllowMsgTTL {
		t.Error("the bucket allows records with a time to live though no retention is set")
	}
	m, err := st.GetMsg(ctx, e.Revision())
	if err != nil {
		t.Fatal(err)
	}
	if ttl := m.Header.Get(jetstream.MsgTTLHeader); ttl != "" {
		t.Errorf("the record has a time to live %q", ttl)
	}
}

// recoverAll builds s's copy of the saved DTRs as a standby does: the
// checkpoints, then the journal up to its last message.
func recoverAll(t *testing.T, s *Service) {
	t.Helper()
	ctx := context.Background()
	tail, err := s.warmUp(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tail.cc.Stop()
	st, err := s.js.Stream(ctx, bus.StreamJournal)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for s.journal.ReadUpTo() < info.State.LastSeq {
		select {
		case <-tail.ready:
			if err := s.applyTail(tail, tail.take()); err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the journal tail read up to %d of %d", s.journal.ReadUpTo(), info.State.LastSeq)
		}
	}
}

// preCleanRunning is what the core counts running in PRE_CLEAN.
func preCleanRunning(c *core.Core) int {
	stats, _ := c.Shares()
	n := 0
	for _, st := range stats {
		if st.State == dtr.PreClean {
			n += st.Running + st.Reserved // grants, and slots chained grants hold
		}
	}
	return n
}

// A scheduler that recovers (or a standby that applies the journal) holds
// again the PRE_CLEAN slot of a chained grant running in its record, once
// however many of its records it applies, and takes its chained result;
// one whose later record moved on holds none.
func TestRecoveryHoldsARunningChainedGrantsPreCleanSlotOnce(t *testing.T) {
	nc, js, kv := journalServer(t)
	ctx := context.Background()
	now := time.Now().Add(-time.Minute)
	chained, movedOn := newDTR("chained"), newDTR("moved-on")
	for _, d := range []*dtr.DTR{&chained, &movedOn} {
		d.Grant, d.Chained = d.ID.String()+".1", true
	}
	// Records encoded as the scheduler's steps encode them.
	rec := func(t *testing.T, d dtr.DTR, st dtr.State, updated time.Time) record {
		t.Helper()
		d.State, d.Updated = st, updated
		b, err := codec.EncodeJSON(&d)
		if err != nil {
			t.Fatal(err)
		}
		return record{id: d.ID, data: b}
	}
	if _, err := kv.Put(ctx, chained.ID.String(), rec(t, chained, dtr.QueryingReplica, now).data); err != nil {
		t.Fatal(err)
	}
	old := newJournal(js, kv, quiet(), 1<<20, time.Hour, 1000)
	after := movedOn
	after.Grant, after.Chained = movedOn.ID.String()+".3", false
	for _, recs := range [][]record{
		{rec(t, movedOn, dtr.QueryingReplica, now.Add(time.Second))},
		{rec(t, chained, dtr.QueryingReplica, now.Add(2*time.Second)), rec(t, after, dtr.Transferring, now.Add(2*time.Second))},
	} {
		if err := old.Append(ctx, recs); err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(Config{ChainPreClean: true}, nc, quiet())
	if err != nil {
		t.Fatal(err)
	}
	s.kv, s.journal = kv, newJournal(js, kv, quiet(), 1<<20, time.Hour, 1000)
	recoverAll(t, s)
	if n := preCleanRunning(s.core); n != 1 {
		t.Fatalf("PRE_CLEAN counts %d running after recovery, want the chained grant's 1", n)
	}
	then := &core.Result{DTR: chained.ID, Grant: chained.ID.String() + ".2", State: dtr.PreCleaning}
	if err := s.core.Result(time.Now(), core.Result{DTR: chained.ID, Grant: chained.Grant, State: dtr.QueryingReplica, Size: 5, Then: then}); err != nil {
		t.Fatalf("the chained result after recovery: %v", err)
	}
	if got, _ := s.core.Get(chained.ID); got.State != dtr.Transfer || got.Grant != then.Grant || got.Chained {
		t.Fatalf("after its chained result: %s under %s (chained %v), want TRANSFER under %s", got.State, got.Grant, got.Chained, then.Grant)
	}
	if n := preCleanRunning(s.core); n != 0 {
		t.Fatalf("PRE_CLEAN counts %d running once the chained result was taken, want 0", n)
	}
}
