package generator

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

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
