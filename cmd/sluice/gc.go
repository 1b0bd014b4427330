package main

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// collectLess makes a serving process collect garbage as if GOGC were 400
// while its live heap is small, and as Go's default (twice the live heap)
// once it is large: the heap may grow to the larger of 1 GiB and twice the
// live heap, a soft limit set again every 10 s until ctx ends. Every role
// allocates fast and keeps little (a worker's live heap is a few MiB, a
// scheduler's some hundred bytes per queued DTR), and the default spent
// about a sixth of the CPU of a run of 1 KiB files collecting. GOGC or
// GOMEMLIMIT in the environment win.
func collectLess(ctx context.Context) {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	const floor = 1 << 30
	debug.SetMemoryLimit(floor)
	debug.SetGCPercent(400)
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		metrics.Read(sample)
		if sample[0].Value.Kind() == metrics.KindUint64 {
			debug.SetMemoryLimit(max(floor, 2*int64(sample[0].Value.Uint64())))
		}
	}
}
