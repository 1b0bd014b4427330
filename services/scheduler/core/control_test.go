package core

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// toTransfer ticks until the given DTRs wait in TRANSFER or run in it,
// answering every other grant at once.
func toTransfer(h *harness) {
	for i := 0; i < 10; i++ {
		for _, g := range h.tick(time.Second) {
			if g.State != dtr.Transferring {
				h.answer(g, nil)
			}
		}
	}
}

func TestCancelJobCancelsEveryUnfinishedDTROfTheJob(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery = 2
	h := newHarness(t, cfg)
	var ours []*dtr.DTR
	for i := 0; i < 5; i++ {
		d := newDTR(i, "x", "")
		d.JobID = "job-a"
		ours = append(ours, d)
		h.submit(d)
	}
	other := newDTR(9, "y", "")
	other.JobID = "job-b"
	h.submit(other)
	toTransfer(h)
	n, err := h.c.CancelJob(h.now, "job-a", nil)
	if err != nil || n != 5 {
		t.Fatalf("CancelJob = %d, %v; want 5", n, err)
	}
	h.collect()
	h.drain()
	for _, d := range ours {
		if got := h.final[d.ID]; got.State != dtr.Cancelled {
			t.Fatalf("%s ended %s, want CANCELLED", d.ID, got.State)
		}
	}
	if got := h.final[other.ID]; got.State != dtr.Done {
		t.Fatalf("the other job's DTR ended %s", got.State)
	}
	if n, err := h.c.CancelJob(h.now, "job-a", nil); n != 0 || !errors.Is(err, ErrUnknownJob) {
		t.Fatalf("cancelling a finished job: %d, %v; want 0, ErrUnknownJob", n, err)
	}
	// A DTR of a cancelled job that arrives later is cancelled on arrival.
	late := newDTR(7, "x", "")
	late.JobID = "job-a"
	h.submit(late)
	h.drain()
	if got := h.final[late.ID]; got.State != dtr.Cancelled {
		t.Fatalf("a late DTR of the cancelled job ended %s", got.State)
	}
}

func TestSharePrioritiesChangeAtRuntime(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.MaxDelivery = 10
	cfg.Lease = time.Hour
	h := newHarness(t, cfg)
	for i := 0; i < 30; i++ {
		h.submit(newDTR(i, "a", ""), newDTR(i, "b", ""))
	}
	toTransfer(h)
	if err := h.c.SetSharePriorities(h.now, map[string]int{"a": 80, "b": 0}); err == nil {
		t.Fatal("a priority of 0 was accepted")
	}
	if err := h.c.SetSharePriorities(h.now, map[string]int{"a": 80, "b": 20}); err != nil {
		t.Fatal(err)
	}
	// The running transfers finish; their slots go by the new split.
	for i := 0; i < 3; i++ {
		for _, g := range h.running {
			if g.State == dtr.Transferring {
				h.answer(g, nil)
			}
		}
		for _, g := range h.tick(time.Second) {
			if g.State != dtr.Transferring {
				h.answer(g, nil)
			}
		}
	}
	per := map[string]int{}
	for _, g := range h.running {
		if g.State == dtr.Transferring {
			per[g.DTR.Share]++
		}
	}
	if per["a"] != 8 || per["b"] != 2 {
		t.Fatalf("transferring per share after the change: %v, want a:8 b:2", per)
	}
}

func TestExplainSaysWhyADTRWaits(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.MaxDelivery = 2
	cfg.MaxEmergency = 0
	cfg.Lease = time.Hour
	h := newHarness(t, cfg)
	var ds []*dtr.DTR
	for i := 0; i < 6; i++ {
		d := newDTR(i, "a", "")
		ds = append(ds, d)
		h.submit(d)
	}
	toTransfer(h)
	// Let a few transfers finish so that the core knows how long they take.
	for i := 0; i < 2; i++ {
		h.now = h.now.Add(20 * time.Second)
		for _, g := range h.running {
			if g.State == dtr.Transferring {
				h.answer(g, nil)
				break
			}
		}
		for _, g := range h.tick(time.Second) {
			if g.State != dtr.Transferring {
				h.answer(g, nil)
			}
		}
	}
	last := ds[5]
	w, err := h.c.Explain(h.now, last.ID)
	if err != nil {
		t.Fatal(err)
	}
	if w.State != dtr.Transfer || w.Share != "a" || w.Slots != 2 || w.Running != 2 || w.Position != w.Queued-1 {
		t.Fatalf("explanation %+v", w)
	}
	if !strings.Contains(w.Reason, "uses all its 2 of 2 slots") {
		t.Fatalf("reason %q", w.Reason)
	}
	if w.EstimatedStart.Before(h.now) || w.EstimatedStart.After(h.now.Add(time.Hour)) {
		t.Fatalf("estimated start %s, now %s", w.EstimatedStart, h.now)
	}
	for _, g := range h.running {
		if g.State == dtr.Transferring {
			if w, _ := h.c.Explain(h.now, g.DTR.ID); !strings.HasPrefix(w.Reason, "running in TRANSFERRING") {
				t.Fatalf("a running DTR's reason: %q", w.Reason)
			}
			break
		}
	}
	if _, err := h.c.Explain(h.now, uuid.New()); !errors.Is(err, ErrUnknownDTR) {
		t.Fatalf("unknown DTR: %v", err)
	}
}

func TestSetPriorityRefusesBadInputAndChangesNothing(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	d := newDTR(1, "x", "")
	h.submit(d)
	for _, p := range []int{0, 101, -5} {
		if err := h.c.SetPriority(h.now, d.ID, p); err == nil {
			t.Fatalf("priority %d accepted", p)
		}
	}
	if err := h.c.SetPriority(h.now, uuid.New(), 50); !errors.Is(err, ErrUnknownDTR) {
		t.Fatalf("unknown DTR: %v", err)
	}
	if got, _ := h.c.Get(d.ID); got.Priority != 25 {
		t.Fatalf("priority changed to %d", got.Priority)
	}
	if err := h.c.SetPriority(h.now, d.ID, 90); err != nil {
		t.Fatal(err)
	}
	if got, _ := h.c.Get(d.ID); got.Priority != 90 {
		t.Fatalf("priority %d, want 90", got.Priority)
	}
}

func TestCancellingAnUnknownJobLeavesNothingBehind(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	for i := range 1000 {
		if _, err := h.c.CancelJob(h.now, fmt.Sprintf("made-up-%d", i), nil); !errors.Is(err, ErrUnknownJob) {
			t.Fatalf("cancel of a made-up job: %v, want ErrUnknownJob", err)
		}
	}
	if n := len(h.c.cancelledJobs); n != 0 {
		t.Fatalf("%d made-up jobs remembered, want 0", n)
	}
	// A job cancelled for real is remembered for cancelledJobKept, then
	// forgotten.
	d := newDTR(1, "x", "")
	d.JobID = "real"
	h.submit(d)
	if _, err := h.c.CancelJob(h.now, "real", nil); err != nil {
		t.Fatal(err)
	}
	h.now = h.now.Add(cancelledJobKept + time.Minute)
	_, _ = h.c.CancelJob(h.now, "other", nil)
	if n := len(h.c.cancelledJobs); n != 0 {
		t.Fatalf("%d cancelled jobs remembered past cancelledJobKept, want 0", n)
	}
}

func TestOwnerUseCountsUnfinishedDTRsOfEachOwner(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery = 1
	h := newHarness(t, cfg)
	var first *dtr.DTR
	for i := range 3 {
		d := newDTR(i, "x", "")
		d.Owner.DN = "/CN=alice"
		if i == 0 {
			first = d
		}
		h.submit(d)
	}
	h.submit(newDTR(5, "y", ""))
	if u := h.c.Owner("/CN=alice"); u.DTRs != 3 || u.Bytes < 3*512 {
		t.Fatalf("alice's use: %+v, want 3 DTRs and at least %d bytes", u, 3*512)
	}
	if err := h.c.Cancel(h.now, first.ID); err != nil {
		t.Fatal(err)
	}
	h.collect()
	h.drain()
	if u := h.c.Owner("/CN=alice"); u.DTRs != 0 || u.Bytes != 0 {
		t.Fatalf("alice's use after all ended: %+v, want none", u)
	}
}

func TestCancellingAJobCancelsOnlyTheCallersDTRsOfIt(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	var alices, bobs []*dtr.DTR
	for i := range 3 {
		a, b := newDTR(i, "/CN=alice", ""), newDTR(i, "/CN=bob", "")
		a.JobID, b.JobID = "shared-id", "shared-id"
		alices, bobs = append(alices, a), append(bobs, b)
		h.submit(a, b)
	}
	bob := func(id dtr.Identity) bool { return id.DN == "/CN=bob" }
	if n, err := h.c.CancelJob(h.now, "shared-id", bob); err != nil || n != 3 {
		t.Fatalf("bob's cancel of the job: %d, %v; want his 3", n, err)
	}
	h.collect()
	for _, a := range alices {
		if d, ok := h.c.Get(a.ID); !ok || d.Cancel || d.State.Final() {
			t.Fatalf("alice's DTR %s was cancelled by bob's cancel", a.ID)
		}
	}
	// Bob's later DTRs of the job are cancelled as they come; alice's not.
	lateA, lateB := newDTR(7, "/CN=alice", ""), newDTR(7, "/CN=bob", "")
	lateA.JobID, lateB.JobID = "shared-id", "shared-id"
	h.submit(lateA, lateB)
	if d, _ := h.c.Get(lateA.ID); d.Cancel {
		t.Fatal("alice's later DTR of the job was cancelled")
	}
	if d, ok := h.c.Get(lateB.ID); ok && !d.Cancel && !d.State.Final() {
		t.Fatal("bob's later DTR of the job was not cancelled")
	}
	if _, err := h.c.CancelJob(h.now, "shared-id", func(dtr.Identity) bool { return false }); !errors.Is(err, ErrUnknownJob) {
		t.Fatalf("a cancel by someone owning none of the job: %v, want ErrUnknownJob", err)
	}
}
