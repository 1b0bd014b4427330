package core

import (
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// loadCore is a core with DTRs of three priorities queued in two shares,
// some running, as a scheduler would hold them when it stopped; records
// are their stored records.
func loadCore(t *testing.T) (h *harness, records map[uuid.UUID]dtr.DTR) {
	cfg := DefaultConfig()
	cfg.MaxProcessor, cfg.MaxDelivery, cfg.MaxEmergency = 3, 2, 0
	h = newHarness(t, cfg)
	for i := range 60 {
		d := newDTR(i, []string{"/CN=a", "/CN=b"}[i%2], dtr.Download)
		d.UserPriority = []int{20, 50, 80}[i%3]
		h.submit(d)
		h.tick(time.Millisecond) // each comes at a time of its own
	}
	for range 3 {
		for _, g := range h.tick(time.Second) {
			if g.State != dtr.Transferring {
				h.answer(g, nil)
			}
		}
	}
	records = map[uuid.UUID]dtr.DTR{}
	for _, id := range h.ids() {
		d, _ := h.c.Get(id)
		records[id] = d
	}
	return h, records
}

// ids returns the DTRs the core holds.
func (h *harness) ids() []uuid.UUID { return slices.Collect(maps.Keys(h.c.dtrs)) }

// restoreFirst makes a core that restored what ix names of records and
// began to load the rest, with the original's grants outstanding.
func restoreFirst(t *testing.T, from *harness, records map[uuid.UUID]dtr.DTR, ix Index) *harness {
	p := newHarness(t, from.c.Config())
	p.now = from.now
	p.running = maps.Clone(from.running)
	restore := func(id uuid.UUID) {
		d := records[id]
		if err := p.c.Restore(p.now, &d); err != nil && !errors.Is(err, ErrDuplicate) {
			t.Fatalf("restore %s: %v", id, err)
		}
	}
	for _, q := range ix.Queues {
		for _, id := range q.Heads {
			restore(id)
		}
	}
	for _, id := range ix.Keep {
		restore(id)
	}
	p.c.BeginLoad(ix.Queues)
	p.c.Take()
	return p
}

// waitingOrder checks grants against the DTRs that waited when the core
// stopped: each granted DTR must rank before every one of its share still
// waiting in the same state (higher priority first, then first come).
type waitingOrder map[dtr.State]map[string][]dtr.DTR

func newWaitingOrder(records map[uuid.UUID]dtr.DTR) waitingOrder {
	w := waitingOrder{}
	for _, d := range records {
		if d.State.IsQueue() {
			if w[d.State] == nil {
				w[d.State] = map[string][]dtr.DTR{}
			}
			w[d.State][d.Share] = append(w[d.State][d.Share], d)
		}
	}
	return w
}

func (w waitingOrder) granted(t *testing.T, g Grant) {
	t.Helper()
	q, _ := queueOf(g.State)
	ds := w[q][g.DTR.Share]
	i := slices.IndexFunc(ds, func(d dtr.DTR) bool { return d.ID == g.DTR.ID })
	if i < 0 {
		return // it came to the queue after the stop
	}
	for _, o := range ds {
		if o.Priority > ds[i].Priority || o.Priority == ds[i].Priority && o.EnteredState().Before(ds[i].EnteredState()) {
			t.Fatalf("%s granted %s (priority %d) while %s (priority %d, waiting since %s) waits before it",
				g.State, g.DTR.ID, ds[i].Priority, o.ID, o.Priority, o.EnteredState().Format(time.StampMilli))
		}
	}
	w[q][g.DTR.Share] = slices.Delete(ds, i, i+1)
}

// loadWhileGranting loads the unread DTRs of records, one every few
// ticks, ending the load with the last, while it grants (each grant
// checked against order, and no state over its limit) and answers every
// grant, until every DTR has finished.
func (h *harness) loadWhileGranting(unread []uuid.UUID, records map[uuid.UUID]dtr.DTR, every int, order waitingOrder) {
	h.t.Helper()
	for step := 0; h.c.Len() > 0 || len(unread) > 0; step++ {
		if step > 10000 {
			h.t.Fatal("the DTRs never all finished")
		}
		if len(unread) > 0 && step%every == 0 {
			d := records[unread[0]]
			unread = unread[1:]
			if _, err := h.c.Load(h.now, &d); err != nil {
				h.t.Fatal(err)
			}
			if len(unread) == 0 {
				h.c.EndLoad()
			}
		}
		for _, g := range h.tick(100 * time.Millisecond) {
			order.granted(h.t, g)
		}
		for _, s := range dtr.QueueStates {
			if n, limit := h.c.states[s].total, h.c.Limit(s); n > limit {
				h.t.Fatalf("%d slots held in %s, limit %d", n, s, limit)
			}
		}
		for _, g := range h.running {
			h.answer(g, nil)
		}
	}
}

func TestALoadingCoreGrantsInQueueOrderAndWithinItsLimits(t *testing.T) {
	for _, k := range []int{0, 1, 3, 100} {
		h, records := loadCore(t)
		ix := h.c.Index(k)
		if len(ix.Keep) != len(h.c.active) {
			t.Fatalf("k=%d: the index keeps %d DTRs, %d hold a slot", k, len(ix.Keep), len(h.c.active))
		}
		p := restoreFirst(t, h, records, ix)
		order := newWaitingOrder(records)
		unread := slices.DeleteFunc(slices.Collect(maps.Keys(records)), func(id uuid.UUID) bool { return p.c.dtrs[id] != nil })
		rand.New(rand.NewPCG(uint64(k), 9)).Shuffle(len(unread), func(i, j int) { unread[i], unread[j] = unread[j], unread[i] })
		p.loadWhileGranting(unread, records, 3, order)
		if len(p.final) != len(records) {
			t.Fatalf("k=%d: %d of %d DTRs finished", k, len(p.final), len(records))
		}
	}
}

func TestALoadingCoreDoesNotLoadAgainADTRItLetGo(t *testing.T) {
	h, records := loadCore(t)
	p := restoreFirst(t, h, records, h.c.Index(2))
	var running Grant
	for _, g := range p.running {
		running = g
		break
	}
	for p.c.dtrs[running.DTR.ID] != nil {
		for _, g := range p.running {
			if g.DTR.ID == running.DTR.ID {
				p.answer(g, nil)
			}
		}
		p.tick(100 * time.Millisecond)
	}
	old := records[running.DTR.ID]
	if loaded, err := p.c.Load(p.now, &old); loaded || err != nil || p.c.dtrs[old.ID] != nil {
		t.Fatalf("a DTR finished while loading was loaded again from its older record (%v, %v)", loaded, err)
	}
	p.c.EndLoad()
	if p.c.gone != nil {
		t.Fatal("the core still remembers what it let go after the load ended")
	}
}

func TestALoadingCoreGrantsANewDTRThatOutranksTheFence(t *testing.T) {
	h, records := loadCore(t)
	p := restoreFirst(t, h, records, h.c.Index(1))
	for range 50 {
		for _, g := range p.running {
			p.answer(g, nil)
		}
		p.tick(time.Second)
	}
	if len(p.running) > 0 {
		t.Fatalf("%d grants given with every share at its fence", len(p.running))
	}
	// Every share waits at its fence now; a DTR of top priority does not.
	d := newDTR(1000, "/CN=a", dtr.Download)
	d.UserPriority = 100
	p.submit(d)
	var got bool
	for range 20 {
		for _, g := range p.tick(time.Second) {
			got = got || g.DTR.ID == d.ID
			p.answer(g, nil)
		}
	}
	if !got {
		t.Fatal("a DTR that outranks every DTR not yet loaded was not granted")
	}
}

func TestFirstOfAQueueIsItsItemsInOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 2, 17, 300} {
		q := &queue{}
		for i := range n {
			d := &dtr.DTR{Priority: 1 + r.IntN(5)}
			q.add(&entry{d: d, seq: uint64(i), stamp: r.Int64N(50)})
		}
		want := slices.Clone(q.items)
		slices.SortFunc(want, func(a, b *entry) int {
			if queueBefore(false, a, b) {
				return -1
			}
			return 1
		})
		for _, k := range []int{1, 5, n} {
			got := firstOf(q, k)
			if len(got) != min(k, n) {
				t.Fatalf("n=%d k=%d: %d items", n, k, len(got))
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("n=%d k=%d: item %d out of order", n, k, i)
				}
			}
		}
	}
}

// A core that stops while it loads (a crash) leaves an index that restores
// a core which grants in order too: its heads are the DTRs that pass each
// fence, and those not yet read count behind them.
func TestAnIndexTakenWhileLoadingRestoresACoreThatGrantsInOrder(t *testing.T) {
	h, records := loadCore(t)
	p := restoreFirst(t, h, records, h.c.Index(6))
	unread := slices.DeleteFunc(slices.Collect(maps.Keys(records)), func(id uuid.UUID) bool { return p.c.dtrs[id] != nil })
	slices.SortFunc(unread, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	for _, id := range unread[:len(unread)/2] {
		d := records[id]
		if _, err := p.c.Load(p.now, &d); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		p.tick(100 * time.Millisecond)
		for _, g := range p.running {
			if g.State != dtr.Transferring {
				p.answer(g, nil)
			}
		}
	}
	// What is stored when it stops: its records, the older ones of the
	// DTRs it never read.
	stored := maps.Clone(records)
	for id := range records {
		if _, held := p.c.dtrs[id]; !held {
			if _, gone := p.c.gone[id]; gone {
				delete(stored, id)
			}
		}
	}
	for id := range p.c.dtrs {
		d, _ := p.c.Get(id)
		stored[id] = d
	}
	ix := p.c.Index(4)
	q := restoreFirst(t, p, stored, ix)
	order := newWaitingOrder(stored)
	rest := slices.DeleteFunc(slices.Collect(maps.Keys(stored)), func(id uuid.UUID) bool { return q.c.dtrs[id] != nil })
	q.loadWhileGranting(rest, stored, 2, order)
	if len(q.final) != len(stored) {
		t.Fatalf("%d of %d DTRs finished", len(q.final), len(stored))
	}
}

// A DTR waiting for its retry (or for a download into the cache) is
// restored first: once its retry is due it takes its place in its queue
// ahead of lower priorities, as in the core that kept running, however
// much is still unread.
func TestADTRWaitingForItsRetryIsRestoredFirstAndTakesItsPlaceWhenItIsDue(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxProcessor, cfg.MaxDelivery, cfg.MaxEmergency = 1, 1, 0
	cfg.RetryBase = 10 * time.Second
	h := newHarness(t, cfg)
	d := newDTR(0, "/CN=a", dtr.Download)
	d.UserPriority = 90
	h.submit(d)
	for i := 0; ; i++ {
		if i > 200 {
			t.Fatal("D never waited for a retry")
		}
		for _, g := range h.tick(100 * time.Millisecond) {
			_ = g
		}
		for _, g := range h.running {
			if g.State == dtr.Transferring {
				h.answer(g, &dtr.Failure{Kind: dtr.ErrTemporaryRemote, State: dtr.Transferring, Text: "503"})
			} else {
				h.answer(g, nil)
			}
		}
		if e := h.c.dtrs[d.ID]; e != nil && h.c.delayed.Len() == 1 && h.c.delayed[0] == e {
			break
		}
	}
	// The slot-holder B, and low-priority DTRs queued behind it.
	var first dtr.State
	b := newDTR(1, "/CN=a", dtr.Download)
	b.UserPriority = 20
	h.submit(b)
	gs := h.tick(time.Millisecond)
	if len(gs) != 1 || gs[0].DTR.ID != b.ID {
		t.Fatalf("want B granted, got %v", gs)
	}
	first, _ = queueOf(gs[0].State)
	var lows []uuid.UUID
	for i := 2; i < 8; i++ {
		l := newDTR(i, "/CN=a", dtr.Download)
		l.UserPriority = 20
		h.submit(l)
		lows = append(lows, l.ID)
		h.tick(time.Millisecond)
	}
	records := map[uuid.UUID]dtr.DTR{}
	for _, id := range h.ids() {
		r, _ := h.c.Get(id)
		records[id] = r
	}
	ix := h.c.Index(2)
	p := restoreFirst(t, h, records, ix)
	if p.c.dtrs[d.ID] == nil {
		t.Fatal("a DTR waiting for its retry was not named by the index")
	}
	// The truth: the core that kept running.
	run := func(x *harness) Grant {
		for _, g := range maps.Clone(x.running) {
			if g.DTR.ID == b.ID {
				x.answer(g, nil)
			}
		}
		for i := 0; i < 400; i++ {
			for _, g := range x.tick(100 * time.Millisecond) {
				if q, _ := queueOf(g.State); q == first {
					return g
				}
			}
			for _, g := range maps.Clone(x.running) {
				x.answer(g, nil)
			}
		}
		t.Fatal("no grant")
		return Grant{}
	}
	// Let D's retry come due first in both.
	h.now = h.now.Add(15 * time.Second)
	p.now = p.now.Add(15 * time.Second)
	want := run(h)
	got := run(p)
	if want.DTR.ID != d.ID {
		t.Fatalf("the core that kept running granted %s, not the DTR whose retry came due", want.DTR.ID)
	}
	if got.DTR.ID != d.ID {
		dd := records[got.DTR.ID]
		t.Fatalf("loading core granted %s (priority %d) in %s while D (priority %d, retry due) waits unread", got.DTR.ID, dd.Priority, first, records[d.ID].Priority)
	}
}

// DTRs that came to a queue in one step share its time: their order is
// their ids' (tie), which a restart keeps, so a kept DTR (staged) with the
// fence's time passes it only if it ranked before the DTRs not yet read.
func TestDTRsThatCameInOneStepKeepTheirOrderAcrossARestartAtTheFence(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxProcessor, cfg.MaxDelivery, cfg.MaxEmergency = 2, 2, 0
	h := newHarness(t, cfg)
	mk := func(i int, staged bool) *dtr.DTR {
		d := newDTR(i, "/CN=a", dtr.Download)
		d.State, d.Share, d.Priority = dtr.Transfer, "/CN=a-download", 50
		d.Created, d.Updated, d.StateEntered = t0, t0, t0 // routed in one step
		d.Options.Stage = staged
		return d
	}
	H, U, P := mk(1, false), mk(2, false), mk(3, true)
	for _, d := range []*dtr.DTR{H, U, P} {
		if err := h.c.Restore(h.now, d); err != nil {
			t.Fatal(err)
		}
	}
	h.c.Take()
	records := map[uuid.UUID]dtr.DTR{}
	for _, id := range h.ids() {
		r, _ := h.c.Get(id)
		records[id] = r
	}
	ix := h.c.Index(1)
	p := restoreFirst(t, h, records, ix)
	want := h.tick(time.Second)
	got := p.tick(time.Second)
	name := map[uuid.UUID]string{H.ID: "H", U.ID: "U", P.ID: "P"}
	var w, g []string
	for _, x := range want {
		w = append(w, name[x.DTR.ID])
	}
	for _, x := range got {
		g = append(g, name[x.DTR.ID])
	}
	if len(w) != 2 {
		t.Fatalf("the stopped core granted %v, want two", w)
	}
	for _, x := range got {
		if x.DTR.ID == P.ID && p.c.dtrs[U.ID] == nil {
			t.Fatal("P granted while U, which ranked before it, waits unread")
		}
	}
}

// The index says where each DTR it names is stored, as the core was last
// told: a later record's place replaces an earlier one's, an older one
// (told late) does not, and a DTR never told of is at 0 (not known).
func TestTheIndexNamesWhereEachDTRsRecordIsStored(t *testing.T) {
	h, _ := loadCore(t)
	want := map[uuid.UUID]uint64{}
	for i, id := range h.ids() {
		if i%4 == 0 {
			continue // never told
		}
		seq := uint64(100 + i)
		h.c.Recorded(id, seq)
		h.c.Recorded(id, seq-50) // an older record's place, told late
		if i%2 == 0 {
			seq += 1000
			h.c.Recorded(id, seq) // stored again since
		}
		want[id] = seq
	}
	h.c.Recorded(uuid.New(), 7) // not held: nothing happens
	ix := h.c.Index(100)
	named := 0
	check := func(ids []uuid.UUID, at []uint64) {
		if len(at) != len(ids) {
			t.Fatalf("%d ids with %d places", len(ids), len(at))
		}
		for i, id := range ids {
			named++
			if at[i] != want[id] {
				t.Fatalf("DTR %s is at %d in the index, want %d", id, at[i], want[id])
			}
		}
	}
	check(ix.Keep, ix.KeepAt)
	for _, q := range ix.Queues {
		check(q.Heads, q.HeadsAt)
	}
	if named != len(h.ids()) {
		t.Fatalf("the index names %d of the %d DTRs", named, len(h.ids()))
	}
}

// A restart replays from the journal records of DTRs it restored first
// (the leader stores the index's DTRs again near the bucket's end, with
// the step the index follows): the last head of a fenced queue, restored
// again as it was, still passes its fence.
func TestTheLastHeadRestoredAgainWhileLoadingStillPassesItsFence(t *testing.T) {
	h, records := loadCore(t)
	ix := h.c.Index(2)
	p := restoreFirst(t, h, records, ix)
	fenced := 0
	for _, qi := range ix.Queues {
		if qi.Behind == 0 || len(qi.Heads) == 0 {
			continue
		}
		last := qi.Heads[len(qi.Heads)-1]
		d := records[last]
		p.c.Forget(last)
		if err := p.c.Restore(p.now, &d); err != nil {
			t.Fatal(err)
		}
		p.c.Take()
		e := p.c.dtrs[last]
		if e.share.fence == nil || !e.share.fence.passes(e) {
			t.Fatalf("the last head of %s in %s, restored again, does not pass its fence", qi.Share, qi.State)
		}
		fenced++
	}
	if fenced == 0 {
		t.Fatal("no fenced queue to try")
	}
}
