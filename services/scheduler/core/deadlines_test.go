package core

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestDeadlineForFollowsARCsTable(t *testing.T) {
	custom := DefaultConfig()
	custom.AgeAfter = 10 * time.Minute
	custom.AgeAfterState = map[dtr.State]time.Duration{dtr.Transfer: 30 * time.Minute}
	tests := []struct {
		name      string
		cfg       Config
		state     dtr.State
		cacheable bool
		want      time.Duration
	}{
		{"a DTR that is not cacheable has the hour in NEW", DefaultConfig(), dtr.New, false, time.Hour},
		{"a cacheable DTR has a day from NEW", DefaultConfig(), dtr.New, true, 24 * time.Hour},
		{"and while it waits for another's download", DefaultConfig(), dtr.CacheWait, true, 24 * time.Hour},
		{"and queued for its cache check", DefaultConfig(), dtr.CheckCache, true, 24 * time.Hour},
		{"and while it is checked", DefaultConfig(), dtr.CheckingCache, true, 24 * time.Hour},
		{"pre-processing has the hour", DefaultConfig(), dtr.QueryReplica, false, time.Hour},
		{"so has staging", DefaultConfig(), dtr.StagePrepare, false, time.Hour},
		{"TRANSFER has two hours", DefaultConfig(), dtr.Transfer, false, 2 * time.Hour},
		{"a running transfer counts as its queue", DefaultConfig(), dtr.Transferring, false, 2 * time.Hour},
		{"so does a cancelled one", DefaultConfig(), dtr.TransferringCancel, false, 2 * time.Hour},
		{"a cacheable DTR past its cache check has TRANSFER's", DefaultConfig(), dtr.Transfer, true, 2 * time.Hour},
		{"post-processing has the hour", DefaultConfig(), dtr.RegisterReplica, false, time.Hour},
		{"AgeAfter is every other state's", custom, dtr.QueryReplica, false, 10 * time.Minute},
		{"an entry overrides it", custom, dtr.Transfer, false, 30 * time.Minute},
		{"a table without CHECK_CACHE gives cacheable DTRs AgeAfter", custom, dtr.New, true, 10 * time.Minute},
		{"no table: AgeAfter everywhere", Config{AgeAfter: 3 * time.Minute}, dtr.Transfer, false, 3 * time.Minute},
		{"nothing set: DefaultConfig's hour", Config{}, dtr.Transfer, false, time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.cfg.DeadlineFor(tt.state, tt.cacheable); got != tt.want {
				t.Fatalf("DeadlineFor(%s, cacheable %v) = %s, want %s", tt.state, tt.cacheable, got, tt.want)
			}
		})
	}
	if got := DeadlineFor(dtr.Transfer, false); got != 2*time.Hour {
		t.Fatalf("package DeadlineFor(TRANSFER) = %s, want ARC's 2h", got)
	}
	// DefaultConfig's table is a copy: changing it changes no other.
	cfg := DefaultConfig()
	cfg.AgeAfterState[dtr.Transfer] = time.Minute
	if got := DeadlineFor(dtr.Transfer, false); got != 2*time.Hour {
		t.Fatalf("a change to one DefaultConfig's table reached ARC's: TRANSFER %s", got)
	}
}

// queueBehindBlocker fills the only slot of state with one DTR that never
// ends, then queues a high and a low priority DTR for it, and returns the
// low one and when it entered the state.
func queueBehindBlocker(t *testing.T, h *harness, state dtr.State) (*dtr.DTR, time.Time) {
	t.Helper()
	if err := h.c.SetLimit(state, 1); err != nil {
		t.Fatal(err)
	}
	blocker, high, low := newDTR(0, "x", ""), newDTR(1, "x", ""), newDTR(2, "x", "")
	high.UserPriority, low.UserPriority = 100, 2
	// advance answers every grant but those of state, until done says so.
	advance := func(done func() bool) time.Time {
		for i := 0; i < 1000; i++ {
			for _, g := range h.tick(time.Second) {
				if g.State != state.Active() {
					h.answer(g, nil)
				}
				if done() {
					return h.now
				}
			}
			if done() {
				return h.now
			}
		}
		t.Fatalf("never got there")
		return time.Time{}
	}
	in := func(d *dtr.DTR, s dtr.State) func() bool {
		return func() bool { got, _ := h.c.Get(d.ID); return got.State == s }
	}
	h.submit(blocker)
	advance(in(blocker, state.Active()))
	h.submit(high, low)
	entered := advance(in(low, state))
	if got, _ := h.c.Get(high.ID); got.State != state {
		t.Fatalf("the high priority DTR is in %s, want queued in %s", got.State, state)
	}
	return low, entered
}

func TestEachQueueAgesAfterItsOwnDeadline(t *testing.T) {
	for _, tt := range []struct {
		state dtr.State
		cache bool
		want  time.Duration
	}{
		{dtr.QueryReplica, false, time.Hour},
		{dtr.Transfer, false, 2 * time.Hour},
		{dtr.CheckCache, true, 24 * time.Hour},
	} {
		t.Run(tt.state.String(), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxProcessor, cfg.MaxDelivery = 100, 100
			cfg.Cache = tt.cache
			cfg.Lease = 100 * time.Hour
			h := newHarness(t, cfg)
			low, entered := queueBehindBlocker(t, h, tt.state)
			start, _ := h.c.Get(low.ID)
			for h.now.Before(entered.Add(tt.want - 20*time.Second)) {
				h.tick(10 * time.Second)
			}
			if got, _ := h.c.Get(low.ID); got.Priority != start.Priority {
				t.Fatalf("%s before its deadline (%s) the low DTR's priority is %d, want %d", h.now.Sub(entered), tt.want, got.Priority, start.Priority)
			}
			for h.now.Before(entered.Add(tt.want + 30*time.Second)) {
				h.tick(10 * time.Second)
			}
			if got, _ := h.c.Get(low.ID); got.Priority != start.Priority+1 || got.State != tt.state {
				t.Fatalf("just past its deadline (%s) the low DTR is %s at priority %d, want still queued at %d", tt.want, got.State, got.Priority, start.Priority+1)
			}
		})
	}
}

func TestARestoredDTRAgesFromWhenItEnteredItsState(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxProcessor = 1
	cfg.Lease = 100 * time.Hour
	h := newHarness(t, cfg)
	low, entered := queueBehindBlocker(t, h, dtr.QueryReplica)
	var records []dtr.DTR
	for _, d := range h.c.DTRs() {
		records = append(records, d)
	}
	// The scheduler restarts 50 minutes later.
	restart := entered.Add(50 * time.Minute)
	c := New(cfg)
	for i := range records {
		if err := c.Restore(restart, &records[i]); err != nil {
			t.Fatal(err)
		}
	}
	start, _ := c.Get(low.ID)
	now := restart
	for now.Before(entered.Add(time.Hour - 20*time.Second)) {
		now = now.Add(10 * time.Second)
		c.Tick(now)
	}
	if got, _ := c.Get(low.ID); got.Priority != start.Priority {
		t.Fatalf("before its hour the restored DTR's priority is %d, want %d", got.Priority, start.Priority)
	}
	for now.Before(entered.Add(time.Hour + 30*time.Second)) {
		now = now.Add(10 * time.Second)
		c.Tick(now)
	}
	if got, _ := c.Get(low.ID); got.Priority != start.Priority+1 {
		t.Fatalf("an hour after it was queued, 10 minutes after the restart, its priority is %d, want %d (it aged from the restart instead)", got.Priority, start.Priority+1)
	}
}

func TestParseAgeAfterStatesTakesQueueStatesAndRefusesTheRest(t *testing.T) {
	got, err := ParseAgeAfterStates(" transfer=30m, CHECK_CACHE=12h ")
	if err != nil || len(got) != 2 || got[dtr.Transfer] != 30*time.Minute || got[dtr.CheckCache] != 12*time.Hour {
		t.Fatalf("got %v, %v", got, err)
	}
	if got, err := ParseAgeAfterStates(""); err != nil || len(got) != 0 {
		t.Fatalf("empty: %v, %v", got, err)
	}
	for _, bad := range []struct{ in, want string }{
		{"TRANSFER", "want STATE=duration"},
		{"TRANSFERS=1h", `unknown DTR state "TRANSFERS"`},
		{"TRANSFERRING=1h", "TRANSFERRING is not a queue state (one of CHECK_CACHE"},
		{"TRANSFER=soon", `"soon" is not a positive duration`},
		{"TRANSFER=-1h", `"-1h" is not a positive duration`},
		{"TRANSFER=0s", `"0s" is not a positive duration`},
		{"TRANSFER=1h,TRANSFER=2h", "TRANSFER is given twice"},
	} {
		if _, err := ParseAgeAfterStates(bad.in); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: error %v, want one saying %q", bad.in, err, bad.want)
		}
	}
}

// waitBehindCacheDownload starts a DTR whose download into the cache never
// ends, then a second DTR for the same file, which waits in CACHE_WAIT; it
// returns both and when the second entered CACHE_WAIT.
func waitBehindCacheDownload(t *testing.T, h *harness, w *cacheWorker) (holder, waiter *dtr.DTR, entered time.Time) {
	t.Helper()
	holder = newDTR(1, "alice", dtr.Download)
	h.submit(holder)
	for i := 0; i < 100; i++ {
		for _, g := range h.tick(time.Second) {
			if g.State == dtr.Transferring {
				continue
			}
			if err := h.c.Result(h.now, w.resultFor(g)); err != nil {
				t.Fatal(err)
			}
			delete(h.running, g.ID)
		}
		h.collect()
	}
	if d, _ := h.c.Get(holder.ID); d.State != dtr.Transferring || d.Cache != dtr.CacheDownload {
		t.Fatalf("the first DTR is %s (cache %q), want TRANSFERRING into the cache", d.State, d.Cache)
	}
	waiter = newDTR(2, "bob", dtr.Download)
	waiter.Source = holder.Source
	h.submit(waiter)
	h.collect()
	if d, _ := h.c.Get(waiter.ID); d.State != dtr.CacheWait {
		t.Fatalf("the second DTR for the file is %s, want CACHE_WAIT", d.State)
	}
	return holder, waiter, h.now
}

// tickUntil ticks the harness every 5 s until at.
func (h *harness) tickUntil(at time.Time) {
	for h.now.Before(at) {
		h.tick(5 * time.Second)
	}
}

// checkSkippedCache checks that, past its timeout, the waiter was fetched
// by itself, not through the cache: one attempt, its own transfer, to its
// destination, while the download into the cache runs on.
func checkSkippedCache(t *testing.T, h *harness, w *cacheWorker, holder, waiter *dtr.DTR) {
	t.Helper()
	h.serve(w, 400, nil)
	got, ok := h.final[waiter.ID]
	if !ok {
		d, _ := h.c.Get(waiter.ID)
		t.Fatalf("past its timeout the waiter is %s, want DONE", d.State)
	}
	if got.State != dtr.Done || w.transfers[waiter.ID] != 1 || w.targets[waiter.ID] != waiter.Destination ||
		got.Cache != "" || !got.Options.NoCache || got.Attempts != 1 {
		t.Fatalf("the waiter ended %s after %d transfers to %s (cache %q, no_cache %v, %d attempts), want DONE after one transfer to its destination without the cache, in its first attempt",
			got.State, w.transfers[waiter.ID], w.targets[waiter.ID], got.Cache, got.Options.NoCache, got.Attempts)
	}
	if d, _ := h.c.Get(holder.ID); d.State != dtr.Transferring {
		t.Fatalf("the download into the cache is %s, want still running", d.State)
	}
}

// A DTR that waits for another's download of its file into the cache gives
// up after CacheWaitTimeout, as ARC's does after its day, and fetches the
// file itself without the cache, spending no attempt. The timeout is its
// own setting: CHECK_CACHE's ageing deadline (a day) does not change it.
func TestADTRWaitingForAnothersCacheDownloadPastItsTimeoutSkipsTheCache(t *testing.T) {
	cfg := cacheConfig()
	cfg.Lease = 100 * time.Hour
	cfg.CacheWaitTimeout = 3 * time.Hour
	h := newHarness(t, cfg)
	w := newCacheWorker()
	holder, waiter, entered := waitBehindCacheDownload(t, h, w)
	h.tickUntil(entered.Add(cfg.CacheWaitTimeout - 10*time.Second))
	if d, _ := h.c.Get(waiter.ID); d.State != dtr.CacheWait {
		t.Fatalf("before its timeout (%s) the waiter is %s, want still in CACHE_WAIT", cfg.CacheWaitTimeout, d.State)
	}
	checkSkippedCache(t, h, w, holder, waiter)
}

// A change of priority moves the record's Updated, not when the DTR
// entered CACHE_WAIT: its timeout does not start again.
func TestAPriorityChangeInCacheWaitDoesNotRestartItsTimeout(t *testing.T) {
	cfg := cacheConfig()
	cfg.Lease = 100 * time.Hour
	cfg.CacheWaitTimeout = 3 * time.Hour
	h := newHarness(t, cfg)
	w := newCacheWorker()
	holder, waiter, entered := waitBehindCacheDownload(t, h, w)
	h.tickUntil(entered.Add(time.Hour))
	if err := h.c.SetPriority(h.now, waiter.ID, 90); err != nil {
		t.Fatal(err)
	}
	h.tickUntil(entered.Add(cfg.CacheWaitTimeout - 10*time.Second))
	if d, _ := h.c.Get(waiter.ID); d.State != dtr.CacheWait || d.Priority != 90 {
		t.Fatalf("before its timeout the waiter is %s at priority %d, want still in CACHE_WAIT at 90", d.State, d.Priority)
	}
	checkSkippedCache(t, h, w, holder, waiter)
}

// A DTR restored in CACHE_WAIT after a restart keeps what it has waited:
// its timeout counts from when it entered CACHE_WAIT, even when its
// record was changed since (here its priority).
func TestADTRRestoredInCacheWaitKeepsItsTimeout(t *testing.T) {
	cfg := cacheConfig()
	cfg.Lease = 100 * time.Hour
	cfg.CacheWaitTimeout = 3 * time.Hour
	h := newHarness(t, cfg)
	w := newCacheWorker()
	holder, waiter, entered := waitBehindCacheDownload(t, h, w)
	h.tickUntil(entered.Add(time.Hour))
	if err := h.c.SetPriority(h.now, waiter.ID, 90); err != nil {
		t.Fatal(err)
	}
	h.tickUntil(entered.Add(2 * time.Hour))
	records := h.c.DTRs()
	h.c = New(cfg)
	for i := range records {
		if err := h.c.Restore(h.now, &records[i]); err != nil {
			t.Fatal(err)
		}
	}
	h.collect()
	if d, _ := h.c.Get(waiter.ID); d.State != dtr.CacheWait {
		t.Fatalf("restored, the waiter is %s, want CACHE_WAIT", d.State)
	}
	h.tickUntil(entered.Add(cfg.CacheWaitTimeout - 10*time.Second))
	if d, _ := h.c.Get(waiter.ID); d.State != dtr.CacheWait {
		t.Fatalf("before its timeout the restored waiter is %s, want still in CACHE_WAIT", d.State)
	}
	checkSkippedCache(t, h, w, holder, waiter)
}

// As in ARC, a DTR whose cache wait timed out goes from CACHE_PROCESSED
// straight to CACHE_CHECKED, not back through NEW.
func TestSkippingTheCacheGoesFromCacheProcessedToCacheChecked(t *testing.T) {
	c := New(cacheConfig())
	d := &dtr.DTR{ID: uuid.New(), State: dtr.CacheWait, Cache: dtr.CacheLocked, CacheFile: "file:///cache/x"}
	c.skipCache(t0, &entry{d: d, index: -1})
	if d.State != dtr.CacheChecked || d.Cache != "" || d.CacheFile != "" || !d.Options.NoCache {
		t.Fatalf("after skipping the cache the DTR is %s (cache %q, file %q, no_cache %v), want CACHE_CHECKED without the cache",
			d.State, d.Cache, d.CacheFile, d.Options.NoCache)
	}
}
