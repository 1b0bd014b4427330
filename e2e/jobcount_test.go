package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// TestADTRPublishedWithAJobsIdDoesNotCountInThatJob: anyone may group the
// DTRs they publish under a job_id; one that is a job's id adds nothing to
// that job, which does not end while its own DTRs run.
func TestADTRPublishedWithAJobsIdDoesNotCountInThatJob(t *testing.T) {
	s := start(t, testConfig())
	remote := filepath.Join(s.dir, "remote")
	writeFile(t, filepath.Join(remote, "a"), 1000, 1)
	writeFile(t, filepath.Join(remote, "b"), 1000, 2)
	base, _ := heldStore(t, remote)
	j := &job.Job{ID: "reco-42", Inputs: []job.File{
		{Source: base + "/a", Destination: fileURL(filepath.Join(s.dir, "out", "a"))},
		{Source: base + "/b", Destination: fileURL(filepath.Join(s.dir, "out", "b"))},
	}}
	r := s.submit(j)
	// Another user groups their own directly published DTRs under the same
	// job_id (as docs/job-description.md shows).
	var foreign []uuid.UUID
	for i := 0; i < 2; i++ {
		src := filepath.Join(s.dir, "other", fmt.Sprint(i))
		writeFile(t, src, 100, i)
		id := uuid.New()
		foreign = append(foreign, id)
		m := nats.NewMsg(api.SubjectSubmit)
		m.Header.Set(nats.MsgIdHdr, id.String())
		m.Data = fmt.Appendf(nil, `{"id":%q,"job_id":"reco-42","source":%q,"destination":%q}`, id, fileURL(src), fileURL(src+".copy"))
		if _, err := s.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range foreign {
		s.awaitDTR(id, 10*time.Second, final)
	}
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		var ev api.JobEvent
		if err := s.request(api.SubjectJobStatus, []byte(r.JobID), nil, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Announced {
			t.Fatalf("job %s announced %s (done %d of %d) while its own %d DTRs are still pending", r.JobID, ev.State, ev.Done, ev.Total, len(ev.Pending))
		}
	}
}

// TestAJobWhoseFailuresAreLongStillEnds: every DTR of the job is within
// the size limit; their failure lines, each as long as the DTR's URLs, are
// shortened so that the job's record still fits a message (on a server of
// 128 KiB), and the job ends.
func TestAJobWhoseFailuresAreLongStillEnds(t *testing.T) {
	s := startWithMaxPayload(t, testConfig(), 128<<10)
	s.shares()
	base := httpServer(t, http.NotFoundHandler())
	long := strings.Repeat(strings.Repeat("d", 200)+"/", 19) // a 3.8 KB relative name
	var b strings.Builder
	fmt.Fprintf(&b, "&(rsl_substitution=(\"L\" \"%s\"))(outputfiles=", long)
	for i := range 24 {
		fmt.Fprintf(&b, "($(L)#\"%d\" \"%s/%d\")", i, base, i)
	}
	b.WriteString(")")
	h := nats.Header{}
	h.Set(api.HeaderSessionDir, filepath.Join(s.dir, "session"))
	var r api.SubmitReply
	if err := s.request(api.SubjectJobSubmit, []byte(b.String()), h, &r); err != nil {
		t.Fatalf("submit (%d bytes): %v", b.Len(), err)
	}
	ev := s.wait(r.JobID, 30*time.Second)
	if ev.State != api.JobFailed || len(ev.Failures) != 24 {
		t.Fatalf("job %s with %d failure lines, want FAILED with 24", ev.State, len(ev.Failures))
	}
	for _, f := range ev.Failures {
		if len(f) > 320 || !strings.HasPrefix(f, "Failed in data staging: ") {
			t.Fatalf("a failure line of %d bytes: %.80s…", len(f), f)
		}
	}
}

// A restarted scheduler announces final DTRs again, grouped differently,
// after their job has ended: the ended job's counts must not change.
func TestFinalsAnnouncedAgainAfterTheJobEndedLeaveItsCounts(t *testing.T) {
	s := start(t, testConfig())
	j := &job.Job{ID: "ended-then-again"}
	for _, n := range []string{"a", "b"} {
		src := filepath.Join(s.dir, "in", n)
		writeFile(t, src, 100, 1)
		j.Inputs = append(j.Inputs, job.File{Source: fileURL(src), Destination: fileURL(filepath.Join(s.dir, "out", n))})
	}
	r := s.submit(j)
	s.wait(r.JobID, 30*time.Second)
	var fs api.Finals
	for _, id := range r.DTRs {
		d := s.awaitDTR(id, 10*time.Second, func(d dtr.DTR) bool { return d.State == dtr.Done })
		b, _ := json.Marshal(d)
		fs.DTRs = append(fs.DTRs, api.FinalEntry{DTR: b})
	}
	ev, _ := codec.NewEvent(api.TypeDTRFinals, "sluice/scheduler", "again", fs)
	m, _ := codec.Encode(context.Background(), api.SubjectDTRFinal, "again.both", ev)
	if _, err := s.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the generator takes the event (nothing to wait for: it changes nothing)
	st := s.wait(r.JobID, time.Second)
	if st.Done != 2 || st.Final() != st.Total {
		t.Fatalf("ended job now says %d done of %d files (%d pending per the client)", st.Done, st.Total, st.Total-st.Final())
	}
}
