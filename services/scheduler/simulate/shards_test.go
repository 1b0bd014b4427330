package simulate

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
	"github.com/sluice-dtr/sluice/services/scheduler/fairshare"
)

// The realised split of transfer slot-time between the shares, while
// every share has files waiting, is within 1 percentage point of the
// configured priorities when the shares are split between 2 or 4 shards,
// however they are assigned.
func TestTheSplitAtTwoAndFourShardsIsWithinOnePointOfTheConfiguredSplit(t *testing.T) {
	cfg, opt, err := ScaleConfig()
	if err != nil {
		t.Fatal(err)
	}
	opt.Slots = 100
	work := scaleWorkload(opt.Slots, 10*time.Minute)
	for _, by := range []ShardBy{ShardByLoad, ShardByHash} {
		for _, shards := range []int{2, 4} {
			t.Run(fmt.Sprintf("%d shards by %s", shards, by), func(t *testing.T) {
				res, err := RunSharded(cfg, work, opt, Sharding{Shards: shards, By: by})
				if err != nil {
					t.Fatal(err)
				}
				if len(res.Split) != len(scaleVOs) || res.Saturated < 9*time.Minute {
					t.Fatalf("split of %d shares over %s, want %d shares over most of 10 minutes", len(res.Split), res.Saturated, len(scaleVOs))
				}
				for _, s := range res.Split {
					if math.Abs(s.ErrorPP) > 1 {
						t.Errorf("%s (shard %d): realised %.2f%%, configured %.2f%%", s.Share, s.Shard, s.Realised, s.Configured)
					}
				}
				if res.Utilisation < 0.99 {
					t.Errorf("transfer slots %.3f busy while files waited", res.Utilisation)
				}
				var files int
				for _, g := range res.Groups {
					files += g.Files
				}
				if files != len(work) {
					t.Errorf("%d of %d files done", files, len(work))
				}
			})
		}
	}
}

// The shards together never run more transfers than the site's slots, but
// for one emergency slot each.
func TestShardsTogetherStayWithinTheSitesSlots(t *testing.T) {
	cfg, opt, err := ScaleConfig()
	if err != nil {
		t.Fatal(err)
	}
	opt.Slots, opt.Sample = 50, opt.Step
	res, err := RunSharded(cfg, scaleWorkload(opt.Slots, 5*time.Minute), opt, Sharding{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range res.Samples {
		n := 0
		for _, v := range s.Running {
			n += v
		}
		if n > opt.Slots+4*cfg.MaxEmergency {
			t.Fatalf("%d transfers at %s on %d slots", n, s.At, opt.Slots)
		}
	}
}

func TestSharesAreAssignedToShardsStablyAndInBalance(t *testing.T) {
	files := map[string]int{"atlas": 90, "cms": 80, "lhcb": 60, "alice": 55, "belle": 45, "dune": 40}
	tests := []struct {
		name string
		sh   Sharding
		want map[string]int
	}{
		{"by load, the heaviest share to the lightest shard", Sharding{Shards: 2, By: ShardByLoad},
			map[string]int{"atlas": 0, "cms": 1, "lhcb": 1, "alice": 0, "belle": 1, "dune": 0}}, // 185 files each
		{"by hash, FNV-1a of the name", Sharding{Shards: 2, By: ShardByHash},
			map[string]int{"atlas": 0, "cms": 0, "lhcb": 0, "alice": 1, "belle": 1, "dune": 1}},
		{"one shard holds every share", Sharding{Shards: 1, By: ShardByHash},
			map[string]int{"atlas": 0, "cms": 0, "lhcb": 0, "alice": 0, "belle": 0, "dune": 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := 0; i < 3; i++ { // the same every time
				got := assignShards(files, tt.sh)
				for name, want := range tt.want {
					if got[name] != want {
						t.Fatalf("%s to shard %d, want %d (all %v)", name, got[name], want, got)
					}
				}
			}
		})
	}
}

func TestRunShardedRefusesWhatItCannotDo(t *testing.T) {
	cfg, opt, err := ScaleConfig()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		opt  Options
		sh   Sharding
		want string
	}{
		{"an unknown assignment", opt, Sharding{Shards: 2, By: "random"}, `shard by "random"`},
		{"a run past its limit", Options{Slots: 1, Limit: time.Minute}, Sharding{Shards: 2}, "files done after 1m0s of virtual time"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := RunSharded(cfg, scaleWorkload(20, time.Minute), tt.opt, tt.sh)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
		})
	}
}

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
