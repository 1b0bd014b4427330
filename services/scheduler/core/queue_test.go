package core

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestHigherPriorityFirstAndFIFOAmongEquals(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxProcessor = 1
	h := newHarness(t, cfg)
	low1, high, low2 := newDTR(1, "x", ""), newDTR(2, "x", ""), newDTR(3, "x", "")
	low1.UserPriority, high.UserPriority, low2.UserPriority = 10, 90, 10
	h.submit(low1, high, low2)
	var order []uuid.UUID
	for len(order) < 3 {
		for _, g := range h.tick(time.Second) {
			if g.State == dtr.QueryingReplica {
				order = append(order, g.DTR.ID)
			}
			if g.State != dtr.Transferring {
				h.answer(g, nil)
			}
		}
	}
	if order[0] != high.ID || order[1] != low1.ID || order[2] != low2.ID {
		t.Fatalf("order = %v, want high, low1, low2", order)
	}
}

func TestWaitingDTRsAgeAfterTheirDeadline(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxProcessor = 1
	cfg.AgeAfter = time.Hour
	cfg.AgeEvery = 5 * time.Minute
	cfg.Lease = 24 * time.Hour
	h := newHarness(t, cfg)
	blocker, high, low := newDTR(0, "x", ""), newDTR(1, "x", ""), newDTR(2, "x", "")
	high.UserPriority, low.UserPriority = 100, 2
	h.submit(blocker)
	h.tick(time.Second) // blocker holds the only QUERY_REPLICA slot and never answers
	h.submit(high, low)
	for i := 0; i < 6*91; i++ { // 91 minutes in 10 s ticks
		h.tick(10 * time.Second)
	}
	got, _ := h.c.Get(low.ID)
	// Its own 1, then +1 at the deadline (60 min) and every 5 minutes after:
	// at 60, 65, ..., 90 minutes.
	if got.Priority != 1+7 {
		t.Fatalf("low DTR priority 31 min past its deadline = %d, want 8", got.Priority)
	}
	if hi, _ := h.c.Get(high.ID); hi.Priority != 50 {
		t.Fatalf("the queue head must not age: %d", hi.Priority)
	}
}
