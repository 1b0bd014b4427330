package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/httpstore"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// history asks the scheduler for a DTR's history.
func (s *system) history(id uuid.UUID) (api.HistoryReply, error) {
	var r api.HistoryReply
	err := s.request(api.SubjectHistory, []byte(id.String()), nil, &r)
	return r, err
}

// TestHistoryTellsADTRsLifeAndOutlivesTheScheduler: once a job has ended,
// each DTR's history runs from its submission to DONE, with its transfer's
// grant and worker; the DTR whose first download failed shows the error
// and the retry it waited for. A scheduler started again serves the same
// history, and an unknown DTR is refused as such. No DTR is stuck.
func TestHistoryTellsADTRsLifeAndOutlivesTheScheduler(t *testing.T) {
	s := start(t, testConfig())
	remote := filepath.Join(s.dir, "remote")
	var gets atomic.Int32
	store := httpstore.Handler(remote)
	web := httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/busy" && gets.Add(1) == 1 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		store.ServeHTTP(w, r)
	}))
	writeFile(t, filepath.Join(remote, "busy"), 5000, 1)
	src := filepath.Join(s.dir, "in", "plain")
	writeFile(t, src, 2000, 2)
	j := &job.Job{Inputs: []job.File{
		{Source: fileURL(src), Destination: fileURL(filepath.Join(s.dir, "out", "plain"))},
		{Source: web + "/busy", Destination: fileURL(filepath.Join(s.dir, "out", "busy"))},
	}}
	reply := s.submit(j)
	if ev := s.wait(reply.JobID, time.Minute); ev.Done != 2 {
		t.Fatalf("job ended with %d of 2 done", ev.Done)
	}
	plain, busy := reply.DTRs[0], reply.DTRs[1]

	histories := map[uuid.UUID]api.HistoryReply{}
	for _, id := range []uuid.UUID{plain, busy} {
		// The writer stores a step's events just after the step.
		var h api.HistoryReply
		deadline := time.Now().Add(20 * time.Second)
		for {
			var err error
			h, err = s.history(id)
			if err != nil {
				t.Fatalf("history of %s: %v", id, err)
			}
			if n := len(h.Events); n > 0 && h.Events[n-1].State == dtr.Done {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("history of %s does not end DONE 20 s after its job ended:\n%s", id, timeline(h))
			}
			time.Sleep(100 * time.Millisecond)
		}
		histories[id] = h
		if h.DTR != id || h.State != dtr.Done || h.Dropped != 0 {
			t.Fatalf("history of %s: %+v", id, h)
		}
		first := h.Events[0]
		if first.State != dtr.New || first.From != "" || first.Seq != 1 {
			t.Errorf("history of %s starts with %+v, want its submission in NEW, numbered 1", id, first)
		}
		var transferred bool
		for i, ev := range h.Events {
			if i > 0 && (ev.Seq <= h.Events[i-1].Seq || ev.Time.Before(h.Events[i-1].Time)) {
				t.Errorf("event %d out of order:\n%s", i, timeline(h))
			}
			if ev.From == dtr.Transferring.String() && ev.Ended != "" && ev.Worker != "" && ev.Bytes > 0 {
				transferred = true
			}
		}
		if !transferred {
			t.Errorf("history of %s has no transfer that ended with its worker and bytes:\n%s", id, timeline(h))
		}
	}
	var failed, retried bool
	for _, ev := range histories[busy].Events {
		if ev.Error != nil && strings.Contains(ev.Error.Text, "503") {
			failed = true
		}
		if ev.Hold == "retry_backoff" && !ev.Until.IsZero() {
			retried = true
		}
	}
	if !failed || !retried {
		t.Fatalf("the DTR whose first download failed: error %v, retry %v:\n%s", failed, retried, timeline(histories[busy]))
	}

	// The history is kept in NATS: a scheduler started again serves it.
	s.stopRole("scheduler")
	s.startRole("scheduler")
	again, err := s.history(busy)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(again.Events, histories[busy].Events, func(a, b api.HistoryEvent) bool { return a.Seq == b.Seq && a.State == b.State }) {
		t.Fatalf("after a restart:\n%s\nbefore:\n%s", timeline(again), timeline(histories[busy]))
	}
	if _, err := s.history(uuid.New()); err == nil || !strings.Contains(err.Error(), "unknown DTR") {
		t.Fatalf("history of an unknown DTR: %v", err)
	}
	if stuck := s.shares().Stuck; len(stuck) != 0 {
		t.Fatalf("stuck DTRs: %+v", stuck)
	}
}

// timeline prints a history for a failure message.
func timeline(h api.HistoryReply) string {
	var b strings.Builder
	for _, ev := range h.Events {
		fmt.Fprintf(&b, "%d %s %s -> %s hold=%s grant=%s ended=%s worker=%s bytes=%d err=%v\n",
			ev.Seq, ev.Time.Format("15:04:05.000"), ev.From, ev.State, ev.Hold, ev.Grant, ev.Ended, ev.Worker, ev.Bytes, ev.Error)
	}
	return b.String()
}
