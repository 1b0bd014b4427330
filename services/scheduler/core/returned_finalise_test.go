package core

import (
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// TestAReturnedFinaliseOfACancelledDTRIsGrantedAsAFinaliseAgain: a DTR
// cancelled while it waits to finalise again still finalises (its file may
// be in place); a stopping worker that gives that grant back does not turn
// it into a cleanup.
func TestAReturnedFinaliseOfACancelledDTRIsGrantedAsAFinaliseAgain(t *testing.T) {
	cfg := DefaultConfig()
	cfg.RetryBase = time.Minute
	h := newHarness(t, cfg)
	d := newDTR(1, "x", "")
	h.submit(d)
	for i := 0; i < 100; i++ {
		gs := h.tick(time.Second)
		if len(gs) == 0 {
			break
		}
		for _, g := range gs {
			if g.State == dtr.RegisteringReplica {
				h.answer(g, &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "rename failed"})
			} else {
				h.answer(g, nil)
			}
		}
	}
	if err := h.c.Cancel(h.now, d.ID); err != nil {
		t.Fatal(err)
	}
	h.take()
	next := func() Grant {
		for i := 0; i < 120; i++ {
			for _, x := range h.tick(time.Second) {
				return x
			}
		}
		t.Fatal("no grant")
		return Grant{}
	}
	g := next()
	if g.Cleanup {
		t.Fatal("precondition: the first refinalise is a finalise")
	}
	// Its worker stops and gives the grant back.
	delete(h.running, g.ID)
	if err := h.c.Result(h.now, Result{DTR: d.ID, Grant: g.ID, Returned: true}); err != nil {
		t.Fatal(err)
	}
	h.take()
	g = next()
	if g.State != dtr.RegisteringReplica || g.Cleanup {
		t.Fatalf("the returned refinalise comes back as %s cleanup=%v, want finalising again", g.State, g.Cleanup)
	}
}
