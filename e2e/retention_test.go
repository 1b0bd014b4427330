package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// TestWithARetentionAnEndedJobAndItsDTRsAreForgotten: with SLUICE_RETENTION
// of 2 s, a job's records (its record, file list and final DTRs in
// sluice_jobs) and its DTRs' records (sluice_dtrs) are gone a few seconds
// after it ended: the status of either is "unknown". A job that has not
// ended stays, however old.
func TestWithARetentionAnEndedJobAndItsDTRsAreForgotten(t *testing.T) {
	cfg := testConfig()
	cfg.Retention = 2 * time.Second
	s := start(t, cfg)
	s.shares()
	ctx := context.Background()
	jobs, err := s.js.KeyValue(ctx, bus.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	// A job record that never ended (its generator lost, say).
	if _, err := jobs.Create(ctx, "unended", []byte(`{"job":{"id":"unended"},"state":"running","total":5,"created":"2020-01-01T00:00:00Z"}`)); err != nil {
		t.Fatal(err)
	}
	j := &job.Job{}
	for i := range 3 {
		src := filepath.Join(s.dir, "in", strconv.Itoa(i))
		writeFile(t, src, 100, i)
		j.Inputs = append(j.Inputs, job.File{Source: fileURL(src), Destination: fileURL(filepath.Join(s.dir, "out", strconv.Itoa(i)))})
	}
	reply := s.submit(j)
	ev := s.wait(reply.JobID, 30*time.Second)
	if ev.Done != 3 {
		t.Fatalf("job ended with %d of 3 done", ev.Done)
	}
	if _, _, ok := s.dtrRecord(reply.DTRs[0]); !ok {
		t.Fatal("the DTR is unknown right after its job ended")
	}
	history, err := s.js.Stream(ctx, bus.StreamHistory)
	if err != nil {
		t.Fatal(err)
	}
	historyKept := func(id uuid.UUID) bool {
		_, err := history.GetLastMsgForSubject(ctx, bus.HistorySubject(id.String()))
		return !errors.Is(err, jetstream.ErrMsgNotFound)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := s.request(api.SubjectJobStatus, []byte(reply.JobID), nil, new(any))
		_, _, dtrKnown := s.dtrRecord(reply.DTRs[0])
		// The DTR's history goes with its record.
		kept := historyKept(reply.DTRs[0])
		if err != nil && strings.Contains(err.Error(), "unknown job") && !dtrKnown && !kept {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("20 s after a 2 s retention: job status error %v, DTR known %v, its history kept %v", err, dtrKnown, kept)
		}
		time.Sleep(200 * time.Millisecond)
	}
	keys, err := jobs.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for k := range keys.Keys() {
		left = append(left, k)
	}
	if len(left) != 1 || left[0] != "unended" {
		t.Fatalf("sluice_jobs keys left: %v, want only the job that never ended", left)
	}
	dtrs, err := s.js.KeyValue(ctx, bus.BucketDTRs)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range reply.DTRs {
		if _, err := dtrs.Get(ctx, id.String()); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("record of DTR %s: %v, want gone", id, err)
		}
	}
}

// TestAfterItsRetentionADTRSubmittedAgainRunsAgain: past SLUICE_RETENTION
// a DTR's id is unknown, also to a scheduler that has run all along and
// remembered it as finished.
func TestAfterItsRetentionADTRSubmittedAgainRunsAgain(t *testing.T) {
	cfg := testConfig()
	cfg.Retention = 2 * time.Second
	s := start(t, cfg)
	src := filepath.Join(s.dir, "in")
	writeFile(t, src, 100, 1)
	dst := filepath.Join(s.dir, "out")
	id := uuid.New()
	pub := func() {
		m := nats.NewMsg(api.SubjectSubmit)
		m.Header.Set(nats.MsgIdHdr, uuid.NewString()) // not a JetStream duplicate
		m.Data = fmt.Appendf(nil, `{"id":%q,"source":%q,"destination":%q,"options":{"overwrite":true}}`, id, fileURL(src), fileURL(dst))
		if _, err := s.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	pub()
	s.awaitDTR(id, 30*time.Second, func(d dtr.DTR) bool { return d.State == dtr.Done })
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, _, ok := s.dtrRecord(id); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the DTR's record did not expire")
		}
	}
	pub()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, _, ok := s.dtrRecord(id); ok {
			return // it runs again
		}
		if time.Now().After(deadline) {
			t.Fatal("the DTR submitted again after its retention never ran: the scheduler still remembers it as finished")
		}
	}
}
