package core

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestLongestNamesTheDTRsQueuedFirst(t *testing.T) {
	for _, tt := range []struct {
		name   string
		queued int
		n      int
		want   int
	}{
		// The first DTR runs on the one slot; the others wait.
		{"fewer waiting than asked", 4, 10, 3},
		{"more waiting than asked", 50, 5, 5},
		{"none asked", 5, 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxProcessor = 1
			cfg.MaxEmergency = 0
			h := newHarness(t, cfg)
			var ids []uuid.UUID
			for i := 0; i < tt.queued; i++ {
				d := newDTR(i, "/CN=a", dtr.Download)
				h.submit(d)
				h.tick(time.Millisecond)
				ids = append(ids, d.ID)
			}
			got := h.c.Longest(tt.n)
			if len(got) != tt.want {
				t.Fatalf("%d DTRs, want %d", len(got), tt.want)
			}
			for i := range got {
				if got[i] != ids[i+1] {
					t.Fatalf("place %d holds %s, want the %d-th submitted %s", i, got[i], i+2, ids[i+1])
				}
			}
		})
	}
}

func TestRetryingListsAJobsDTRsWaitingForARetryWithTheirErrorAndWhen(t *testing.T) {
	cfg := DefaultConfig()
	cfg.RetryBase = time.Minute
	h := newHarness(t, cfg)
	failing, fine, other := newDTR(1, "x", ""), newDTR(2, "x", ""), newDTR(3, "x", "")
	failing.JobID, fine.JobID, other.JobID = "a", "a", "b"
	h.submit(failing, fine, other)
	for range 20 {
		for _, g := range h.tick(time.Second) {
			if g.State == dtr.Transferring && g.DTR.ID != fine.ID {
				h.answer(g, &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "GET got 503"})
				continue
			}
			h.answer(g, nil)
		}
	}
	got := h.c.Retrying("a")
	if len(got) != 1 || got[0].ID != failing.ID || got[0].Attempts != 1 || got[0].Error == nil ||
		got[0].Error.Text != "GET got 503" || got[0].NextProcess.Before(h.now) {
		t.Fatalf("job a retrying %+v, want only %s after 1 attempt with its error and a time to come", got, failing.ID)
	}
	if got := h.c.Retrying("c"); len(got) != 0 {
		t.Fatalf("job c retrying %+v, want none", got)
	}
	if _, ok := h.final[fine.ID]; !ok {
		t.Fatal("the DTR that did not fail is not done")
	}
}
