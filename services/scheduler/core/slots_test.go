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
			if k.cancelTo != 0 && !dtr.CanTransition(q, k.cancelTo) {
				t.Errorf("cancelTo %s is not a move from %s", k.cancelTo, q)
			}
			if q.Stage() == dtr.StagePost && k.cancelTo != 0 {
				t.Errorf("post-processing runs on when cancelled, but cancelTo is %s", k.cancelTo)
			}
			if q.Stage() != dtr.StagePost && k.cancelTo == 0 {
				t.Errorf("no cancelTo for a queue state before post-processing")
			}
			if !dtr.CanTransition(q.Active(), k.hungTo) {
				t.Errorf("hungTo %s is not a move from %s", k.hungTo, q.Active())
			}
			if k.cancelling != 0 {
				if !dtr.CanTransition(q.Active(), k.cancelling) || !dtr.CanTransition(k.cancelling, k.hungTo) ||
					!dtr.CanTransition(k.cancelling, q.Completed()) {
					t.Errorf("cancelling %s is not a move from %s, or leads nowhere", k.cancelling, q.Active())
				}
				if back, ok := queueOf(k.cancelling); !ok || back != q {
					t.Errorf("queueOf(%s) = %s, %v", k.cancelling, back, ok)
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
