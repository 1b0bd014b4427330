package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus/bustest"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// workersReply is a scheduler's answer with a live processor and a silent
// deliverer holding two transfers.
func workersReply(now time.Time) api.WorkersReply {
	d1, d2 := uuid.MustParse("11111111-1111-1111-1111-111111111111"), uuid.MustParse("22222222-2222-2222-2222-222222222222")
	ends := now.Add(95 * time.Second)
	return api.WorkersReply{HeartbeatSeconds: 5, Workers: []api.Worker{
		{ID: "Rk2Y4DPa6gbmFh3cnQj6dD", Role: "delivery", Stage: dtr.StageDelivery, Host: "dl-1", PID: 4242, Version: "v1.4.0",
			Started: now.Add(-2 * time.Hour), Workers: 11, LastHeartbeat: now.Add(-25 * time.Second), Silent: true, LeaseEnds: ends,
			Grants: []api.WorkerGrant{{DTR: d1, Grant: d1.String() + ".7", State: dtr.Transferring, LeaseEnds: ends.Add(-time.Second)},
				{DTR: d2, Grant: d2.String() + ".3", State: dtr.Transferring, LeaseEnds: ends}}},
		{ID: "mS0pWQ5kq0N8yWm7jYQm1c", Role: "processor", Stage: dtr.StagePre, Host: "proc-1", PID: 77, Version: "v1.4.0",
			Started: now.Add(-time.Hour), Workers: 22, LastHeartbeat: now.Add(-2 * time.Second), Grants: []api.WorkerGrant{}},
	}}
}

func TestTheWorkersTableShowsEachWorkerAndTheGrantsOfTheSilentOnes(t *testing.T) {
	now := time.Now()
	var b bytes.Buffer
	writeWorkers(&b, workersReply(now), now)
	out := b.String()
	t.Log("\n" + out)
	for _, want := range []string{
		"WORKER", "LAST HEARTBEAT",
		"Rk2Y4DPa6gbmFh3cnQj6dD  delivery", "4242", "v1.4.0", "2h0m0s", "2/11", "25s ago", "SILENT: its leases end by ",
		"mS0pWQ5kq0N8yWm7jYQm1c  processor", "0/22", "2s ago",
		"Grants held by silent workers",
		"11111111-1111-1111-1111-111111111111  11111111-1111-1111-1111-111111111111.7  TRANSFERRING  delivery@dl-1 (pid 4242)",
		"(in 1m35s)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q", want)
		}
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 8 {
		t.Errorf("%d lines, want 8 (a heading and two workers, a blank, a title, a heading and two grants)", len(lines))
	}
	b.Reset()
	writeWorkers(&b, api.WorkersReply{Workers: []api.Worker{}}, now)
	if !strings.Contains(b.String(), "no worker heard from") {
		t.Errorf("with no workers: %q", b.String())
	}
}

func TestPrintWorkersAsksTheSchedulerAndPrintsATableOrItsJSON(t *testing.T) {
	nc, _ := bustest.Server(t)
	now := time.Now()
	want := workersReply(now)
	sub, err := nc.Subscribe(api.SubjectWorkers, func(m *nats.Msg) {
		b, _ := json.Marshal(want)
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	// The server knows of the subscription only once it has read it: the
	// command's own connection asks at once.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	cfg := &Config{NATSURL: nc.ConnectedUrl()}

	var out bytes.Buffer
	if err := printWorkers(context.Background(), cfg, false, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "delivery@dl-1 (pid 4242)") || !strings.Contains(out.String(), "SILENT") {
		t.Errorf("table:\n%s", out.String())
	}
	out.Reset()
	if err := printWorkers(context.Background(), cfg, true, &out); err != nil {
		t.Fatal(err)
	}
	var got api.WorkersReply
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || len(got.Workers) != 2 || got.Workers[0].PID != 4242 ||
		!got.Workers[0].LeaseEnds.Equal(want.Workers[0].LeaseEnds) {
		t.Fatalf("JSON %s: %+v, %v", out.String(), got, err)
	}
	if !strings.Contains(out.String(), "\n  \"workers\": [\n") {
		t.Errorf("the JSON is not indented:\n%s", out.String())
	}
}

func TestTheSharesSayWhichGrantsSilentWorkersHold(t *testing.T) {
	now := time.Now()
	h := api.Holder{Worker: "w", Role: "delivery", Host: "dl-1", PID: 4242, Silent: true}
	var b bytes.Buffer
	printSilent(&b, []api.SilentGrant{{Holder: h, LeaseEnds: now.Add(time.Minute)}, {Holder: h, LeaseEnds: now.Add(2 * time.Minute)}}, now)
	if out := b.String(); !strings.Contains(out, "2 of the grants counted as running are held by silent workers (delivery@dl-1 (pid 4242): 2)") ||
		!strings.Contains(out, "(in 2m0s)") {
		t.Errorf("%q", out)
	}
	b.Reset()
	printSilent(&b, nil, now)
	if b.Len() != 0 {
		t.Errorf("with no silent worker: %q", b.String())
	}
}
