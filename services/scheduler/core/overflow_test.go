package core

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// The split's water-filling compares demand × (sum of weights) in int64.
// DIRAC scales its weights by 1e6 and byte-fair multiplies them by up to
// 1000·20 more, so with DIRAC groups of priority 1000 (DIRAC's usual
// JobShare), byte-fair on, and a few hundred thousand queued transfers the
// products overflow: the split hands one share more slots than exist (the
// others get none), or never ends; the weights are scaled down first.
//
// hugeWeights weighs the shares as those policies do (package fairshare
// checks the figures): 1e9 for DIRAC, times 1000 and the byte-fair
// correction, 20 for the shares that move 1 byte per slot-second and
// 334/1000 for /CN=fast, which moves 1000.
type hugeWeights struct{ ARC }

func (hugeWeights) Weigh(_ time.Time, _ dtr.State, shares []ShareDemand) {
	for i := range shares {
		shares[i].Weight = 20_000_000_000_000
		if shares[i].Name == "/CN=fast" {
			shares[i].Weight = 334_000_000_000
		}
	}
}

func hugelyWeighted(t *testing.T, queued map[string]int) (*Core, chan struct{}) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.Policy = func(env PolicyEnv) Policy { return hugeWeights{ARC{env}} }
	c := New(cfg)
	now := t0
	mk := func(i int, dn string) *dtr.DTR {
		return &dtr.DTR{ID: uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "%s-%d", dn, i)),
			Source: fmt.Sprintf("http://s.example/%d", i), Destination: fmt.Sprintf("file:///d/%s/%d", dn, i),
			Owner: dtr.Identity{DN: dn}, Share: dn, Priority: 50, State: dtr.Transfer, MaxAttempts: 10,
			Created: now, Updated: now}
	}
	for dn, n := range queued {
		for i := 0; i < n; i++ {
			if err := c.Restore(now, mk(i, dn)); err != nil {
				t.Fatal(err)
			}
		}
	}
	done := make(chan struct{})
	go func() { c.Tick(now.Add(time.Second)); close(done) }()
	return c, done
}

func TestHugeWeightsAndDemandsSplitNoMoreThanTheSlots(t *testing.T) {
	c, done := hugelyWeighted(t, map[string]int{"/CN=a": 300_000, "/CN=b": 1000, "/CN=fast": 10})
	<-done
	st := c.states[dtr.Transfer]
	slots, _ := c.split(st)
	sum := 0
	for i, ss := range st.order {
		t.Logf("%s weight %d demand %d slots %d running %d", ss.name, st.demand[i].Weight, st.demand[i].Demand, slots[i], ss.running)
		sum += slots[i]
	}
	if sum != c.Limit(dtr.Transfer) {
		t.Fatalf("the split hands out %d of %d slots", sum, c.Limit(dtr.Transfer))
	}
}

func TestHugeWeightsAndDemandsLetATickEnd(t *testing.T) {
	_, done := hugelyWeighted(t, map[string]int{"/CN=a": 300_000, "/CN=b": 300_000, "/CN=fast": 10})
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Tick has not returned after 20 s: the scheduling loop hangs")
	}
}
