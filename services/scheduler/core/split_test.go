package core

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestSplitDividesSlotsInProportionToPriority(t *testing.T) {
	tests := []struct {
		name   string
		n      int
		shares []ShareDemand
		want   map[string]int
	}{
		{"seed example 60/40 on 5 slots", 5,
			[]ShareDemand{{Name: "a", Weight: 60, Demand: 100}, {Name: "b", Weight: 40, Demand: 100}}, map[string]int{"a": 3, "b": 2}},
		{"seed example 20/80 on 10 slots", 10,
			[]ShareDemand{{Name: "atlas:slow-prod", Weight: 20, Demand: 100}, {Name: "atlas:validation", Weight: 80, Demand: 100}},
			map[string]int{"atlas:slow-prod": 2, "atlas:validation": 8}},
		{"names do not change the split", 10,
			[]ShareDemand{{Name: "z", Weight: 20, Demand: 100}, {Name: "a", Weight: 80, Demand: 100}}, map[string]int{"z": 2, "a": 8}},
		{"equal shares split evenly", 10,
			[]ShareDemand{{Name: "a", Weight: 50, Demand: 100}, {Name: "b", Weight: 50, Demand: 100}}, map[string]int{"a": 5, "b": 5}},
		{"a share never gets more than its demand; the rest is handed on", 10,
			[]ShareDemand{{Name: "a", Weight: 50, Demand: 2}, {Name: "b", Weight: 50, Demand: 100}}, map[string]int{"a": 2, "b": 8}},
		{"every active share gets at least one slot", 10,
			[]ShareDemand{{Name: "big", Weight: 99, Demand: 100}, {Name: "small", Weight: 1, Demand: 100}}, map[string]int{"big": 9, "small": 1}},
		{"shares without demand take no part", 4,
			[]ShareDemand{{Name: "a", Weight: 50, Demand: 0}, {Name: "b", Weight: 50, Demand: 10}}, map[string]int{"b": 4}},
		{"no more slots than the total demand", 10,
			[]ShareDemand{{Name: "a", Weight: 50, Demand: 1}, {Name: "b", Weight: 50, Demand: 2}}, map[string]int{"a": 1, "b": 2}},
		{"leftover goes to the largest remainder", 10,
			[]ShareDemand{{Name: "a", Weight: 50, Demand: 100}, {Name: "b", Weight: 30, Demand: 100}, {Name: "c", Weight: 20, Demand: 100}}, map[string]int{"a": 5, "b": 3, "c": 2}},
		{"leftover tie goes to the higher priority then the name", 4,
			[]ShareDemand{{Name: "b", Weight: 1, Demand: 100}, {Name: "a", Weight: 1, Demand: 100}, {Name: "c", Weight: 1, Demand: 100}}, map[string]int{"a": 2, "b": 1, "c": 1}},
		{"more shares than slots: the highest priorities get one each", 2,
			[]ShareDemand{{Name: "low", Weight: 10, Demand: 5}, {Name: "high", Weight: 90, Demand: 5}, {Name: "mid", Weight: 50, Demand: 5}}, map[string]int{"high": 1, "mid": 1}},
		{"caps and minimums together stay within the slots", 4,
			[]ShareDemand{{Name: "a", Weight: 50, Demand: 2}, {Name: "b", Weight: 25, Demand: 10}, {Name: "c", Weight: 1, Demand: 10}, {Name: "d", Weight: 1, Demand: 10}},
			map[string]int{"a": 1, "b": 1, "c": 1, "d": 1}},
		{"zero slots give nothing", 0, []ShareDemand{{Name: "a", Weight: 50, Demand: 3}}, map[string]int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Split(tt.n, tt.shares)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("Split(%d, %v) = %v, want %v", tt.n, tt.shares, got, tt.want)
			}
		})
	}
}

// TestSplitInvariants checks, over many generated cases, that a split never
// hands out more than the slots or a share's demand, gives every active share
// a slot when there are enough, and uses every slot that can be used.
func TestSplitInvariants(t *testing.T) {
	for n := 1; n <= 12; n++ {
		for seed := 0; seed < 200; seed++ {
			var shares []ShareDemand
			k := 1 + seed%6
			total := 0
			for i := 0; i < k; i++ {
				d := (seed*7 + i*13) % 9
				shares = append(shares, ShareDemand{Name: fmt.Sprintf("s%d", i), Weight: int64(1 + (seed*31+i*17)%100), Demand: d})
				total += d
			}
			got := Split(n, shares)
			sum, active := 0, 0
			for _, s := range shares {
				if s.Demand > 0 {
					active++
				}
				if got[s.Name] > s.Demand {
					t.Fatalf("n=%d %v: share %s got %d > demand", n, shares, s.Name, got[s.Name])
				}
				if active <= n && s.Demand > 0 && got[s.Name] == 0 && activeCount(shares) <= n {
					t.Fatalf("n=%d %v: active share %s got no slot", n, shares, s.Name)
				}
				sum += got[s.Name]
			}
			if want := min(n, total); sum != want {
				t.Fatalf("n=%d %v: %v uses %d slots, want %d", n, shares, got, sum, want)
			}
		}
	}
}

func activeCount(shares []ShareDemand) int {
	n := 0
	for _, s := range shares {
		if s.Demand > 0 {
			n++
		}
	}
	return n
}

func TestDTRPriorityIsShareTimesUserOverHundred(t *testing.T) {
	tests := []struct {
		name        string
		share, user int
		want        int
	}{
		{"defaults give 25", 50, 0, 25},
		{"seed: user 80 in the default share gives 40", 50, 80, 40},
		{"seed: user 80 in atlas:validation (80) gives 64", 80, 80, 64},
		{"never below 1", 1, 1, 1},
		{"never above 100", 100, 100, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DTRPriority(tt.share, tt.user); got != tt.want {
				t.Fatalf("DTRPriority(%d, %d) = %d, want %d", tt.share, tt.user, got, tt.want)
			}
		})
	}
}

func TestSharePolicyNamesShares(t *testing.T) {
	id := dtr.Identity{DN: "/DC=org/CN=Alice", FQANs: []string{"/atlas/higgs/Role=production/Capability=NULL", "/atlas"}}
	bare := dtr.Identity{DN: "/CN=Bob", FQANs: []string{"/cms"}}
	tests := []struct {
		policy SharePolicy
		id     dtr.Identity
		want   string
	}{
		{PolicyNone, id, "_default"},
		{PolicyDN, id, "/DC=org/CN=Alice"},
		{PolicyDN, dtr.Identity{}, "_default"},
		{PolicyVOMSVO, id, "atlas"},
		{PolicyVOMSGroup, id, "atlas:higgs"},
		{PolicyVOMSGroup, bare, "cms:null"},
		{PolicyVOMSRole, id, "atlas:production"},
		{PolicyVOMSRole, bare, "cms:null"},
		{PolicyVOMSRole, dtr.Identity{DN: "/CN=x"}, "_default"},
	}
	for _, tt := range tests {
		t.Run(string(tt.policy)+"/"+tt.want, func(t *testing.T) {
			if got := tt.policy.ShareName(tt.id); got != tt.want {
				t.Fatalf("%q.ShareName(%v) = %q, want %q", tt.policy, tt.id, got, tt.want)
			}
		})
	}
	if _, err := ParseSharePolicy("voms:colour"); err == nil {
		t.Fatal("ParseSharePolicy accepted an unknown policy")
	}
}

func TestSplitServesTiersInOrderAndGuaranteesOwnedSlots(t *testing.T) {
	tests := []struct {
		name   string
		n      int
		shares []ShareDemand
		want   map[string]int
	}{
		{"a higher tier is served first, the rest split by weight", 10,
			[]ShareDemand{{Name: "admin", Weight: 1, Demand: 3, Tier: 1}, {Name: "a", Weight: 50, Demand: 100}, {Name: "b", Weight: 50, Demand: 100}},
			map[string]int{"admin": 3, "a": 4, "b": 3}},
		{"a higher tier with enough demand takes every slot", 10,
			[]ShareDemand{{Name: "admin", Weight: 1, Demand: 20, Tier: 1}, {Name: "a", Weight: 50, Demand: 100}},
			map[string]int{"admin": 10}},
		{"an owner gets its owned slots whatever its weight", 10,
			[]ShareDemand{{Name: "owner", Weight: 10, Demand: 100, Min: 6}, {Name: "other", Weight: 90, Demand: 100}},
			map[string]int{"owner": 6, "other": 4}},
		{"an idle owner's slots are borrowed", 10,
			[]ShareDemand{{Name: "owner", Weight: 10, Demand: 0, Min: 6}, {Name: "other", Weight: 90, Demand: 100}},
			map[string]int{"other": 10}},
		{"an owner with less work than it owns uses only what it needs", 10,
			[]ShareDemand{{Name: "owner", Weight: 10, Demand: 2, Min: 6}, {Name: "other", Weight: 90, Demand: 100}},
			map[string]int{"owner": 2, "other": 8}},
		{"an owner whose weight is worth more than it owns gets its weight", 10,
			[]ShareDemand{{Name: "owner", Weight: 90, Demand: 100, Min: 2}, {Name: "other", Weight: 10, Demand: 100}},
			map[string]int{"owner": 9, "other": 1}},
		{"owned slots that do not all fit go to owners by weight", 10,
			[]ShareDemand{{Name: "x", Weight: 10, Demand: 100, Min: 6}, {Name: "y", Weight: 20, Demand: 100, Min: 6}, {Name: "z", Weight: 50, Demand: 100}},
			map[string]int{"y": 6, "x": 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Split(tt.n, tt.shares)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("Split = %v, want %v", got, tt.want)
			}
		})
	}
}

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

func TestHugeWeightsAndDemands(t *testing.T) {
	t.Run("split no more than the slots", func(t *testing.T) {
		c, done := hugelyWeighted(t, map[string]int{"/CN=a": 300_000, "/CN=b": 1000, "/CN=fast": 10})
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
	})

	t.Run("let a tick end", func(t *testing.T) {
		_, done := hugelyWeighted(t, map[string]int{"/CN=a": 300_000, "/CN=b": 300_000, "/CN=fast": 10})
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatal("Tick has not returned after 20 s: the scheduling loop hangs")
		}
	})
}
