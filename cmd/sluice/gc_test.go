package main

import "testing"

func TestSchedulerHeapGrowsBy64MiBOrATenthOfADeepQueueOrTwoSecondsOfABurst(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		live, rate uint64
		want       int
	}{
		{0, 0, 400},
		{1 * mib, 0, 400},           // small: as GOGC=400
		{16 * mib, 0, 400},          // 64 MiB more is 400%
		{64 * mib, 0, 100},          // 64 MiB more
		{256 * mib, 0, 25},          // 64 MiB more
		{257 * mib, 0, 10},          // a tenth more
		{4096 * mib, 0, 10},         // a tenth more
		{400 * mib, 10 * mib, 10},   // calm: a tenth is more than 2 s of allocation
		{400 * mib, 60 * mib, 30},   // a burst: 2 s of allocation, 120 MiB
		{400 * mib, 62 * mib, 40},   // 31 %, rounded up to a tenth
		{400 * mib, 1000 * mib, 50}, // never more than half the live heap
		{16 * mib, 1000 * mib, 400}, // small: 64 MiB more is more already
	}
	for _, tt := range tests {
		if got := schedulerGCPercent(tt.live, tt.rate); got != tt.want {
			t.Errorf("live %d MiB, %d MiB/s allocated: GOGC %d, want %d", tt.live/mib, tt.rate/mib, got, tt.want)
		}
	}
}
