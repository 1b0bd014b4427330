package simulate

import (
	"fmt"
	"math"
	"time"

	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// Capacity is how fast the cores decide when workers answer at once: the
// workload's files all queued at the start and every transfer taking no
// virtual time, so that the cores, not the arrivals or the slots' time,
// set the pace. The time is the wall clock's, the fastest of Runs runs.
type Capacity struct {
	Shards int `json:"shards"`
	Runs   int `json:"runs"`
	DTRs   int `json:"dtrs"`
	// Decisions counts grants given and DTRs ended.
	Decisions uint64        `json:"decisions"`
	Wall      time.Duration `json:"wall_ns"`
	// DTRsPerSecond and DecisionsPerSecond are per second of wall clock,
	// the shards running in parallel goroutines between leases.
	DTRsPerSecond      float64 `json:"dtrs_per_second"`
	DecisionsPerSecond float64 `json:"decisions_per_second"`
	// CriticalPath is the same run's time with each shard timed alone in
	// each period and the period counted as its slowest shard, plus the
	// leases: what the shards take with a processor each, whatever the
	// machine's processors give two threads at once.
	CriticalPath                   time.Duration `json:"critical_path_ns"`
	DecisionsPerSecondCriticalPath float64       `json:"decisions_per_second_critical_path"`
}

// MeasureCapacity runs work through sh.Shards cores with transfers that
// take no virtual time, every file arriving at the start, runs times, and
// returns the fastest run's rates.
func MeasureCapacity(cfg core.Config, work []Arrival, opt Options, sh Sharding, runs int) (Capacity, error) {
	if err := sh.defaults(); err != nil {
		return Capacity{}, err
	}
	opt.defaults()
	opt.Overhead, opt.SlotRate = 0, math.Inf(1)
	opt.Sample = opt.Limit // one sample: nothing is drawn
	instant := make([]Arrival, len(work))
	for i, a := range work {
		a.At = 0
		instant[i] = a
	}
	out := Capacity{Shards: sh.Shards, Runs: max(runs, 1), DTRs: len(work)}
	for i := 0; i < out.Runs; i++ {
		r := newRun(cfg, instant, opt, sh, false)
		began := time.Now()
		if err := r.run(); err != nil {
			return Capacity{}, fmt.Errorf("capacity run with %d shards: %w", sh.Shards, err)
		}
		wall := time.Since(began)
		if i == 0 || wall < out.Wall {
			out.Wall = wall
		}
		out.Decisions = r.decisions()
		r = newRun(cfg, instant, opt, sh, false)
		r.timeShards = true
		began = time.Now()
		if err := r.run(); err != nil {
			return Capacity{}, fmt.Errorf("timed capacity run with %d shards: %w", sh.Shards, err)
		}
		// The leases and the barrier are serial: what is not a shard's.
		critical := time.Since(began) - r.shardTime + r.slowest
		if i == 0 || critical < out.CriticalPath {
			out.CriticalPath = critical
		}
	}
	out.DTRsPerSecond = float64(out.DTRs) / out.Wall.Seconds()
	out.DecisionsPerSecond = float64(out.Decisions) / out.Wall.Seconds()
	out.DecisionsPerSecondCriticalPath = float64(out.Decisions) / out.CriticalPath.Seconds()
	return out, nil
}
