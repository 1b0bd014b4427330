package core

import (
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// steadyLink drives a harness's transfers as workers on a link where each
// moves exactly rate bytes per second: each reports its bytes every 10 s
// from its start, and ends when its size is moved.
type steadyLink struct {
	h       *harness
	rate    float64
	size    int64
	started map[string]time.Time // by grant: when its transfer began
	last    map[string]time.Time // by grant: its last report
}

func newSteadyLink(h *harness, rate float64, size int64) *steadyLink {
	return &steadyLink{h: h, rate: rate, size: size, started: map[string]time.Time{}, last: map[string]time.Time{}}
}

// step advances a second: new transfers begin, others report or end.
func (w *steadyLink) step() {
	h := w.h
	for _, g := range h.tick(time.Second) {
		if g.Stage != dtr.StageDelivery {
			h.answer(g, nil)
			continue
		}
		w.started[g.ID], w.last[g.ID] = h.now, h.now
	}
	for id, g := range h.running {
		if g.State != dtr.Transferring {
			continue
		}
		moved := int64(w.rate * h.now.Sub(w.started[id]).Seconds())
		switch {
		case moved >= w.size:
			delete(h.running, id)
			r := Result{DTR: g.DTR.ID, Grant: id, Size: w.size, Bytes: w.size, Checksum: "adler32:00000001"}
			if err := h.c.Result(h.now, r); err != nil {
				h.t.Fatal(err)
			}
			h.collect()
		case h.now.Sub(w.last[id]) >= 10*time.Second:
			w.last[id] = h.now
			if err := h.c.Progress(h.now, g.DTR.ID, id, moved); err != nil {
				h.t.Fatal(err)
			}
		}
	}
}

// recordingOptimizers makes Sluice's controllers and keeps them.
func recordingOptimizers(cfg *Config) *[]*LinkOptimizer {
	var made []*LinkOptimizer
	cfg.Optimizer = DefaultOptimizerConfig()
	cfg.Optimizer.Controller = func(o OptimizerConfig) LinkController {
		lo := NewLinkOptimizer(o)
		made = append(made, lo)
		return lo
	}
	return &made
}

// TestLinkUncongestedRateIsWhatATransferMoves runs transfers that each move
// exactly 10 MB/s, started at different times: the best rate per
// transfer the optimizer takes as the link's uncongested one must be
// 10 MB/s, not what a first report (all bytes since the transfer began)
// makes of one interval (it was 13.3 MB/s).
func TestLinkUncongestedRateIsWhatATransferMoves(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery, cfg.MaxEmergency = 12, 0
	made := recordingOptimizers(&cfg)
	h := newHarness(t, cfg)
	for i := 0; i < 200; i++ {
		h.submit(hostDTR(i, "alice", "one.example"))
	}
	w := newSteadyLink(h, 10e6, 253e6)
	for i := 0; i < 600; i++ {
		w.step()
		for _, lo := range *made {
			if lo.best > 10.5e6 {
				t.Fatalf("at %s the link's uncongested rate is %s, its transfers each move 10.0 MB/s", h.now.Sub(t0), rate(lo.best))
			}
		}
	}
	if len(*made) != 1 || (*made)[0].best < 9e6 {
		t.Fatalf("controllers %d, best %v: want one link that measured about 10 MB/s", len(*made), *made)
	}
}

// TestARestoredTransferCountsBytesFromItsRecord restores a core whose
// transfers moved hundreds of MB: their workers' first reports to the new
// core hold every byte since each began. Counted from 0 they made one
// interval's throughput absurd and cut the link to its minimum.
func TestARestoredTransferCountsBytesFromItsRecord(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery, cfg.MaxEmergency = 10, 0
	made := recordingOptimizers(&cfg)
	h := newHarness(t, cfg)
	for i := 0; i < 100; i++ {
		h.submit(hostDTR(i, "alice", "one.example"))
	}
	w := newSteadyLink(h, 10e6, 2e9)
	for i := 0; i < 95; i++ {
		w.step()
	}
	h2 := newHarness(t, cfg)
	h2.now = h.now
	for _, e := range h.c.dtrs {
		cp := *h.c.peekEntry(e)
		if err := h2.c.Restore(h2.now, &cp); err != nil {
			t.Fatal(err)
		}
	}
	for id, g := range h.running {
		h2.running[id] = g
	}
	w.h = h2
	*made = nil
	for i := 0; i < 120; i++ {
		w.step()
		for _, l := range h2.c.Links(false) {
			if l.Limit < cfg.Optimizer.Start {
				t.Fatalf("%s after the restore the link was cut to %d: %s", h2.now.Sub(h.now), l.Limit, l.Last.Reason)
			}
		}
		for _, lo := range *made {
			if lo.best > 10.5e6 {
				t.Fatalf("%s after the restore the link's uncongested rate is %s, its transfers each move 10.0 MB/s", h2.now.Sub(h.now), rate(lo.best))
			}
		}
	}
}

// TestADefaultLinkUsesEveryTransferSlotAtARCsSettings: with ARC's 10
// TRANSFER slots and every file on one link, the default start leaves no
// slot idle.
func TestADefaultLinkUsesEveryTransferSlotAtARCsSettings(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxEmergency = 0
	cfg.Optimizer = DefaultOptimizerConfig()
	if cfg.MaxDelivery != 10 {
		t.Fatalf("the default TRANSFER slots are %d, this test is of ARC's 10", cfg.MaxDelivery)
	}
	h := newHarness(t, cfg)
	for i := 0; i < 30; i++ {
		h.submit(hostDTR(i, "alice", "one.example"))
	}
	h.runToTransfer()
	if n := h.transfersBy("one.example"); n != 10 {
		t.Fatalf("%d transfers on the only link, want all 10 slots used", n)
	}
}

// TestALinkWithNoBytesReportedGrowsWhileDTRsWait runs empty files (no
// bytes ever moved) over one link with many slots: judged by the
// transfers it ends per second, its limit must grow past the start.
func TestALinkWithNoBytesReportedGrowsWhileDTRsWait(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxDelivery, cfg.MaxProcessor, cfg.MaxEmergency = 60, 120, 0
	cfg.Optimizer = DefaultOptimizerConfig()
	h := newHarness(t, cfg)
	for i := 0; i < 3000; i++ {
		h.submit(hostDTR(i, "alice", "one.example"))
	}
	granted := map[string]time.Time{}
	for i := 0; i < 120; i++ {
		for _, g := range h.tick(time.Second) {
			if g.Stage != dtr.StageDelivery {
				h.answer(g, nil)
			} else {
				granted[g.ID] = h.now
			}
		}
		// Each empty file takes 10 s to set up and close, moving 0 bytes.
		for id, g := range h.running {
			if g.State == dtr.Transferring && h.now.Sub(granted[id]) >= 10*time.Second {
				delete(h.running, id)
				if err := h.c.Result(h.now, Result{DTR: g.DTR.ID, Grant: id, Checksum: "adler32:00000001"}); err != nil {
					t.Fatal(err)
				}
				h.collect()
			}
		}
	}
	l := h.c.Links(true)
	if len(l) != 1 || l[0].Limit <= cfg.Optimizer.Start {
		t.Fatalf("links %+v: want the link's limit above its start %d", l, cfg.Optimizer.Start)
	}
}
