package core

import (
	"fmt"
	"testing"
	"time"
)

// With more active shares than slots, each gets a slot in turn: the split
// had given the first n shares by priority then name one slot each and the
// others none on every tick, and the emergency slot always to the first
// idle one by priority: the last share never transferred.
func TestMoreSharesThanSlotsTakeTurns(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.MaxDelivery, cfg.MaxProcessor, cfg.MaxEmergency = 4, 50, 1
	s := newSim(t, cfg)
	for u := 1; u <= 6; u++ {
		s.submit(fmt.Sprintf("u%d", u), 500, 50)
	}
	s.run(30*time.Minute, time.Second)
	for u := 1; u <= 6; u++ {
		t.Logf("u%d: %s of transfer slot-time", u, s.slotTime[fmt.Sprintf("u%d", u)])
	}
	for u := 1; u <= 6; u++ {
		// 5 slots (4 and the emergency one) for 30 minutes among 6
		// equal shares: 25 minutes each.
		if got := s.slotTime[fmt.Sprintf("u%d", u)]; got < 20*time.Minute || got > 30*time.Minute {
			t.Errorf("share u%d (equal priority, work queued for 30 min) had %s of slot-time, want about 25m", u, got)
		}
	}
}
