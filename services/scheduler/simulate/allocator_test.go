package simulate

import (
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// load is a shard's renewal with shares in TRANSFER, each as
// name, priority, queued, running.
func load(shares ...core.ShareStats) *ShardLoad {
	for i := range shares {
		shares[i].State = dtr.Transfer
	}
	return &ShardLoad{Shares: shares}
}

func share(name string, priority, queued, running int) core.ShareStats {
	return core.ShareStats{Share: name, Priority: priority, Queued: queued, Running: running}
}

func TestAllocatorLeasesBudgetsByThePrioritiesOfTheSharesWithWork(t *testing.T) {
	tests := []struct {
		name  string
		slots int
		loads []*ShardLoad
		want  []int
	}{
		{"two shards split by their shares' priorities", 10,
			[]*ShardLoad{load(share("atlas", 60, 100, 0)), load(share("cms", 40, 100, 0))}, []int{6, 4}},
		{"a shard's budget is the sum of its shares' parts", 10,
			[]*ShardLoad{load(share("atlas", 50, 100, 0), share("lhcb", 20, 100, 0)), load(share("cms", 30, 100, 0))}, []int{7, 3}},
		{"no budget above the demand; the rest goes to the others", 10,
			[]*ShardLoad{load(share("atlas", 90, 2, 0)), load(share("cms", 10, 100, 0))}, []int{2, 8}},
		{"at least one slot for each share with work", 10,
			[]*ShardLoad{load(share("atlas", 99, 100, 0)), load(share("cms", 1, 100, 0), share("lhcb", 1, 100, 0))}, []int{8, 2}},
		{"slots no share can use are leased round the shards", 10,
			[]*ShardLoad{load(share("atlas", 50, 1, 0)), load(), load()}, []int{4, 3, 3}},
		{"a shard that stops renewing loses its budget", 10,
			[]*ShardLoad{load(share("atlas", 50, 100, 0)), nil}, []int{10, 0}},
		{"no slot is leased that another shard still holds", 10,
			[]*ShardLoad{load(share("atlas", 50, 100, 8)), load(share("cms", 50, 100, 2))}, []int{5, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewAllocator(map[dtr.State]int{dtr.Transfer: tt.slots}, len(tt.loads))
			budgets := a.Lease(time.Unix(0, 0), tt.loads)
			for k, want := range tt.want {
				if got := budgets[k][dtr.Transfer]; got != want {
					t.Errorf("shard %d: budget %d, want %d (all %v)", k, got, want, budgets)
				}
			}
		})
	}
}

// Budgets are whole slots, but the fractions go to the shard owed the most
// slot-time, so over many leases the shards' budgets split the slots by
// their exact parts: 60/40 of 7 slots is 4.2/2.8, not 4/3 for ever. Here
// every grant ends within its lease; a slot that moves to another shard
// waits a lease for the grant that holds it, so the budgets sum to a
// little less than 7.
func TestAllocatorBudgetsSplitByTheExactPartsOverLeases(t *testing.T) {
	a := NewAllocator(map[dtr.State]int{dtr.Transfer: 7}, 2)
	now := time.Unix(0, 0)
	budget := []int{0, 0}
	var held [2]int
	const leases = 1000
	for i := 0; i < leases; i++ {
		b := a.Lease(now, []*ShardLoad{load(share("atlas", 60, 100, budget[0])), load(share("cms", 40, 100, budget[1]))})
		budget = []int{b[0][dtr.Transfer], b[1][dtr.Transfer]}
		held[0] += budget[0]
		held[1] += budget[1]
		now = now.Add(time.Second)
	}
	if got := 100 * float64(held[0]) / float64(held[0]+held[1]); got < 59.5 || got > 60.5 {
		t.Errorf("atlas's budgets were %.2f%% of the slots leased, want 60 ± 0.5", got)
	}
	if got := float64(held[0]+held[1]) / leases; got < 6.7 {
		t.Errorf("the budgets averaged %.2f of 7 slots", got)
	}
}

// A shard that stops renewing loses its budget at the next lease, and the
// shards that renew share its slots; when it renews again it gets its part
// back.
func TestAShardThatStopsRenewingLosesItsBudget(t *testing.T) {
	a := NewAllocator(map[dtr.State]int{dtr.Transfer: 10}, 2)
	now := time.Unix(0, 0)
	steps := []struct {
		name  string
		loads []*ShardLoad
		want  []int
	}{
		{"both renew", []*ShardLoad{load(share("atlas", 50, 100, 0)), load(share("cms", 50, 100, 0))}, []int{5, 5}},
		{"shard 1 does not renew", []*ShardLoad{load(share("atlas", 50, 100, 5)), nil}, []int{10, 0}},
		{"shard 1 renews again", []*ShardLoad{load(share("atlas", 50, 100, 10)), load(share("cms", 50, 100, 0))}, []int{5, 0}},
		{"shard 0's grants above its budget ended", []*ShardLoad{load(share("atlas", 50, 100, 5)), load(share("cms", 50, 100, 0))}, []int{5, 5}},
	}
	for _, s := range steps {
		b := a.Lease(now, s.loads)
		for k, want := range s.want {
			if got := b[k][dtr.Transfer]; got != want {
				t.Errorf("%s: shard %d budget %d, want %d", s.name, k, got, want)
			}
		}
		now = now.Add(time.Second)
	}
}
