package bench

import (
	"context"
	"testing"
	"time"
)

func TestSiteDefaultsAreARCsSlotCountsWithHistoryAndOptimizerOn(t *testing.T) {
	cfg, err := SiteDefaults(5000)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxProcessor != ARCSlots || cfg.MaxDelivery != ARCSlots {
		t.Errorf("slots %d processor, %d delivery; want ARC's %d", cfg.MaxProcessor, cfg.MaxDelivery, ARCSlots)
	}
	if cfg.HistoryOff || cfg.Optimizer != "on" || cfg.Tick != 50*time.Millisecond || cfg.Lease != 2*time.Minute {
		t.Errorf("history off %v, optimizer %q, tick %s, lease %s: not the defaults", cfg.HistoryOff, cfg.Optimizer, cfg.Tick, cfg.Lease)
	}
	if cfg.Generator.MaxFiles < 5000 {
		t.Errorf("a job may have %d files, fewer than the 5000 asked", cfg.Generator.MaxFiles)
	}
}

func TestThroughputAtDefaultsMovesEveryFile(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real services for a few seconds")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rate, err := ThroughputAtDefaults(ctx, t.TempDir(), 200)
	if err != nil || rate <= 0 {
		t.Fatalf("%v DTR/s, %v", rate, err)
	}
}

// BenchmarkThroughputARCDefaults is ThroughputAtDefaults: all roles in
// this process with a site's defaults, ARC's 10 slots per state. Compare
// it with BenchmarkThroughput/slots=500 of the same run:
// go test -run XXX -bench 'Throughput(ARCDefaults|$)' ./bench/
func BenchmarkThroughputARCDefaults(b *testing.B) {
	n := max(b.N, 100)
	before := cpuTime()
	rate, err := ThroughputAtDefaults(context.Background(), b.TempDir(), n)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(rate, "DTR/s")
	b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(n), "cpu-µs/DTR")
}
