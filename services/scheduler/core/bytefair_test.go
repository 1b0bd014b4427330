package core

import (
	"math"
	"testing"
	"time"
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
			cfg := DefaultConfig()
			cfg.SharePolicy = PolicyDN
			cfg.MaxDelivery, cfg.MaxProcessor, cfg.MaxEmergency, cfg.Lease = 20, 100, 0, 24*time.Hour
			if tt.byteFair {
				cfg.Policy = ByteFair(nil, 10*time.Minute, 20)
			}
			s := newSim(t, cfg)
			size := map[string]int64{"small": 10e6, "large": 1e9}
			s.transferTime = func(share string, _ int) time.Duration {
				return time.Second + time.Duration(size[share]/100e6*int64(time.Second)) + time.Duration(size[share]%100e6*10)
			}
			s.bytes = func(share string) int64 { return size[share] }
			s.submit("small", 40000, 50)
			s.submit("large", 4000, 50)
			s.run(10*time.Minute, 100*time.Millisecond)
			small, large := s.moved["small"], s.moved["large"]
			s.run(30*time.Minute, 100*time.Millisecond)
			small, large = s.moved["small"]-small, s.moved["large"]-large
			part := 100 * float64(small) / float64(small+large)
			t.Logf("small files: %.1f%% of the bytes", part)
			if math.Abs(part-tt.wantSmall) > tt.tolerance {
				t.Fatalf("the small files moved %.1f%% of the bytes (%d against %d), want %.1f%% ± %.0f", part, small, large, tt.wantSmall, tt.tolerance)
			}
			if tt.byteFair && s.c.Policy().Name() != "arc+bytes" {
				t.Fatalf("policy %q", s.c.Policy().Name())
			}
		})
	}
}
