package core

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestSlotsAreSharedBetweenActiveShares(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.SharePriority = map[string]int{"a": 60, "b": 40}
	cfg.MaxDelivery = 5
	cfg.MaxEmergency = 1
	h := newHarness(t, cfg)
	for i := 0; i < 20; i++ {
		h.submit(newDTR(i, "a", ""), newDTR(i, "b", ""))
	}
	// Let everything reach the TRANSFER queue.
	for i := 0; i < 10; i++ {
		for _, g := range h.tick(time.Second) {
			if g.State != dtr.Transferring {
				h.answer(g, nil)
			}
		}
	}
	perShare := map[string]int{}
	for _, g := range h.running {
		if g.State == dtr.Transferring {
			perShare[g.DTR.Share]++
		}
	}
	if perShare["a"] != 3 || perShare["b"] != 2 {
		t.Fatalf("transferring per share = %v, want a:3 b:2", perShare)
	}
}

func TestEmergencySlotLetsAnIdleShareStart(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.MaxDelivery = 4
	cfg.MaxEmergency = 1
	h := newHarness(t, cfg)
	for i := 0; i < 10; i++ {
		h.submit(newDTR(i, "a", dtr.Download))
	}
	transfers := func() map[string]int {
		m := map[string]int{}
		for _, g := range h.running {
			if g.State == dtr.Transferring {
				m[g.DTR.Share]++
			}
		}
		return m
	}
	for i := 0; i < 10; i++ {
		for _, g := range h.tick(time.Second) {
			if g.State != dtr.Transferring {
				h.answer(g, nil)
			}
		}
	}
	if got := transfers(); got["a-download"] != 4 {
		t.Fatalf("a alone should fill all 4 slots, got %v", got)
	}
	// Uploads arrive while downloads hold every slot.
	h.submit(newDTR(1, "a", dtr.Upload), newDTR(2, "a", dtr.Upload))
	for i := 0; i < 5; i++ {
		for _, g := range h.tick(time.Second) {
			if g.State != dtr.Transferring {
				h.answer(g, nil)
			}
		}
	}
	got := transfers()
	if got["a-upload"] != 1 || got["a-download"] != 4 {
		t.Fatalf("after uploads arrive: %v, want 4 downloads and 1 upload on the emergency slot", got)
	}
	var emergency int
	for _, g := range h.running {
		if g.Emergency {
			emergency++
		}
	}
	if emergency != 1 {
		t.Fatalf("%d emergency grants, want 1", emergency)
	}
}

func TestGrantIDsAreTheDTRIDAndACounter(t *testing.T) {
	id := uuid.MustParse("6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42")
	if got := grantID(id, 12); got != id.String()+".12" {
		t.Fatalf("grantID = %q", got)
	}
}
