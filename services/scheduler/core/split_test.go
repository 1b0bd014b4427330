package core

import (
	"fmt"
	"testing"

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
			[]ShareDemand{{"a", 60, 100}, {"b", 40, 100}}, map[string]int{"a": 3, "b": 2}},
		{"seed example 20/80 on 10 slots", 10,
			[]ShareDemand{{"atlas:slow-prod", 20, 100}, {"atlas:validation", 80, 100}},
			map[string]int{"atlas:slow-prod": 2, "atlas:validation": 8}},
		{"names do not change the split", 10,
			[]ShareDemand{{"z", 20, 100}, {"a", 80, 100}}, map[string]int{"z": 2, "a": 8}},
		{"equal shares split evenly", 10,
			[]ShareDemand{{"a", 50, 100}, {"b", 50, 100}}, map[string]int{"a": 5, "b": 5}},
		{"a share never gets more than its demand; the rest is handed on", 10,
			[]ShareDemand{{"a", 50, 2}, {"b", 50, 100}}, map[string]int{"a": 2, "b": 8}},
		{"every active share gets at least one slot", 10,
			[]ShareDemand{{"big", 99, 100}, {"small", 1, 100}}, map[string]int{"big": 9, "small": 1}},
		{"shares without demand take no part", 4,
			[]ShareDemand{{"a", 50, 0}, {"b", 50, 10}}, map[string]int{"b": 4}},
		{"no more slots than the total demand", 10,
			[]ShareDemand{{"a", 50, 1}, {"b", 50, 2}}, map[string]int{"a": 1, "b": 2}},
		{"leftover goes to the largest remainder", 10,
			[]ShareDemand{{"a", 50, 100}, {"b", 30, 100}, {"c", 20, 100}}, map[string]int{"a": 5, "b": 3, "c": 2}},
		{"leftover tie goes to the higher priority then the name", 4,
			[]ShareDemand{{"b", 1, 100}, {"a", 1, 100}, {"c", 1, 100}}, map[string]int{"a": 2, "b": 1, "c": 1}},
		{"more shares than slots: the highest priorities get one each", 2,
			[]ShareDemand{{"low", 10, 5}, {"high", 90, 5}, {"mid", 50, 5}}, map[string]int{"high": 1, "mid": 1}},
		{"caps and minimums together stay within the slots", 4,
			[]ShareDemand{{"a", 50, 2}, {"b", 25, 10}, {"c", 1, 10}, {"d", 1, 10}},
			map[string]int{"a": 1, "b": 1, "c": 1, "d": 1}},
		{"zero slots give nothing", 0, []ShareDemand{{"a", 50, 3}}, map[string]int{}},
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
				shares = append(shares, ShareDemand{fmt.Sprintf("s%d", i), int64(1 + (seed*31+i*17)%100), d})
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
