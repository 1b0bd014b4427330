package main

import "testing"

func TestSchedulerHeapGrowsBy64MiBOrATenthOfADeepQueue(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		live uint64
		want int
	}{
		{0, 400},
		{1 * mib, 400},   // small: as GOGC=400
		{16 * mib, 400},  // 64 MiB more is 400%
		{64 * mib, 100},  // 64 MiB more
		{256 * mib, 25},  // 64 MiB more
		{257 * mib, 10},  // a tenth more
		{4096 * mib, 10}, // a tenth more
	}
	for _, tt := range tests {
		if got := schedulerGCPercent(tt.live); got != tt.want {
			t.Errorf("live %d MiB: GOGC %d, want %d", tt.live/mib, got, tt.want)
		}
	}
}
