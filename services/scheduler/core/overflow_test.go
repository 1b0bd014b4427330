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
func diracByteFair(t *testing.T, queued map[string]int) (*Core, chan struct{}) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	groups := map[string]DIRACGroup{}
	for dn := range queued {
		groups[dn] = DIRACGroup{Priority: 1000, JobSharing: true}
	}
	cfg.Policy = ByteFair(NewDIRAC(DIRACConfig{Groups: groups}), time.Hour, 20)
	c := New(cfg)
	now := t0
	mk := func(i int, dn string) *dtr.DTR {
		return &dtr.DTR{ID: uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "%s-%d", dn, i)),
			Source: fmt.Sprintf("http://s.example/%d", i), Destination: fmt.Sprintf("file:///d/%s/%d", dn, i),
			Owner: dtr.Identity{DN: dn}, Share: dn, Priority: 50, State: dtr.Transfer, MaxAttempts: 10,
			Created: now, Updated: now}
	}
	for dn, n := range queued {
		// What Result charges after transfers ended: /CN=fast moves 1000
		// times the bytes per slot-second of the others.
		bytes := int64(1000)
		if dn == "/CN=fast" {
			bytes = 1_000_000
		}
		c.policy.Charge(now, dtr.Transfer, mk(-1, dn), 1000*time.Second, bytes)
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
	c, done := diracByteFair(t, map[string]int{"/CN=a": 300_000, "/CN=b": 1000, "/CN=fast": 10})
	<-done
	st := c.states[dtr.Transfer]
	slots, _ := c.shareSlots(st)
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
	_, done := diracByteFair(t, map[string]int{"/CN=a": 300_000, "/CN=b": 300_000, "/CN=fast": 10})
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Tick has not returned after 20 s: the scheduling loop hangs")
	}
}
