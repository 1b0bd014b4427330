package core

import (
	"sort"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// TestAFreedLinkPlaceGoesToTheShareOwedIt ends the transfers of a link
// limited to 2 one at a time: each freed place must go to the share that
// is furthest below its part, so both shares keep moving (before, the
// first share by name took every freed place: alice 30, bob 0).
func TestAFreedLinkPlaceGoesToTheShareOwedIt(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.MaxDelivery, cfg.MaxEmergency = 10, 0
	cfg.Optimizer = fixedOptimizer(2)
	h := newHarness(t, cfg)
	for i := 0; i < 30; i++ {
		h.submit(hostDTR(i, "alice", "one.example"), hostDTR(100+i, "bob", "one.example"))
	}
	h.runToTransfer()
	ended := map[string]int{}
	for step := 0; step < 30; step++ {
		var transfers []Grant
		for _, g := range h.running {
			if g.State == dtr.Transferring {
				transfers = append(transfers, g)
			}
		}
		if len(transfers) > 2 {
			t.Fatalf("step %d: %d transfers on a link limited to 2", step, len(transfers))
		}
		if len(transfers) == 0 {
			t.Fatalf("step %d: no transfer running", step)
		}
		// The oldest grant ends alone.
		sort.Slice(transfers, func(i, j int) bool { return transfers[i].DTR.Source < transfers[j].DTR.Source })
		g := transfers[0]
		if step%2 == 1 && len(transfers) > 1 {
			g = transfers[1]
		}
		ended[g.DTR.Owner.DN]++
		h.answer(g, nil)
		for i := 0; i < 3; i++ {
			for _, g := range h.tick(time.Second) {
				if g.Stage != dtr.StageDelivery {
					h.answer(g, nil)
				}
			}
		}
	}
	if ended["alice"] < 12 || ended["bob"] < 12 {
		t.Fatalf("transfers ended one at a time: %v; want each share to get about half of the link", ended)
	}
}
