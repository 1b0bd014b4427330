package fairshare

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
	"github.com/sluice-dtr/sluice/services/scheduler/core/coretest"
)

func samCore(cfg SAMConfig) *SAM {
	c := core.DefaultConfig()
	c.SharePolicy = core.PolicyDN
	c.Policy = NewSAM(cfg)
	return core.New(c).Policy().(*SAM)
}

func TestSAMPutsANewDTRInFrontWhileItsGroupStaysWithinItsFraction(t *testing.T) {
	tests := []struct {
		name    string
		B       map[string]float64
		fracs   map[string]float64
		group   string
		benefit float64
		want    int
	}{
		{"within its fraction: front", map[string]float64{"cms": 50, "atlas": 50}, map[string]float64{"cms": 0.6, "atlas": 0.4}, "cms", 1, 2},
		{"beyond its fraction: back", map[string]float64{"cms": 50, "atlas": 50}, map[string]float64{"cms": 0.6, "atlas": 0.4}, "atlas", 1, 1},
		{"the DTR's own benefit counts", map[string]float64{"cms": 59, "atlas": 41}, map[string]float64{"cms": 0.6, "atlas": 0.4}, "cms", 10, 1},
		{"fractions are normalised", map[string]float64{"cms": 50, "atlas": 50}, map[string]float64{"cms": 3, "atlas": 2}, "cms", 1, 2},
		{"nothing received yet: a group with a fraction below 1 goes back", map[string]float64{}, map[string]float64{"cms": 0.6, "atlas": 0.4}, "cms", 1, 1},
		{"a group without a fraction always goes back", map[string]float64{}, map[string]float64{"cms": 0.6}, "lhcb", 1, 1},
		{"the default fraction stands for unlisted groups", map[string]float64{"cms": 90, core.DefaultShare: 10}, map[string]float64{"cms": 0.5, core.DefaultShare: 0.5}, "lhcb", 1, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := samCore(SAMConfig{Fractions: tt.fracs})
			for g, b := range tt.B {
				if g == core.DefaultShare {
					g = "lhcb"
				}
				p.B[g] += b
				p.total += b
			}
			if got := p.Front(tt.group, tt.benefit); got != tt.want {
				t.Fatalf("Front = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestSAMPriorityGroupsGoFirstInTheirOrder(t *testing.T) {
	p := samCore(SAMConfig{Priority: []string{"daq", "calib"}, Fractions: map[string]float64{"cms": 1}})
	prio := func(dn string) int { return p.Priority("sam", &dtr.DTR{Owner: dtr.Identity{DN: dn}}) }
	if !(prio("daq") > prio("calib") && prio("calib") > 2 && prio("cms") <= 2) {
		t.Fatalf("priorities daq %d, calib %d, cms %d: want daq > calib > every fair-share DTR (≤ 2)", prio("daq"), prio("calib"), prio("cms"))
	}
}

func samSim(t *testing.T, cfg SAMConfig) *coretest.Sim {
	c := core.DefaultConfig()
	c.SharePolicy = core.PolicyDN
	c.MaxDelivery, c.MaxProcessor, c.MaxEmergency = 2, 100, 0
	c.Lease = 24 * time.Hour
	c.Policy = NewSAM(cfg)
	s := coretest.NewSim(t, c)
	s.TransferTime = func(string, int) time.Duration { return time.Second }
	return s
}

func TestSAMPriorityGroupOvertakesTheFairShareQueue(t *testing.T) {
	s := samSim(t, SAMConfig{Priority: []string{"daq"}, Fractions: map[string]float64{"cms": 1}})
	s.Submit("cms", 50, 50)
	daq := map[uuid.UUID]bool{}
	for _, id := range s.Submit("daq", 5, 50) {
		daq[id] = true
	}
	s.Run(20*time.Second, 100*time.Millisecond)
	for i, id := range s.GrantsOrder[:5] {
		if !daq[id] {
			t.Fatalf("transfer grant %d went to a fair-share DTR; want the 5 priority-group DTRs first", i+1)
		}
	}
}

func TestSAMThroughputFollowsTheFractionsUnderSteadyArrivals(t *testing.T) {
	for _, unit := range []string{UnitFiles, UnitSlotSeconds} {
		t.Run(unit, func(t *testing.T) {
			s := samSim(t, SAMConfig{Fractions: map[string]float64{"cms": 0.75, "atlas": 0.25}, Unit: unit})
			group := map[uuid.UUID]string{}
			// 4 arrivals a second, 2 per group, for 2 slots of 1 s each:
			// saturated, and every arrival is placed against the benefit so far.
			for sec := 0; sec < 1200; sec++ {
				for _, g := range []string{"cms", "atlas"} {
					for _, id := range s.Submit(g, 2, 50) {
						group[id] = g
					}
				}
				s.Run(time.Second, 100*time.Millisecond)
			}
			done := map[string]int{}
			for id, d := range s.Final {
				if d.State == dtr.Done {
					done[group[id]]++
				}
			}
			share := 100 * float64(done["cms"]) / float64(done["cms"]+done["atlas"])
			t.Logf("%s: cms %.2f%% of %v", unit, share, done)
			if math.Abs(share-75) > 2 {
				t.Fatalf("cms got %.1f%% of the transfers (%v), want 75%% ± 2", share, done)
			}
		})
	}
}

func TestSAMConfigurationIsParsedOrRefusedClearly(t *testing.T) {
	cfg, err := ParseSAMGroups("daq=priority, calib=priority, cms=0.6, atlas=0.4")
	if err != nil || len(cfg.Priority) != 2 || cfg.Priority[0] != "daq" || cfg.Fractions["cms"] != 0.6 {
		t.Fatalf("config %+v, %v", cfg, err)
	}
	for _, bad := range []struct{ in, want string }{
		{"cms", "want group=fraction"},
		{"cms=-1", "not a positive number"},
		{"cms=lots", "not a positive number"},
		{"cms=NaN", "not a positive number"},
		{"cms=Inf", "not a positive number"},
		{"daq=priority", "no fair-share group"},
	} {
		if _, err := ParseSAMGroups(bad.in); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: error %v, want %q", bad.in, err, bad.want)
		}
	}
}
