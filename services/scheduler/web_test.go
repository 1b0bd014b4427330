package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/bustest"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// webScheduler runs a scheduler on a real embedded NATS server and serves
// its web handler.
func webScheduler(t *testing.T) (*Service, *nats.Conn, string) {
	t.Helper()
	nc, _ := bustest.Server(t)
	s, err := New(Config{MaxProcessor: 1}, nc, quiet()) // one pre-processing slot: a second DTR waits
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("scheduler: %v", err)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); !s.Ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the scheduler is not ready")
		}
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return s, nc, srv.URL
}

// get returns the status and body of a GET of url, and decodes the body
// into v (if not nil).
func get(t *testing.T, url string, v any) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("GET %s: Content-Type %q", url, ct)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("GET %s: %v\n%s", url, err, b)
		}
	}
	return resp.StatusCode, string(b)
}

func TestTheJobsEndpointAsksTheGeneratorAndSaysWhenNoneAnswers(t *testing.T) {
	_, nc, base := webScheduler(t)

	// No generator: the page is told so, at once.
	start := time.Now()
	code, body := get(t, base+"/api/jobs?state=running", nil)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "no generator answers sluice.api.job.list") {
		t.Errorf("with no generator: %d %s", code, body)
	}
	if d := time.Since(start); d > jobListTimeout {
		t.Errorf("the answer with no generator took %s", d)
	}
	for _, q := range []string{"state=done", "limit=0", "limit=1001", "limit=x"} {
		if code, body := get(t, base+"/api/jobs?"+q, nil); code != http.StatusBadRequest || !strings.Contains(body, `"error"`) {
			t.Errorf("?%s: %d %s", q, code, body)
		}
	}

	// A generator answers: the jobs, without credentials.
	ended := time.Date(2026, 11, 26, 1, 2, 3, 0, time.UTC)
	asked := make(chan api.JobListRequest, 10)
	sub, err := nc.Subscribe(api.SubjectJobList, func(m *nats.Msg) {
		var req api.JobListRequest
		_ = json.Unmarshal(m.Data, &req)
		asked <- req
		if req.State == api.JobFailed {
			r := nats.NewMsg(m.Reply)
			r.Header.Set("Nats-Service-Error-Code", "503")
			r.Header.Set("Nats-Service-Error", "the job records cannot be read now; try again")
			_ = m.RespondMsg(r)
			return
		}
		_ = m.Respond(mustJSON(t, api.JobListReply{More: true, Jobs: []api.JobRecord{{
			Job:   job.Job{ID: "j1", Name: "analysis", Owner: dtr.Identity{DN: "/CN=alice"}},
			State: api.JobFailed, Total: 3, Done: 2, Failed: 1, Created: ended.Add(-time.Minute), Ended: ended,
			Failures: []string{"Failed in data staging: https://h.example.org/f?access_token=s3cr3t: 404"},
		}}}))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	var jobs WebJobs
	if code, body := get(t, base+"/api/jobs?state=ended&limit=7", &jobs); code != http.StatusOK {
		t.Fatalf("jobs: %d %s", code, body)
	}
	if req := <-asked; req.State != "ended" || req.Limit != 7 {
		t.Errorf("the generator was asked %+v", req)
	}
	if len(jobs.Jobs) != 1 || !jobs.More {
		t.Fatalf("jobs %+v", jobs)
	}
	j := jobs.Jobs[0]
	if j.ID != "j1" || j.Name != "analysis" || j.Owner != "/CN=alice" || j.State != api.JobFailed || j.Total != 3 || j.Done != 2 ||
		j.Failed != 1 || !j.Ended.Equal(ended) || len(j.Failures) != 1 || strings.Contains(j.Failures[0], "s3cr3t") {
		t.Errorf("job %+v", j)
	}
	// Asked again at once, the same list is not asked of the generator
	// again.
	get(t, base+"/api/jobs?state=ended&limit=7", nil)
	select {
	case req := <-asked:
		t.Errorf("the generator was asked again at once: %+v", req)
	case <-time.After(100 * time.Millisecond):
	}
	// The generator's error is said.
	if code, body := get(t, base+"/api/jobs?state=failed", nil); code != http.StatusBadGateway || !strings.Contains(body, "cannot be read now") {
		t.Errorf("a generator's error: %d %s", code, body)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestTheDTREndpointShowsARecordAndWhyWithoutCredentials(t *testing.T) {
	s, nc, base := webScheduler(t)

	if code, body := get(t, base+"/api/dtr/twelve", nil); code != http.StatusBadRequest || !strings.Contains(body, "not a UUID") {
		t.Errorf("a bad id: %d %s", code, body)
	}
	unknown := uuid.New()
	if code, body := get(t, base+"/api/dtr/"+unknown.String(), nil); code != http.StatusNotFound || !strings.Contains(body, "not known to the scheduler") {
		t.Errorf("an unknown DTR: %d %s", code, body)
	}

	// A DTR on its way: its record and why it waits (no worker takes its
	// grant), its URL's token hidden.
	id := uuid.New()
	src := "https://h.example.org/data/f?access_token=s3cr3t"
	if _, err := nc.Request(api.SubjectSubmit, fmt.Appendf(nil, `{"id":%q,"source":%q,"destination":"file:///sluice-test/out/f"}`, id, src), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var held WebDTR
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, body := get(t, base+"/api/dtr/"+id.String(), &held)
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the submitted DTR: %d %s", code, body)
		}
	}
	if held.From != heldCore || held.DTR == nil || held.DTR.ID != id || held.Why == nil || held.Why.Reason == "" {
		t.Fatalf("a DTR on its way: %+v", held)
	}
	if held.DTR.Source != "https://h.example.org/data/f?access_token="+dtr.Redacted {
		t.Errorf("source shown as %q", held.DTR.Source)
	}
	// A second DTR waits behind it: the overview names it among the
	// longest waits without its token.
	if _, err := nc.Request(api.SubjectSubmit, fmt.Appendf(nil, `{"id":%q,"source":%q,"destination":"file:///sluice-test/out/g"}`, uuid.New(), src), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var ov Overview
		_, body := get(t, base+"/api/overview", &ov)
		if sc := ov.Scheduler; sc.Role != roleLeader || sc.Term == 0 || sc.Leader == nil || sc.Leader.Name != sc.Name {
			t.Fatalf("the overview says of the scheduler %+v; want the leader, with its term, naming itself", sc)
		}
		if len(ov.Longest) == 1 {
			if strings.Contains(body, "s3cr3t") || ov.Longest[0].Source != held.DTR.Source {
				t.Errorf("the overview shows the source as %q", ov.Longest[0].Source)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the overview's longest waits: %+v", ov.Longest)
		}
	}

	// A final DTR's record in the store, and one only the record of recent
	// failures has.
	kv, err := s.js.KeyValue(context.Background(), bus.BucketDTRs)
	if err != nil {
		t.Fatal(err)
	}
	stored := dtr.DTR{ID: uuid.New(), Source: "s3://k:secret@bucket.example.org/o?X-Amz-Signature=sigvalue", Destination: "file:///out",
		State: dtr.Error, Error: &dtr.Failure{Kind: dtr.ErrPermanentRemote, Text: "GET https://u:pw@h.example.org/o?sig=sigvalue: 403"}}
	if _, err := kv.Put(context.Background(), stored.ID.String(), mustJSON(t, stored)); err != nil {
		t.Fatal(err)
	}
	var got WebDTR
	code, body := get(t, base+"/api/dtr/"+stored.ID.String(), &got)
	if code != http.StatusOK || got.From != heldStore || got.Why != nil || got.DTR == nil {
		t.Fatalf("a stored DTR: %d %s", code, body)
	}
	for _, secret := range []string{"secret", "sigvalue", ":pw@"} {
		if strings.Contains(body, secret) {
			t.Errorf("the answer shows %q: %s", secret, body)
		}
	}
	gone := failedDTR(dtr.ErrTemporaryRemote, "connection refused by h.example.org:443")
	s.mon.final(time.Now(), gone)
	got = WebDTR{}
	if code, body := get(t, base+"/api/dtr/"+gone.ID.String(), &got); code != http.StatusOK || got.From != "failures" ||
		got.DTR != nil || got.Failure == nil || got.Failure.Kind != dtr.ErrTemporaryRemote || got.Failure.JobID != "job1" {
		t.Errorf("a failed DTR no longer held: %d %s", code, body)
	}
}

func TestTheHistoryEndpointShowsATimelineWithoutCredentials(t *testing.T) {
	s, nc, base := webScheduler(t)
	if code, body := get(t, base+"/api/history/twelve", nil); code != http.StatusBadRequest || !strings.Contains(body, "not a UUID") {
		t.Errorf("a bad id: %d %s", code, body)
	}
	if code, body := get(t, base+"/api/history/"+uuid.New().String(), nil); code != http.StatusNotFound || !strings.Contains(body, "not known to the scheduler") {
		t.Errorf("an unknown DTR: %d %s", code, body)
	}
	// A DTR on its way (no worker takes its grant): its submission and
	// its grant.
	id := uuid.New()
	if _, err := nc.Request(api.SubjectSubmit, fmt.Appendf(nil, `{"id":%q,"source":"https://h.example.org/f","destination":"file:///sluice-test/out/f"}`, id), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var h api.HistoryReply
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, body := get(t, base+"/api/history/"+id.String(), &h)
		if code == http.StatusOK && len(h.Events) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the submitted DTR's history: %d %s", code, body)
		}
	}
	if ev := h.Events[0]; ev.State != dtr.New || ev.Seq != 1 {
		t.Errorf("first event %+v", ev)
	}
	if ev := h.Events[1]; !ev.State.IsActive() || ev.Hold != string(core.HoldRunning) || ev.Grant == "" || ev.From != dtr.New.String() {
		t.Errorf("second event %+v, want a grant from NEW", ev)
	}
	// A final DTR's history, its error's credentials hidden.
	kv, err := s.js.KeyValue(context.Background(), bus.BucketDTRs)
	if err != nil {
		t.Fatal(err)
	}
	stored := dtr.DTR{ID: uuid.New(), Source: "https://h.example.org/o", Destination: "file:///out", State: dtr.Error}
	if _, err := kv.Put(context.Background(), stored.ID.String(), mustJSON(t, stored)); err != nil {
		t.Fatal(err)
	}
	ev := api.HistoryEvent{Seq: 5, Time: time.Now(), From: "CACHE_PROCESSED", State: dtr.Error,
		Error: &dtr.Failure{Kind: dtr.ErrPermanentRemote, Text: "GET https://u:pw@h.example.org/o?sig=sigvalue: 403"}}
	if _, err := s.js.Publish(context.Background(), bus.HistorySubject(stored.ID.String()), mustJSON(t, api.HistoryRecord{Events: []api.HistoryEvent{ev}})); err != nil {
		t.Fatal(err)
	}
	h = api.HistoryReply{}
	code, body := get(t, base+"/api/history/"+stored.ID.String(), &h)
	if code != http.StatusOK || len(h.Events) != 1 || h.Dropped != 4 || h.State != dtr.Error {
		t.Fatalf("a stored DTR's history: %d %s", code, body)
	}
	for _, secret := range []string{"sigvalue", ":pw@"} {
		if strings.Contains(body, secret) {
			t.Errorf("the answer shows %q: %s", secret, body)
		}
	}
	// A DTR whose record is kept and whose history is not: it says so.
	old := dtr.DTR{ID: uuid.New(), Source: "https://h.example.org/p", Destination: "file:///out", State: dtr.Done, Created: time.Now().Add(-time.Hour)}
	if _, err := kv.Put(context.Background(), old.ID.String(), mustJSON(t, old)); err != nil {
		t.Fatal(err)
	}
	h = api.HistoryReply{}
	code, body = get(t, base+"/api/history/"+old.ID.String(), &h)
	if code != http.StatusOK || len(h.Events) != 0 || !strings.Contains(h.Missing, "history no longer kept") {
		t.Fatalf("a DTR whose history was dropped: %d %s", code, body)
	}
}
