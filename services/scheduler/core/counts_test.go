package core

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestCountsFollowGrantsRetriesLeaseExpiriesAndEnds(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery, cfg.MaxProcessor, cfg.MaxEmergency = 1, 10, 0
	cfg.Lease = time.Minute
	cfg.RetryBase = time.Second
	cfg.MaxTransferTries = 2
	h := newHarness(t, cfg)
	ok, retried, lost := newDTR(1, "/CN=a", dtr.Download), newDTR(2, "/CN=a", dtr.Download), newDTR(3, "/CN=a", dtr.Download)
	h.submit(ok, retried, lost)
	failOnce := true
	for i := 0; i < 1000 && h.c.Len() > 0; i++ {
		for _, g := range h.tick(100 * time.Millisecond) {
			switch {
			case g.DTR.ID == lost.ID && g.State == dtr.Transferring:
				delete(h.running, g.ID) // its worker dies: only the lease ends it
			case g.DTR.ID == retried.ID && g.State == dtr.Transferring && failOnce:
				failOnce = false
				h.answer(g, &dtr.Failure{Kind: dtr.ErrTemporaryRemote, State: dtr.Transferring, Text: "503"})
			default:
				h.answer(g, nil)
			}
		}
		if i%100 == 99 {
			h.now = h.now.Add(time.Minute) // past every lease
		}
	}
	got := h.c.Counts()
	// One retry after a failure, one after the first lease expiry; the
	// second expiry spends the last attempt.
	if got.Retries != 2 || got.LeaseExpiries != 2 || got.Done != 2 || got.Failed != 1 || got.Cancelled != 0 {
		t.Fatalf("counts %+v: want 2 retries, 2 lease expiries, 2 done, 1 failed", got)
	}
	if got.Grants == 0 || got.EmergencyGrants != 0 {
		t.Fatalf("grants %d (emergency %d): want some, none on emergency slots", got.Grants, got.EmergencyGrants)
	}
}

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
