package simulate

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"
)

// The decision capacity counts every decision of the run, with transfers
// that take no time, whatever the number of shards.
func TestCapacityCountsTheSameDecisionsAtEveryNumberOfShards(t *testing.T) {
	cfg, opt, err := ScaleConfig()
	if err != nil {
		t.Fatal(err)
	}
	work := scaleWorkload(20, time.Minute)
	var want uint64
	for _, shards := range []int{1, 2, 4} {
		c, err := MeasureCapacity(cfg, work, opt, Sharding{Shards: shards}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if want == 0 {
			want = c.Decisions
		}
		if c.Decisions != want || c.DTRs != len(work) || c.DecisionsPerSecond <= 0 || c.DecisionsPerSecondCriticalPath <= 0 {
			t.Errorf("%d shards: %+v, want %d decisions", shards, c, want)
		}
	}
}

// BenchmarkDecisions measures the decision capacity of 1, 2 and 4 shards
// on docs/scale.md's workload (ScaleExample) with transfers that take no
// virtual time: every file queued at the start, the cores decide as fast
// as they can, the shards in parallel goroutines between leases. It
// reports decisions (grants, and DTRs ended) and DTRs per second of wall
// clock; making the cores and their workload is not timed.
func BenchmarkDecisions(b *testing.B) {
	cfg, opt, err := ScaleConfig()
	if err != nil {
		b.Fatal(err)
	}
	opt.defaults()
	opt.Overhead, opt.SlotRate, opt.Sample = 0, math.Inf(1), opt.Limit
	work := ScaleExample()
	for i := range work {
		work[i].At = 0
	}
	for _, shards := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) {
			var decisions uint64
			for b.Loop() {
				b.StopTimer()
				r := newRun(cfg, work, opt, Sharding{Shards: shards, By: ShardByLoad, Period: time.Second}, false)
				b.StartTimer()
				if err := r.run(); err != nil {
					b.Fatal(err)
				}
				decisions += r.decisions()
			}
			b.ReportMetric(float64(decisions)/b.Elapsed().Seconds(), "decisions/s")
			b.ReportMetric(float64(len(work)*b.N)/b.Elapsed().Seconds(), "DTRs/s")
		})
	}
}

// BenchmarkMachineParallelism is the machine's own ceiling for
// BenchmarkDecisions: the same arithmetic (no memory, no allocation) done
// by one goroutine, or split between two or four. On a machine whose
// processors run two threads at full speed, 2 takes half the time of 1.
func BenchmarkMachineParallelism(b *testing.B) {
	const work = 1 << 26
	for _, goroutines := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("goroutines=%d", goroutines), func(b *testing.B) {
			sink := make([]uint64, goroutines)
			for b.Loop() {
				var wg sync.WaitGroup
				for g := range goroutines {
					wg.Go(func() {
						x := uint64(g + 1)
						for range work / goroutines {
							x = x*6364136223846793005 + 1442695040888963407
							x ^= x >> 17
						}
						sink[g] = x
					})
				}
				wg.Wait()
			}
		})
	}
}
