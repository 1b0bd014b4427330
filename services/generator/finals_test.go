package generator

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// TestAFailedDownloadCountedByAReconcileFirstStillCancelsTheOthers: a
// restarted generator's reconcile may count a job's first failed download
// from the stored finals before the finals handler counts it (which then
// sees nothing new to cancel for); the job's other downloads are cancelled
// all the same.
func TestAFailedDownloadCountedByAReconcileFirstStillCancelsTheOthers(t *testing.T) {
	ctx := context.Background()
	ns, err := bus.Embedded(filepath.Join(t.TempDir(), "js"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := bus.Ensure(ctx, js, bus.Setup{}); err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{}, nc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if s.kv, err = js.KeyValue(ctx, bus.BucketJobs); err != nil {
		t.Fatal(err)
	}
	r, err := s.Submit(ctx, auth.Operator, &job.Job{ID: "j", Inputs: []job.File{
		{Source: "http://h.example/1", Destination: "file:///out/1"},
		{Source: "http://h.example/2", Destination: "file:///out/2"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	failed := &dtr.DTR{ID: r.DTRs[0], JobID: "j", Direction: dtr.Download, State: dtr.Error,
		Error: &dtr.Failure{Text: "not found"}, Ended: time.Now()}
	fs := []*final{{d: failed, fresh: true}}
	b, _ := json.Marshal(failed)
	if _, err := s.kv.Create(ctx, finalsKey("j", fs), b); err != nil { // the finals handler stores it
		t.Fatal(err)
	}
	if err := s.reconcileJob(ctx, "j"); err != nil { // the reconcile counts it
		t.Fatal(err)
	}
	if err := s.recordFinals(ctx, "j", fs); err != nil { // the finals handler counts it: nothing new
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, bus.StreamSubmit)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx, api.SubjectCancelCommand)
	if err != nil {
		t.Fatalf("the job's other download was never cancelled: %v", err)
	}
	var c api.Cancel
	if _, err := codec.DecodeData(ctx, &nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data}, api.TypeCancel, &c); err != nil || c.DTR != r.DTRs[1] {
		t.Fatalf("the last cancel is for %s (%v), want the other download %s", c.DTR, err, r.DTRs[1])
	}
}

// TestAFinalsEventDeliveredAgainIsCountedOnce: the scheduler gathers the
// final DTRs of several steps into one event; delivered again (the
// generator died before it acknowledged it), the event counts each DTR
// once, and the job ends once, when its last DTR comes in another event.
func TestAFinalsEventDeliveredAgainIsCountedOnce(t *testing.T) {
	ctx := context.Background()
	ns, err := bus.Embedded(filepath.Join(t.TempDir(), "js"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := bus.Ensure(ctx, js, bus.Setup{}); err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{}, nc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if s.kv, err = js.KeyValue(ctx, bus.BucketJobs); err != nil {
		t.Fatal(err)
	}
	r, err := s.Submit(ctx, auth.Operator, &job.Job{ID: "j", Inputs: []job.File{
		{Source: "http://h.example/1", Destination: "file:///out/1"},
		{Source: "http://h.example/2", Destination: "file:///out/2"},
		{Source: "http://h.example/3", Destination: "file:///out/3"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ends, err := nc.SubscribeSync("sluice.event.job.>")
	if err != nil {
		t.Fatal(err)
	}
	// A Finals event as the scheduler writes it, of the given DTRs, done.
	publish := func(ids ...uuid.UUID) {
		var fs api.Finals
		for _, id := range ids {
			b, _ := json.Marshal(dtr.DTR{ID: id, JobID: "j", Direction: dtr.Download, State: dtr.Done, Ended: time.Now()})
			fs.DTRs = append(fs.DTRs, api.FinalEntry{DTR: b})
		}
		ev, err := codec.NewEvent(api.TypeDTRFinals, "sluice/scheduler", "", fs)
		if err != nil {
			t.Fatal(err)
		}
		m, err := codec.Encode(ctx, api.SubjectDTRFinal, fmt.Sprint("finals.", ids), ev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := js.Consumer(ctx, bus.StreamEvents, bus.ConsumerGen)
	if err != nil {
		t.Fatal(err)
	}
	// take hands the next delivery to the finals handler and acknowledges
	// it, or asks for it again at once (the generator died first).
	take := func(ack bool) {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		m := <-batch.Messages()
		if m == nil {
			t.Fatal("no finals event delivered")
		}
		if err := s.onFinals(ctx, []jetstream.Msg{m}); err != nil {
			t.Fatal(err)
		}
		if ack {
			_ = m.Ack()
		} else {
			_ = m.Nak()
		}
	}
	counts := func() api.JobRecord {
		var rec Record
		if _, err := s.get(ctx, "j", &rec); err != nil {
			t.Fatal(err)
		}
		return rec.JobRecord
	}

	publish(r.DTRs[0], r.DTRs[1])
	take(false)
	take(true)
	if rec := counts(); rec.Done != 2 || rec.Announced {
		t.Fatalf("after the event delivered twice: %d done (announced %v), want 2 and the job running", rec.Done, rec.Announced)
	}
	publish(r.DTRs[2])
	take(true)
	if rec := counts(); rec.Done != 3 || !rec.Announced {
		t.Fatalf("after the last DTR: %d done (announced %v), want 3 and the job ended", rec.Done, rec.Announced)
	}
	if _, err := ends.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("no job end: %v", err)
	}
	if m, err := ends.NextMsg(100 * time.Millisecond); err == nil {
		t.Fatalf("the job ended twice: %s", m.Subject)
	}
}
