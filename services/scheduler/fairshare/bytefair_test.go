package fairshare

import (
	"math"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
	"github.com/sluice-dtr/sluice/services/scheduler/core/coretest"
)

// TestByteFairSharesMoveEqualBytesWhateverTheirFileSizes runs two shares of
// equal priority, one of 10 MB files and one of 1 GB files, on 20 slots of
// 100 MB/s with 1 s overhead per transfer, and measures the bytes moved
// after a 10-minute warm-up.
func TestByteFairSharesMoveEqualBytesWhateverTheirFileSizes(t *testing.T) {
	tests := []struct {
		name      string
		byteFair  bool
		wantSmall float64 // the small files' part of the bytes, in %
		tolerance float64
	}{
		// Equal slots: 10 × 9 MB/s against 10 × 91 MB/s.
		{"slot-fair: the small files move a tenth of the bytes", false, 9.1, 1},
		// About 18.2 slots against 1.8.
		{"byte-fair: both move as many bytes", true, 50, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := core.DefaultConfig()
			cfg.SharePolicy = core.PolicyDN
			cfg.MaxDelivery, cfg.MaxProcessor, cfg.MaxEmergency, cfg.Lease = 20, 100, 0, 24*time.Hour
			if tt.byteFair {
				cfg.Policy = ByteFair(nil, 10*time.Minute, 20)
			}
			s := coretest.NewSim(t, cfg)
			size := map[string]int64{"small": 10e6, "large": 1e9}
			s.TransferTime = func(share string, _ int) time.Duration {
				return time.Second + time.Duration(size[share]/100e6*int64(time.Second)) + time.Duration(size[share]%100e6*10)
			}
			s.Bytes = func(share string) int64 { return size[share] }
			s.Submit("small", 40000, 50)
			s.Submit("large", 4000, 50)
			s.Run(10*time.Minute, 100*time.Millisecond)
			small, large := s.Moved["small"], s.Moved["large"]
			s.Run(30*time.Minute, 100*time.Millisecond)
			small, large = s.Moved["small"]-small, s.Moved["large"]-large
			part := 100 * float64(small) / float64(small+large)
			t.Logf("small files: %.1f%% of the bytes", part)
			if math.Abs(part-tt.wantSmall) > tt.tolerance {
				t.Fatalf("the small files moved %.1f%% of the bytes (%d against %d), want %.1f%% ± %.0f", part, small, large, tt.wantSmall, tt.tolerance)
			}
			if tt.byteFair && s.Core.Policy().Name() != "arc+bytes" {
				t.Fatalf("policy %q", s.Core.Policy().Name())
			}
		})
	}
}

// TestByteFairOverDIRACWeighsInTheTensOfTrillions gives the figures the
// core's split must take without overflowing (its hugeWeights): DIRAC
// groups of priority 1000 weigh 1e9, and byte-fair multiplies by 1000 and
// by its correction, the most (20) for the shares that move 1 byte per
// slot-second, 334/1000 for the one that moves 1000.
func TestByteFairOverDIRACWeighsInTheTensOfTrillions(t *testing.T) {
	groups := map[string]DIRACGroup{}
	for _, dn := range []string{"/CN=a", "/CN=b", "/CN=fast"} {
		groups[dn] = DIRACGroup{Priority: 1000, JobSharing: true}
	}
	p := ByteFair(NewDIRAC(DIRACConfig{Groups: groups}), time.Hour, 20)(core.PolicyEnv{
		ShareName: core.PolicyDN.ShareName, SharePriority: func(string) int { return 50 }})
	shares := []core.ShareDemand{{Name: "/CN=a", Demand: 300_000}, {Name: "/CN=b", Demand: 1000}, {Name: "/CN=fast", Demand: 10}}
	for _, s := range shares {
		bytes := int64(1000)
		if s.Name == "/CN=fast" {
			bytes = 1_000_000
		}
		d := &dtr.DTR{Owner: dtr.Identity{DN: s.Name}, Share: s.Name}
		p.Share(d)
		p.Charge(coretest.T0, dtr.Transfer, d, 1000*time.Second, bytes)
	}
	p.Weigh(coretest.T0, dtr.Transfer, shares)
	want := []int64{20_000_000_000_000, 20_000_000_000_000, 334_000_000_000}
	for i, s := range shares {
		if s.Weight != want[i] {
			t.Errorf("share %s weighs %d, want %d", s.Name, s.Weight, want[i])
		}
	}
}
