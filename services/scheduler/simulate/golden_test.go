package simulate

import (
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
	"github.com/sluice-dtr/sluice/services/scheduler/fairshare"
)

// mixedWorkload is four VOs' files of many sizes and priorities, both
// directions, some owners without an FQAN, arriving over five minutes.
func mixedWorkload() []Arrival {
	var work []Arrival
	vos := []string{"atlas", "cms", "lhcb", "alice"}
	for i := 0; i < 1200; i++ {
		vo := vos[(i*7)%len(vos)]
		a := Arrival{At: time.Duration(i) * 250 * time.Millisecond, DN: "/CN=" + vo + "-user", FQAN: "/" + vo, Bytes: int64(50e6 + (i*7919)%900*1e6), Priority: 1 + (i*31)%100}
		if i%5 == 0 {
			a.Direction = dtr.Upload
		}
		if i%11 == 0 {
			a.FQAN = ""
		}
		work = append(work, a)
	}
	return work
}

// One shard decides exactly as the single scheduler did before shards
// existed: testdata holds what Run returned then, for two policies.
func TestOneShardGivesExactlyTodaysResult(t *testing.T) {
	cfg := core.DefaultConfig()
	cfg.SharePolicy = core.PolicyVOMSVO
	cfg.SharePriority = map[string]int{"atlas": 50, "cms": 30, "lhcb": 15}
	tests := []struct {
		policy string
		maker  core.PolicyMaker
	}{
		{"arc", nil},
		{"enstore", fairshare.NewEnstore(fairshare.EnstoreConfig{})},
	}
	for _, tt := range tests {
		t.Run(tt.policy, func(t *testing.T) {
			golden, err := os.ReadFile("testdata/mixed-" + tt.policy + ".json")
			if err != nil {
				t.Fatal(err)
			}
			c := cfg
			c.Policy = tt.maker
			opt := Options{Slots: 7, Overhead: time.Second}
			run, err := Run(c, mixedWorkload(), opt)
			if err != nil {
				t.Fatal(err)
			}
			sharded, err := RunSharded(c, mixedWorkload(), opt, Sharding{Shards: 1})
			if err != nil {
				t.Fatal(err)
			}
			for name, res := range map[string]Result{"Run": run, "RunSharded with 1 shard": sharded.Result} {
				got, err := json.MarshalIndent(res, "", " ")
				if err != nil {
					t.Fatal(err)
				}
				if string(got) != string(golden) {
					t.Errorf("%s's result differs from today's (testdata/mixed-%s.json)", name, tt.policy)
				}
			}
		})
	}
}
