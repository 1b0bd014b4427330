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
// hundred MiB that stay live. While it is calm its heap may grow past the
// live heap by 64 MiB up to 256 MiB live, by a tenth of it beyond, set
// again every second: as GOGC=400 up to 16 MiB live, GOGC=10 with a deep
// queue. While it allocates fast (a burst of submissions taken in) the
// heap may grow by two seconds of its allocation, up to half the live
// heap (GOGC=50), so that it collects about every two seconds, not
// several times a second: with 600,000 queued, GOGC=10 held the intake of
// a burst to about a third (8,400 DTRs/s against 23,300), where its peak
// memory is about twice as large (1.0 GiB against 0.5). When the burst is over, what the heap grew
// by meanwhile is given back to the system at once (schedulerGCPercent).
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
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/allocs:bytes"}}
	var allocated uint64 // by the last sample
	last := time.Now()
	var freed time.Time // when a burst's growth was last given back
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			metrics.Read(sample)
			if sample[0].Value.Kind() != metrics.KindUint64 || sample[1].Value.Kind() != metrics.KindUint64 {
				continue
			}
			live, total := sample[0].Value.Uint64(), sample[1].Value.Uint64()
			rate := uint64(float64(total-allocated) / max(now.Sub(last).Seconds(), 0.001))
			allocated, last = total, now
			debug.SetMemoryLimit(max(floor, 2*int64(live)))
			if role != "scheduler" {
				continue
			}
			if p := schedulerGCPercent(live, rate); p != percent {
				calmer := p < percent && live > 256<<20
				percent = p
				debug.SetGCPercent(p)
				if calmer && p == schedulerGCPercent(live, 0) && now.Sub(freed) > 30*time.Second {
					// A burst is over: give back at once what the
					// heap grew by meanwhile, rather than over minutes
					// (a full collection: not more than twice a minute).
					debug.FreeOSMemory()
					freed = now
				}
			}
		}
	}
}

// schedulerGCPercent is the GOGC of a process that runs the scheduler alone
// with live bytes of live heap, allocating rate bytes a second: the heap
// may grow by 64 MiB while the live heap is at most 256 MiB, as GOGC 400
// at most, and by a tenth of it beyond (a deep queue: GOGC=10); and by two
// seconds of allocation if that is more, up to GOGC=50 (a burst taken in).
func schedulerGCPercent(live, rate uint64) int {
	if live == 0 {
		return 400
	}
	calm := 10
	if live <= 256<<20 {
		calm = int(min(400, 100*(64<<20)/live))
	}
	busy := int(min(50, 100*2*rate/live))
	if busy > calm && calm < 100 {
		// Rounded up to a tenth, so that the setting changes seldom.
		return min(50, (busy+9)/10*10)
	}
	return calm
}
