package core

import (
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// The size delivery holds a source to is the one the latest QUERY_REPLICA
// found: neither an earlier query's nor what a failed transfer moved.
func TestATransferExpectsTheSizeOfTheLatestQueryOfItsSource(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxTransferTries = 3
	h := newHarness(t, cfg)
	d := newDTR(1, "alice", dtr.Download)
	h.submit(d)
	queried := []int64{1000, 0} // the second query finds no size
	var expected []int64        // d.Size in each transfer grant
	for i := 0; len(h.final) == 0 && i < 1000; i++ {
		for _, g := range h.tick(time.Second) {
			r := Result{DTR: g.DTR.ID, Grant: g.ID}
			switch g.State {
			case dtr.QueryingReplica:
				r.Size, queried = queried[0], queried[1:]
			case dtr.Transferring:
				expected = append(expected, g.DTR.Size)
				r.Bytes = 500
				if len(expected) == 1 {
					// As a deliverer before this change answered.
					r.Size = 500
					r.Error = &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "short body", Location: dtr.LocationSource}
				} else {
					r.Size, r.Checksum = 500, "adler32:00000001"
				}
			}
			delete(h.running, g.ID)
			if err := h.c.Result(h.now, r); err != nil {
				t.Fatal(err)
			}
			h.take()
		}
	}
	if len(expected) != 2 || expected[0] != 1000 || expected[1] != 0 {
		t.Fatalf("transfers expected sizes %v, want [1000 0]", expected)
	}
	if got := h.final[d.ID]; got.State != dtr.Done || got.Size != 500 {
		t.Fatalf("final DTR %s with size %d, want DONE with the 500 bytes delivered", got.State, got.Size)
	}
}
