package core

import (
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// The slot table has a row for every queue state, and the moves it names
// are moves pkg/dtr's state table allows.
func TestTheSlotTableCoversEveryQueueStateWithLegalMoves(t *testing.T) {
	cfg := DefaultConfig()
	for _, q := range dtr.QueueStates {
		t.Run(q.String(), func(t *testing.T) {
			k := classOf(q)
			if k == nil || k.limit == nil {
				t.Fatalf("no slot class, or no limit, for %s", q)
			}
			if got := k.limit(&cfg); got <= 0 {
				t.Errorf("limit %d", got)
			}
			if back, ok := queueOf(q.Active()); !ok || back != q {
				t.Errorf("queueOf(%s) = %s, %v", q.Active(), back, ok)
			}
			if k.CancelTo != 0 && !dtr.CanTransition(q, k.CancelTo) {
				t.Errorf("cancelTo %s is not a move from %s", k.CancelTo, q)
			}
			if q.Stage() == dtr.StagePost && k.CancelTo != 0 {
				t.Errorf("post-processing runs on when cancelled, but cancelTo is %s", k.CancelTo)
			}
			if q.Stage() != dtr.StagePost && k.CancelTo == 0 {
				t.Errorf("no cancelTo for a queue state before post-processing")
			}
			if !dtr.CanTransition(q.Active(), k.HungTo) {
				t.Errorf("hungTo %s is not a move from %s", k.HungTo, q.Active())
			}
			if k.Cancelling != 0 {
				if !dtr.CanTransition(q.Active(), k.Cancelling) || !dtr.CanTransition(k.Cancelling, k.HungTo) ||
					!dtr.CanTransition(k.Cancelling, q.Completed()) {
					t.Errorf("cancelling %s is not a move from %s, or leads nowhere", k.Cancelling, q.Active())
				}
				if back, ok := queueOf(k.Cancelling); !ok || back != q {
					t.Errorf("queueOf(%s) = %s, %v", k.Cancelling, back, ok)
				}
			}
		})
	}
	for _, s := range []dtr.State{dtr.New, dtr.CacheWait, dtr.Transferred, dtr.CacheProcessed, dtr.Done} {
		if _, ok := queueOf(s); ok || classOf(s) != nil || stageOf(s) != "" {
			t.Errorf("%s, which the scheduler handles itself, has a slot", s)
		}
	}
	if c := New(cfg); c.Limit(dtr.Transfer) != cfg.MaxDelivery || c.Limit(dtr.Resolve) != cfg.MaxProcessor {
		t.Errorf("Limit reads the wrong Config field")
	}
}
