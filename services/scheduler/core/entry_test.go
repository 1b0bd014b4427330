package core

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestAResultFromAnotherStageThanItsGrantsIsRefusedAndChangesNothing(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	d := newDTR(1, "x", "")
	h.submit(d)
	g := h.tick(time.Second)[0]
	if g.Stage != dtr.StagePre {
		t.Fatalf("first grant of stage %s", g.Stage)
	}
	for _, stage := range []dtr.Stage{dtr.StageDelivery, dtr.StagePost} {
		err := h.c.Result(h.now, Result{DTR: d.ID, Grant: g.ID, Stage: stage, Error: &dtr.Failure{Kind: dtr.ErrPermanentRemote}})
		if !errors.Is(err, ErrStaleResult) {
			t.Fatalf("a %s result for a pre grant: %v, want ErrStaleResult", stage, err)
		}
	}
	if got, _ := h.c.Get(d.ID); got.State != dtr.QueryingReplica || got.Error != nil {
		t.Fatalf("the DTR changed: %s, %+v", got.State, got.Error)
	}
	// From its own stage (or a caller that does not say) it is taken.
	if err := h.c.Result(h.now, Result{DTR: d.ID, Grant: g.ID, Stage: dtr.StagePre}); err != nil {
		t.Fatal(err)
	}
}

// A worker that stops gives back the grants it holds: each DTR goes back to
// the queue it was granted from, its slot is free at once, no attempt is
// spent and no retry delay applies; the returned grant is no longer current.
func TestAReturnedGrantPutsTheDTRBackInItsQueueWithoutSpendingAnAttempt(t *testing.T) {
	for _, state := range []dtr.State{dtr.QueryingReplica, dtr.PreCleaning, dtr.Transferring, dtr.RegisteringReplica} {
		t.Run(state.String(), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxDelivery, cfg.MaxProcessor, cfg.MaxEmergency = 1, 1, 0
			cfg.RetryBase = time.Hour // a retry would not come back within the test
			h := newHarness(t, cfg)
			d := newDTR(1, "x", "")
			h.submit(d)
			var returned Grant
			for returned.ID == "" {
				gs := h.tick(time.Second)
				if len(gs) == 0 && len(h.running) == 0 {
					t.Fatalf("no grant in %s came", state)
				}
				for _, g := range gs {
					if g.State == state {
						returned = g
						continue
					}
					h.answer(g, nil)
				}
			}
			delete(h.running, returned.ID)
			if err := h.c.Result(h.now, Result{DTR: d.ID, Grant: returned.ID, Returned: true}); err != nil {
				t.Fatal(err)
			}
			out := h.collect()
			queue, _ := dtr.QueueOf(state)
			if len(out.Changed) != 1 || out.Changed[0].State != queue || len(out.Grants) != 0 {
				t.Fatalf("after the return: changed %v, grants %v; want the DTR back in %s", out.Changed, out.Grants, queue)
			}
			if err := h.c.Result(h.now, Result{DTR: d.ID, Grant: returned.ID}); !errors.Is(err, ErrStaleResult) {
				t.Fatalf("a result of the returned grant: %v, want it refused as stale", err)
			}
			// The next tick grants it again, under a new grant id.
			again := h.tick(time.Second)
			if len(again) != 1 || again[0].State != state || again[0].ID == returned.ID {
				t.Fatalf("after the return the next grants are %v, want one new grant in %s", again, state)
			}
			h.drain()
			if f := h.final[d.ID]; f.State != dtr.Done || f.Attempts != 1 {
				t.Fatalf("ended %s after %d attempts, want DONE after 1", f.State, f.Attempts)
			}
		})
	}
}

// The size delivery holds a source to is the one the latest QUERY_REPLICA
// found: neither an earlier query's nor what a failed transfer moved.
func TestATransferExpectsTheSizeOfTheLatestQueryOfItsSource(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxTransferTries = 3
	h := newHarness(t, cfg)
	d := newDTR(1, "alice", dtr.Download)
	h.submit(d)
	queried := []int64{1000, 0} // the second query finds no size
	var expected []int64        // d.Size in each transfer grant
	for i := 0; len(h.final) == 0 && i < 1000; i++ {
		for _, g := range h.tick(time.Second) {
			r := Result{DTR: g.DTR.ID, Grant: g.ID}
			switch g.State {
			case dtr.QueryingReplica:
				r.Size, queried = queried[0], queried[1:]
			case dtr.Transferring:
				expected = append(expected, g.DTR.Size)
				r.Bytes = 500
				if len(expected) == 1 {
					// As a deliverer before this change answered.
					r.Size = 500
					r.Error = &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "short body", Location: dtr.LocationSource}
				} else {
					r.Size, r.Checksum = 500, "adler32:00000001"
				}
			}
			delete(h.running, g.ID)
			if err := h.c.Result(h.now, r); err != nil {
				t.Fatal(err)
			}
			h.collect()
		}
	}
	if len(expected) != 2 || expected[0] != 1000 || expected[1] != 0 {
		t.Fatalf("transfers expected sizes %v, want [1000 0]", expected)
	}
	if got := h.final[d.ID]; got.State != dtr.Done || got.Size != 500 {
		t.Fatalf("final DTR %s with size %d, want DONE with the 500 bytes delivered", got.State, got.Size)
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
	h.collect()
	if got := h.final[queued.ID]; got.State != dtr.Cancelled {
		t.Fatalf("queued DTR after cancel: %s, want CANCELLED", got.State)
	}
	// Cancel the running one: its worker is told, and it ends CANCELLED
	// after post-processing cleaned up.
	if err := h.c.Cancel(h.now, running.DTR.ID); err != nil {
		t.Fatal(err)
	}
	if out := h.collect(); len(out.CancelRunning) != 1 || out.CancelRunning[0].ID != running.ID {
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
	for _, d := range h.collect().Changed {
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
	h2.collect()
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
	h2.collect()
	if got := h2.final[d.ID]; got.State != dtr.Error {
		t.Fatalf("after restore a cleanup's success ended the DTR %s, want ERROR", got.State)
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
	h.collect()
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
	h.collect()
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
	h.collect()
	g = next()
	if g.State != dtr.RegisteringReplica || g.Cleanup {
		t.Fatalf("the returned refinalise comes back as %s cleanup=%v, want finalising again", g.State, g.Cleanup)
	}
}

// An entry's post-processing phases go out from postAsRouted and back to
// it; any other move is a bug, and setPost panics on it.
func TestPostPhasesMoveOnlyAsTheTableSays(t *testing.T) {
	phases := []postPhase{postAsRouted, postFinaliseAgain, postFileInPlace, postCleanupLost}
	for _, from := range phases {
		for _, to := range phases {
			legal := from == postAsRouted && to != postAsRouted || from != postAsRouted && to == postAsRouted ||
				from == postFileInPlace && to == postFileInPlace
			e := &entry{post: from}
			panicked := func() (p bool) {
				defer func() { p = recover() != nil }()
				e.setPost(to)
				return false
			}()
			if panicked == legal {
				t.Errorf("%d → %d: panicked %v, want a legal move %v", from, to, panicked, legal)
			}
		}
	}
}

// A transfer's result says what that transfer checked: a third-party
// copy that could verify no checksum leaves neither an earlier attempt's
// checksum nor where it came from beside its checksum_unverified.
func TestATransferThatVerifiedNoChecksumLeavesNoneOfAnEarlierAttempt(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	d := newDTR(1, "alice", dtr.Download)
	g := h.transferGrant(d)
	h.c.dtrs[d.ID].d.Checksum, h.c.dtrs[d.ID].d.ChecksumSource = "adler32:00000001", dtr.ChecksumFromStream // an earlier attempt's
	r := Result{DTR: d.ID, Grant: g.ID, Size: 10, Bytes: 10, TransferMethod: dtr.TransferPull,
		ChecksumUnverified: "the destination storage gives no adler32 checksum and the job expects none"}
	if err := h.c.Result(h.now, r); err != nil {
		t.Fatal(err)
	}
	got, _ := h.c.Get(d.ID)
	if got.Checksum != "" || got.ChecksumSource != "" || got.ChecksumUnverified == "" {
		t.Fatalf("checksum %q from %q, unverified %q: want none, none, and the reason", got.Checksum, got.ChecksumSource, got.ChecksumUnverified)
	}
}

// A record put in place of the copy held (a standby replaying its
// journal) keeps a running grant's start and lease when it is the same
// grant holding the same slot (running, or being cancelled), and starts
// them again when it is not.
func TestARenewedRecordKeepsItsRunningGrantsStartOnlyIfTheGrantIsTheSame(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	d := newDTR(1, "x", "")
	h.submit(d)
	var g Grant
	for range 10 { // to its transfer
		gs := h.tick(time.Second)
		if len(gs) == 1 && gs[0].State == dtr.Transferring {
			g = gs[0]
			break
		}
		for _, g := range gs {
			h.answer(g, nil)
		}
	}
	if g.ID == "" {
		t.Fatal("no transfer granted")
	}
	running, _ := h.c.Get(d.ID)
	e := h.c.dtrs[d.ID]
	granted, lease := e.granted, e.lease
	later := h.now.Add(time.Minute)
	renew := func(d dtr.DTR) { // a copy: the core keeps what it is given
		t.Helper()
		if err := h.c.Renew(later, &d); err != nil {
			t.Fatal(err)
		}
	}
	renew(running)
	if e := h.c.dtrs[d.ID]; e.granted != granted || e.lease != lease {
		t.Fatalf("the same grant renewed a minute on: granted %d, lease %d; want %d, %d", e.granted, e.lease, granted, lease)
	}
	// The leader's record of its cancel (the transfer's slot held on):
	// the copy held still says TRANSFERRING.
	cancelled := running
	cancelled.State, cancelled.Cancel = dtr.TransferringCancel, true
	renew(cancelled)
	if h.c.active[d.ID] == nil {
		t.Fatal("a record of its cancel left it not running")
	}
	if e := h.c.dtrs[d.ID]; e.granted != granted {
		t.Fatalf("its grant being cancelled, renewed: granted %d, want %d", e.granted, granted)
	}
	other := running
	other.Grant = g.ID + "-another"
	renew(other)
	if e := h.c.dtrs[d.ID]; e.granted != h.c.nanos(later) {
		t.Fatalf("another grant renewed: granted %d, want %d (now)", e.granted, h.c.nanos(later))
	}
	queued := running
	queued.State, queued.Grant = dtr.QueryReplica, ""
	renew(queued)
	if _, ok := h.c.active[d.ID]; ok {
		t.Fatal("a record of the DTR queued left it running")
	}
}
