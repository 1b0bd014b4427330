package core

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// hostDTR is a download of a user from a storage host.
func hostDTR(i int, user, host string) *dtr.DTR {
	d := newDTR(i, user+"@"+host, dtr.Download)
	d.Owner.DN = user
	d.Source = fmt.Sprintf("https://%s/data/%d", host, i)
	return d
}

func (h *harness) transfersBy(host string) int {
	n := 0
	for _, g := range h.running {
		if g.State == dtr.Transferring && strings.Contains(g.DTR.Source, "//"+host+"/") {
			n++
		}
	}
	return n
}

// runToTransfer answers every pre-processing grant until the DTRs wait in
// or run in TRANSFER.
func (h *harness) runToTransfer() {
	for i := 0; i < 10; i++ {
		for _, g := range h.tick(time.Second) {
			if g.Stage == dtr.StagePre {
				h.answer(g, nil)
			}
		}
	}
}

func TestMaxPerHostKeepsASlowStorageFromHoldingEverySlot(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.MaxDelivery, cfg.MaxEmergency, cfg.MaxPerHost = 10, 0, 2
	h := newHarness(t, cfg)
	for i := 0; i < 20; i++ {
		h.submit(hostDTR(i, "alice", "slow.example:8443"), hostDTR(i, "bob", "fast.example"))
	}
	h.runToTransfer()
	if n := h.transfersBy("slow.example:8443"); n != 2 {
		t.Fatalf("%d transfers from the slow storage, want maxperhost = 2", n)
	}
	if n := h.transfersBy("fast.example"); n != 2 {
		t.Fatalf("%d transfers from the fast storage, want 2 as well", n)
	}
	var waiting *dtr.DTR
	for _, d := range h.c.DTRs() {
		if d.State == dtr.Transfer && strings.Contains(d.Source, "slow.example") {
			waiting = &d
			break
		}
	}
	w, err := h.c.Explain(h.now, waiting.ID)
	if err != nil || !strings.Contains(w.Reason, "storage endpoint slow.example:8443 already has 2 transfers running (max per host 2)") {
		t.Fatalf("why: %q, %v", w.Reason, err)
	}
	// One slow transfer ends: the next from that storage takes its place.
	for _, g := range h.running {
		if g.State == dtr.Transferring && strings.Contains(g.DTR.Source, "slow.example") {
			h.answer(g, nil)
			break
		}
	}
	h.tick(time.Second)
	if n := h.transfersBy("slow.example:8443"); n != 2 {
		t.Fatalf("%d transfers from the slow storage after one ended, want 2 again", n)
	}
}

func TestMaxPerHostLeavesNoSlotIdleWhileOtherStoragesHaveWork(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.MaxDelivery, cfg.MaxEmergency, cfg.MaxPerHost = 10, 0, 3
	h := newHarness(t, cfg)
	for i := 0; i < 20; i++ {
		// Alice's files are all on one storage; Bob's on four.
		h.submit(hostDTR(i, "alice", "tape.example"), hostDTR(i, "bob", fmt.Sprintf("disk%d.example", i%4)))
	}
	h.runToTransfer()
	busy := 0
	for _, g := range h.running {
		if g.State == dtr.Transferring {
			busy++
		}
	}
	if h.transfersBy("tape.example") != 3 || busy != 10 {
		t.Fatalf("alice %d transfers (want 3, her storage's limit), %d slots busy (want all 10: bob takes what alice cannot use)",
			h.transfersBy("tape.example"), busy)
	}
}

func TestRestoredCoreCountsTransfersPerHost(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxPerHost = 2
	h := newHarness(t, cfg)
	for i := 0; i < 5; i++ {
		h.submit(hostDTR(i, "alice", "slow.example"))
	}
	h.runToTransfer()
	h2 := newHarness(t, cfg)
	for _, e := range h.c.dtrs {
		cp := *h.c.peekEntry(e)
		if err := h2.c.Restore(h.now, &cp); err != nil {
			t.Fatal(err)
		}
	}
	if got := h2.tick(time.Second); len(got) != 0 {
		t.Fatalf("a restored core started %d more transfers from a storage at its limit", len(got))
	}
}
