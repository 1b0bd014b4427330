package core

import (
	"errors"
	"testing"
	"time"

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

func TestAShareNotInSharePriorityTakesTheDefaultSharesPriority(t *testing.T) {
	tests := []struct {
		name  string
		prios map[string]int
		vo    string
		dir   dtr.Direction
		share string
		want  int
	}{
		{"a configured share: 60 × 50 / 100", map[string]int{"atlas": 60}, "atlas", dtr.Download, "atlas-download", 30},
		{"a share not configured takes 50", map[string]int{"atlas": 60}, "lhcb", dtr.Download, "lhcb-download", 25},
		{"or the configured _default", map[string]int{"atlas": 60, DefaultShare: 20}, "lhcb", dtr.Download, "lhcb-download", 10},
		{"a sub-share may be configured on its own", map[string]int{"lhcb-upload": 90}, "lhcb", dtr.Upload, "lhcb-upload", 45},
		{"and its other direction then takes the default", map[string]int{"lhcb-upload": 90}, "lhcb", dtr.Download, "lhcb-download", 25},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.SharePolicy, cfg.SharePriority = PolicyVOMSVO, tt.prios
			h := newHarness(t, cfg)
			d := newDTR(1, "x", tt.dir)
			d.Owner.FQANs = []string{"/" + tt.vo}
			h.submit(d)
			got, _ := h.c.Get(d.ID)
			if got.Share != tt.share || got.Priority != tt.want {
				t.Fatalf("share %q at priority %d, want %q at %d", got.Share, got.Priority, tt.share, tt.want)
			}
		})
	}
}
