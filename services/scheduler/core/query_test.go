package core

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestLongestNamesTheDTRsQueuedFirst(t *testing.T) {
	for _, tt := range []struct {
		name   string
		queued int
		n      int
		want   int
	}{
		// The first DTR runs on the one slot; the others wait.
		{"fewer waiting than asked", 4, 10, 3},
		{"more waiting than asked", 50, 5, 5},
		{"none asked", 5, 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxProcessor = 1
			cfg.MaxEmergency = 0
			h := newHarness(t, cfg)
			var ids []uuid.UUID
			for i := 0; i < tt.queued; i++ {
				d := newDTR(i, "/CN=a", dtr.Download)
				h.submit(d)
				h.tick(time.Millisecond)
				ids = append(ids, d.ID)
			}
			got := h.c.Longest(tt.n)
			if len(got) != tt.want {
				t.Fatalf("%d DTRs, want %d", len(got), tt.want)
			}
			for i := range got {
				if got[i] != ids[i+1] {
					t.Fatalf("place %d holds %s, want the %d-th submitted %s", i, got[i], i+2, ids[i+1])
				}
			}
		})
	}
}
