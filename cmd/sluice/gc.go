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
// allocates fast and keeps little (a worker's live heap is a few MiB), and
// the default spent about a sixth of the CPU of a run of 1 KiB files
// collecting.
//
// A process that runs the scheduler alone (role "scheduler") keeps far
// more: a few hundred bytes per queued DTR, a million queued being some
// hundred MiB that stay live. Its heap may grow past the live heap by 64
// MiB up to 256 MiB live, by a tenth of it beyond (schedulerGCPercent),
// set again every second: as GOGC=400 up to 16 MiB live, GOGC=10 with a
// deep queue. It collects more often with a deep queue, and each
// collection marks little but the queued DTRs (packed, pointer-free
// strings).
//
// GOGC or GOMEMLIMIT in the environment win.
func collectLess(ctx context.Context, role string) {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	const floor = 1 << 30
	debug.SetMemoryLimit(floor)
	debug.SetGCPercent(400)
	every, percent := 10*time.Second, 400
	if role == "scheduler" {
		every = time.Second
	}
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindUint64 {
			continue
		}
		live := sample[0].Value.Uint64()
		debug.SetMemoryLimit(max(floor, 2*int64(live)))
		if role == "scheduler" {
			if p := schedulerGCPercent(live); p != percent {
				percent = p
				debug.SetGCPercent(p)
			}
		}
	}
}

// schedulerGCPercent is the GOGC of a process that runs the scheduler alone
// with live bytes of live heap: the heap may grow by 64 MiB while the live
// heap is at most 256 MiB, as GOGC 400 at most, and by a tenth of it
// beyond (a deep queue: GOGC=10).
func schedulerGCPercent(live uint64) int {
	if live == 0 {
		return 400
	}
	if live > 256<<20 {
		return 10
	}
	return int(min(400, 100*(64<<20)/live))
}
