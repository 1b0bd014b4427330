package core

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func newDTR(i int, dn string, dir dtr.Direction) *dtr.DTR {
	return &dtr.DTR{
		ID:          uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "%s-%s-%d", dn, dir, i)),
		Source:      fmt.Sprintf("http://src.example/%s/%d", dn, i),
		Destination: fmt.Sprintf("file:///data/%s/%d", dn, i),
		Owner:       dtr.Identity{DN: dn},
		Direction:   dir,
	}
}

// harness drives a core with a fake clock and records what it decided.
type harness struct {
	t     *testing.T
	c     *Core
	now   time.Time
	final map[uuid.UUID]dtr.DTR
	// running holds the grants handed out and not yet answered.
	running map[string]Grant
}

func newHarness(t *testing.T, cfg Config) *harness {
	return &harness{t: t, c: New(cfg), now: t0, final: map[uuid.UUID]dtr.DTR{}, running: map[string]Grant{}}
}

func (h *harness) submit(ds ...*dtr.DTR) {
	for _, d := range ds {
		if err := h.c.Submit(h.now, d); err != nil {
			h.t.Fatalf("submit %s: %v", d.ID, err)
		}
	}
}

// tick advances the clock, ticks the core and returns the new grants.
func (h *harness) tick(d time.Duration) []Grant {
	h.now = h.now.Add(d)
	h.c.Tick(h.now)
	return h.take().Grants
}

func (h *harness) take() Decisions {
	out := h.c.Take()
	for _, g := range out.Grants {
		h.running[g.ID] = g
	}
	for _, d := range out.Final {
		h.final[d.ID] = *d
	}
	return out
}

// answer returns a result for a running grant.
func (h *harness) answer(g Grant, f *dtr.Failure) {
	delete(h.running, g.ID)
	r := Result{DTR: g.DTR.ID, Grant: g.ID, Error: f, Size: 10, Bytes: 10, Checksum: "adler32:00000001"}
	if err := h.c.Result(h.now, r); err != nil {
		h.t.Fatalf("result for %s in %s: %v", g.ID, g.State, err)
	}
	h.take()
}

// drain answers every grant successfully until every DTR is final.
func (h *harness) drain() {
	for i := 0; i < 100000; i++ {
		h.tick(50 * time.Millisecond)
		if h.c.Len() == 0 {
			return
		}
		for _, g := range h.running {
			h.answer(g, nil)
		}
	}
	h.t.Fatal("drain did not finish")
}

func TestDTRGoesThroughEveryStageToDone(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	d := newDTR(1, "alice", dtr.Download)
	h.submit(d)
	var states []string
	for len(h.final) == 0 {
		gs := h.tick(time.Second)
		if len(gs) != 1 {
			t.Fatalf("got %d grants, want 1", len(gs))
		}
		states = append(states, gs[0].State.String()+"/"+string(gs[0].Stage))
		h.answer(gs[0], nil)
	}
	want := "[QUERYING_REPLICA/pre PRE_CLEANING/pre TRANSFERRING/delivery REGISTERING_REPLICA/post]"
	if fmt.Sprint(states) != want {
		t.Fatalf("stages = %v, want %s", states, want)
	}
	got := h.final[d.ID]
	if got.State != dtr.Done || got.Share != "_default-download" || got.Priority != 25 || got.Attempts != 1 {
		t.Fatalf("final DTR = %s share %s prio %d attempts %d", got.State, got.Share, got.Priority, got.Attempts)
	}
	if h.c.Len() != 0 {
		t.Fatalf("core still holds %d DTRs", h.c.Len())
	}
}

func TestErrorsAreRetriedOrEndTheDTR(t *testing.T) {
	tests := []struct {
		name      string
		kind      dtr.ErrorKind
		wantState dtr.State
		wantTries int
	}{
		{"a permanent error ends in ERROR at once", dtr.ErrPermanentRemote, dtr.Error, 1},
		{"a local file error is not retried", dtr.ErrLocalFile, dtr.Error, 1},
		{"a temporary error is retried up to maxtransfertries", dtr.ErrTemporaryRemote, dtr.Error, 3},
		{"a transfer speed error is retried", dtr.ErrTransferSpeed, dtr.Error, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxTransferTries = 3
			h := newHarness(t, cfg)
			d := newDTR(1, "alice", dtr.Download)
			h.submit(d)
			var delays []time.Duration
			lastEnd := time.Time{}
			for i := 0; len(h.final) == 0 && i < 1000; i++ {
				for _, g := range h.tick(time.Second) {
					if g.State == dtr.QueryingReplica && !lastEnd.IsZero() {
						delays = append(delays, h.now.Sub(lastEnd))
					}
					if g.State == dtr.Transferring {
						h.answer(g, &dtr.Failure{Kind: tt.kind, Text: "boom"})
						lastEnd = h.now
						continue
					}
					h.answer(g, nil)
				}
			}
			got := h.final[d.ID]
			if got.State != tt.wantState || got.Attempts != tt.wantTries {
				t.Fatalf("ended %s after %d attempts, want %s after %d", got.State, got.Attempts, tt.wantState, tt.wantTries)
			}
			if got.Error == nil || got.Error.Kind != tt.kind || got.Error.Text != "boom" || got.Error.State != dtr.Transferring {
				t.Fatalf("error = %+v, want kind %s raised in TRANSFERRING", got.Error, tt.kind)
			}
			// Retries wait 10·k² s after k attempts (plus the tick that
			// notices): 10 s, then 40 s.
			for k, dl := range delays {
				want := time.Duration((k+1)*(k+1)) * 10 * time.Second
				if dl < want || dl > want+2*time.Second {
					t.Fatalf("retry %d came after %s, want %s", k+1, dl, want)
				}
			}
		})
	}
}

func TestFailedTransferIsCleanedUpByPostProcessing(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	h.submit(newDTR(1, "alice", dtr.Download))
	var cleanup []bool
	for len(h.final) == 0 {
		for _, g := range h.tick(time.Second) {
			if g.State == dtr.RegisteringReplica {
				cleanup = append(cleanup, g.Cleanup)
			}
			if g.State == dtr.Transferring {
				h.answer(g, &dtr.Failure{Kind: dtr.ErrPermanentRemote, Text: "HTTP 404"})
			} else {
				h.answer(g, nil)
			}
		}
	}
	if fmt.Sprint(cleanup) != "[true]" {
		t.Fatalf("post-processing grants' cleanup flags = %v, want [true]", cleanup)
	}
}

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

func TestCancelledQueuedDTREndsCancelledAndFreesNothingItDidNotHold(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery = 1
	h := newHarness(t, cfg)
	a, b := newDTR(1, "x", ""), newDTR(2, "x", "")
	h.submit(a, b)
	for i := 0; i < 5; i++ {
		for _, g := range h.tick(time.Second) {
			if g.State != dtr.Transferring {
				h.answer(g, nil)
			}
		}
	}
	var running Grant
	for _, g := range h.running {
		running = g
	}
	queued := a
	if running.DTR.ID == a.ID {
		queued = b
	}
	if err := h.c.Cancel(h.now, queued.ID); err != nil {
		t.Fatal(err)
	}
	h.take()
	if got := h.final[queued.ID]; got.State != dtr.Cancelled {
		t.Fatalf("queued DTR after cancel: %s, want CANCELLED", got.State)
	}
	// Cancel the running one: its worker is told, and it ends CANCELLED
	// after post-processing cleaned up.
	if err := h.c.Cancel(h.now, running.DTR.ID); err != nil {
		t.Fatal(err)
	}
	if out := h.take(); len(out.CancelRunning) != 1 || out.CancelRunning[0].ID != running.ID {
		t.Fatalf("CancelRunning = %v, want the running grant", out.CancelRunning)
	}
	h.drain()
	if got := h.final[running.DTR.ID]; got.State != dtr.Cancelled {
		t.Fatalf("running DTR after cancel: %s, want CANCELLED", got.State)
	}
	if err := h.c.Cancel(h.now, uuid.New()); !errors.Is(err, ErrUnknownDTR) {
		t.Fatalf("cancel of an unknown DTR: %v, want ErrUnknownDTR", err)
	}
}

func TestExpiredLeaseFreesTheSlotAndTheDTRRunsAgain(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery = 1
	cfg.Lease = time.Minute
	cfg.RetryBase = time.Second
	h := newHarness(t, cfg)
	d := newDTR(1, "x", "")
	h.submit(d)
	var lost Grant
	for lost.ID == "" {
		for _, g := range h.tick(time.Second) {
			if g.State == dtr.Transferring {
				lost = g // the worker dies with it
				continue
			}
			h.answer(g, nil)
		}
	}
	delete(h.running, lost.ID)
	// Progress keeps the lease alive.
	for i := 0; i < 3; i++ {
		h.tick(30 * time.Second)
		if err := h.c.Progress(h.now, d.ID, lost.ID, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := h.c.Get(d.ID); got.State != dtr.Transferring {
		t.Fatalf("with progress the DTR should still be transferring, is %s", got.State)
	}
	h.tick(61 * time.Second)
	h.drain()
	got := h.final[d.ID]
	if got.State != dtr.Done || got.Attempts != 2 {
		t.Fatalf("after lease expiry: %s after %d attempts, want DONE after 2", got.State, got.Attempts)
	}
	if err := h.c.Result(h.now, Result{DTR: d.ID, Grant: lost.ID}); !errors.Is(err, ErrUnknownDTR) && !errors.Is(err, ErrStaleResult) {
		t.Fatalf("late result of the lost grant: %v, want it refused", err)
	}
}

func TestStaleResultIsRefusedAndChangesNothing(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	d := newDTR(1, "x", "")
	h.submit(d)
	g := h.tick(time.Second)[0]
	err := h.c.Result(h.now, Result{DTR: d.ID, Grant: g.ID + "x"})
	if !errors.Is(err, ErrStaleResult) {
		t.Fatalf("got %v, want ErrStaleResult", err)
	}
	if got, _ := h.c.Get(d.ID); got.State != dtr.QueryingReplica {
		t.Fatalf("state changed to %s", got.State)
	}
}

func TestStaleResultForAQueuedPackedDTRIsRefused(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxProcessor = 1
	h := newHarness(t, cfg)
	a, b := newDTR(1, "x", ""), newDTR(2, "x", "")
	h.submit(a, b)
	h.tick(time.Second) // one of them runs; the other waits, packed
	queued := a
	if _, running := h.c.active[a.ID]; running {
		queued = b
	}
	if h.c.dtrs[queued.ID].d != nil {
		t.Fatal("the waiting DTR is not packed; the test needs it packed")
	}
	// A worker that lost its lease before a restart reports late.
	err := h.c.Result(h.now, Result{DTR: queued.ID, Grant: queued.ID.String() + ".1"})
	if !errors.Is(err, ErrStaleResult) {
		t.Fatalf("got %v, want ErrStaleResult", err)
	}
	if got, _ := h.c.Get(queued.ID); got.State != dtr.QueryReplica {
		t.Fatalf("state changed to %s", got.State)
	}
}

func TestInvalidAndDuplicateDTRsAreRefused(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	bad := newDTR(1, "x", "")
	bad.Source = "gopher://old.example/file"
	if err := h.c.Submit(h.now, bad); err == nil {
		t.Fatal("accepted a DTR with an unknown scheme")
	}
	d := newDTR(2, "x", "")
	h.submit(d)
	if err := h.c.Submit(h.now, newDTR(2, "x", "")); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("duplicate submit: %v, want ErrDuplicate", err)
	}
	if h.c.Len() != 1 {
		t.Fatalf("core holds %d DTRs, want 1", h.c.Len())
	}
}

func TestRestoredCoreCarriesOn(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery = 2
	h := newHarness(t, cfg)
	saved := map[uuid.UUID]dtr.DTR{}
	for i := 0; i < 6; i++ {
		h.submit(newDTR(i, "x", ""))
	}
	for i := 0; i < 6; i++ {
		for _, g := range h.tick(time.Second) {
			if g.State != dtr.Transferring {
				h.answer(g, nil)
			}
		}
	}
	for _, d := range h.take().Changed {
		saved[d.ID] = *d
	}
	// Collect what a persister would hold: every change so far.
	h2 := newHarness(t, cfg)
	h2.now = h.now
	for _, d := range h.c.dtrs {
		cp := *h.c.peekEntry(d)
		if err := h2.c.Restore(h2.now, &cp); err != nil {
			t.Fatal(err)
		}
	}
	// The running transfers are still held: no new transfer may start.
	for _, g := range h2.tick(time.Second) {
		if g.State == dtr.Transferring {
			t.Fatalf("restored core granted a transfer while 2 are still held")
		}
	}
	// Their results are accepted by the restored core.
	for _, g := range h.running {
		if err := h2.c.Result(h2.now, Result{DTR: g.DTR.ID, Grant: g.ID}); err != nil {
			t.Fatalf("result after restore: %v", err)
		}
	}
	h2.take()
	h2.drain()
	if len(h2.final) != 6 {
		t.Fatalf("%d DTRs final after restore, want 6", len(h2.final))
	}
	for id, d := range h2.final {
		if d.State != dtr.Done {
			t.Fatalf("%s ended %s", id, d.State)
		}
	}
}

func TestLostPostProcessingIsTriedAgainNotTransferredAgain(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Lease = time.Minute
	cfg.RetryBase = time.Second
	h := newHarness(t, cfg)
	d := newDTR(1, "x", "")
	h.submit(d)
	var states []string
	lost := false
	for i := 0; len(h.final) == 0 && i < 1000; i++ {
		for _, g := range h.tick(time.Second) {
			states = append(states, g.State.String())
			if g.State == dtr.RegisteringReplica && !lost {
				lost = true // the worker's result never arrives
				delete(h.running, g.ID)
				if g.Cleanup {
					t.Fatal("a successful transfer's post-processing must not be a cleanup")
				}
				continue
			}
			if g.State == dtr.RegisteringReplica && g.Cleanup {
				t.Fatal("the second try of post-processing must finalise, not clean up")
			}
			h.answer(g, nil)
		}
	}
	want := "[QUERYING_REPLICA PRE_CLEANING TRANSFERRING REGISTERING_REPLICA REGISTERING_REPLICA]"
	if fmt.Sprint(states) != want {
		t.Fatalf("grants = %v, want %s", states, want)
	}
	if got := h.final[d.ID]; got.State != dtr.Done || got.Attempts != 2 || got.TransferGrant == "" {
		t.Fatalf("ended %s after %d attempts (transfer grant %q), want DONE after 2", got.State, got.Attempts, got.TransferGrant)
	}
}

func TestAFailedCleanupKeepsTheErrorThatCalledForIt(t *testing.T) {
	tests := []struct {
		name      string
		transfer  dtr.ErrorKind
		wantState dtr.State
		wantNext  string // the grant after the failed cleanup
	}{
		{"a temporary transfer error is retried from the start", dtr.ErrTemporaryRemote, dtr.Done, "QUERYING_REPLICA"},
		{"a permanent transfer error ends in ERROR", dtr.ErrPermanentRemote, dtr.Error, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.RetryBase = time.Second
			h := newHarness(t, cfg)
			d := newDTR(1, "x", "")
			h.submit(d)
			failedTransfer, failedCleanup := false, false
			next := ""
			for i := 0; len(h.final) == 0 && i < 1000; i++ {
				for _, g := range h.tick(time.Second) {
					switch {
					case g.State == dtr.Transferring && !failedTransfer:
						failedTransfer = true
						h.answer(g, &dtr.Failure{Kind: tt.transfer, Text: "transfer broke"})
					case g.State == dtr.RegisteringReplica && !failedCleanup:
						if !g.Cleanup {
							t.Fatal("post-processing after a failed transfer must be a cleanup")
						}
						failedCleanup = true
						h.answer(g, &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "DELETE got 503"})
					case g.State == dtr.RegisteringReplica && g.Cleanup:
						t.Fatal("a second cleanup was granted; the retry must start over")
					default:
						if failedCleanup && next == "" {
							next = g.State.String()
						}
						h.answer(g, nil)
					}
				}
			}
			got := h.final[d.ID]
			if got.State != tt.wantState || next != tt.wantNext {
				t.Fatalf("ended %s, next grant %q; want %s, %q", got.State, next, tt.wantState, tt.wantNext)
			}
			if tt.wantState == dtr.Error && (got.Error == nil || got.Error.Text != "transfer broke") {
				t.Fatalf("error %+v, want the transfer's", got.Error)
			}
		})
	}
}

// toFinaliseAgain runs a DTR whose every finalise fails until it waits to
// finalise again (a retry a minute on).
func (h *harness) toFinaliseAgain() *dtr.DTR {
	d := newDTR(1, "x", "")
	h.submit(d)
	for i := 0; i < 100; i++ {
		gs := h.tick(time.Second)
		if len(gs) == 0 {
			break
		}
		for _, g := range gs {
			if g.State == dtr.RegisteringReplica {
				h.answer(g, &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "rename failed"})
			} else {
				h.answer(g, nil)
			}
		}
	}
	return d
}

func TestCancelWhileWaitingToFinaliseAgainStillFinalises(t *testing.T) {
	cfg := DefaultConfig()
	cfg.RetryBase = time.Minute
	h := newHarness(t, cfg)
	d := h.toFinaliseAgain()
	if got, _ := h.c.Get(d.ID); got.State != dtr.CacheProcessed || got.NextProcess.IsZero() {
		t.Fatalf("DTR is %s, want waiting in CACHE_PROCESSED to finalise again", got.State)
	}
	// The file may be in place already: as post-processing, finalising goes
	// on after a cancel, and a DTR whose file is in place ends DONE.
	if err := h.c.Cancel(h.now, d.ID); err != nil {
		t.Fatal(err)
	}
	h.take()
	var g Grant
	for i := 0; i < 120 && g.ID == ""; i++ {
		for _, x := range h.tick(time.Second) {
			g = x
		}
	}
	if g.State != dtr.RegisteringReplica || g.Cleanup {
		t.Fatalf("grant after the delay: %+v, want finalising, not a cleanup", g)
	}
	h.answer(g, nil)
	if got := h.final[d.ID]; got.State != dtr.Done {
		t.Fatalf("ended %s, want DONE: the file was put in place", got.State)
	}
}

// TestAReturnedFinaliseOfACancelledDTRIsGrantedAsAFinaliseAgain: a DTR
// cancelled while it waits to finalise again still finalises (its file may
// be in place); a stopping worker that gives that grant back does not turn
// it into a cleanup.
func TestAReturnedFinaliseOfACancelledDTRIsGrantedAsAFinaliseAgain(t *testing.T) {
	cfg := DefaultConfig()
	cfg.RetryBase = time.Minute
	h := newHarness(t, cfg)
	d := h.toFinaliseAgain()
	if err := h.c.Cancel(h.now, d.ID); err != nil {
		t.Fatal(err)
	}
	h.take()
	next := func() Grant {
		for i := 0; i < 120; i++ {
			for _, x := range h.tick(time.Second) {
				return x
			}
		}
		t.Fatal("no grant")
		return Grant{}
	}
	g := next()
	if g.Cleanup {
		t.Fatal("precondition: the first refinalise is a finalise")
	}
	// Its worker stops and gives the grant back.
	delete(h.running, g.ID)
	if err := h.c.Result(h.now, Result{DTR: d.ID, Grant: g.ID, Returned: true}); err != nil {
		t.Fatal(err)
	}
	h.take()
	g = next()
	if g.State != dtr.RegisteringReplica || g.Cleanup {
		t.Fatalf("the returned refinalise comes back as %s cleanup=%v, want finalising again", g.State, g.Cleanup)
	}
}

func TestRestoreKeepsAPostProcessingGrantACleanup(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	d := newDTR(1, "x", "")
	h.submit(d)
	var cleanup Grant
	for cleanup.ID == "" {
		for _, g := range h.tick(time.Second) {
			if g.State == dtr.Transferring {
				h.answer(g, &dtr.Failure{Kind: dtr.ErrPermanentRemote, Text: "403"})
				continue
			}
			if g.State == dtr.RegisteringReplica {
				cleanup = g
				continue
			}
			h.answer(g, nil)
		}
	}
	saved, _ := h.c.Get(d.ID)
	h2 := newHarness(t, DefaultConfig())
	h2.now = h.now
	if err := h2.c.Restore(h2.now, &saved); err != nil {
		t.Fatal(err)
	}
	if err := h2.c.Result(h2.now, Result{DTR: d.ID, Grant: cleanup.ID}); err != nil {
		t.Fatal(err)
	}
	h2.take()
	if got := h2.final[d.ID]; got.State != dtr.Error {
		t.Fatalf("after restore a cleanup's success ended the DTR %s, want ERROR", got.State)
	}
}

func TestGrantIDsAreTheDTRIDAndACounter(t *testing.T) {
	id := uuid.MustParse("6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42")
	if got := grantID(id, 12); got != id.String()+".12" {
		t.Fatalf("grantID = %q", got)
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
