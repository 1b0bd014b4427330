package core

import (
	"testing"
	"time"

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

// A limit set on one state replaces its pool's limit there and nowhere
// else, holds back new grants while the state is at it, and can be taken
// back to the Config's.
func TestSetLimitReplacesOneStatesLimitUntilTakenBack(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery, cfg.MaxEmergency = 4, 0
	c := New(cfg)
	if err := c.SetLimit(dtr.Transferring, 2); err == nil {
		t.Fatalf("an active state took a limit")
	}
	tests := []struct {
		name string
		set  int
		want int
	}{
		{"a budget below the Config's", 2, 2},
		{"a budget of nothing", 0, 0},
		{"a budget above the Config's", 7, 7},
		{"taken back", -1, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := c.SetLimit(dtr.Transfer, tt.set); err != nil {
				t.Fatal(err)
			}
			if got := c.Limit(dtr.Transfer); got != tt.want {
				t.Errorf("Limit(TRANSFER) = %d, want %d", got, tt.want)
			}
			if got := c.Limit(dtr.PreClean); got != cfg.MaxProcessor {
				t.Errorf("Limit(PRE_CLEAN) = %d, want the Config's %d", got, cfg.MaxProcessor)
			}
		})
	}
	if err := c.SetLimit(dtr.Transfer, 2); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		d := queuedDTR(i, 1)
		if err := c.Restore(t0, d); err != nil {
			t.Fatal(err)
		}
	}
	c.Tick(t0)
	if n := len(c.Take().Grants); n != 2 {
		t.Fatalf("%d grants under a limit of 2", n)
	}
	if err := c.SetLimit(dtr.Transfer, 1); err != nil {
		t.Fatal(err)
	}
	c.Tick(t0.Add(time.Second))
	if n := len(c.Take().Grants); n != 0 {
		t.Fatalf("%d grants with 2 running above a lowered limit of 1", n)
	}
}
