package bench

import (
	"context"
	"testing"
	"time"
)

// BenchmarkSaturate is the saturated run of `sluice bench`: two shares'
// 200 ms downloads, b.N each (at least 40), through 10 transfer slots. It
// reports the part of slot-time in which bytes moved, which each slot's
// turnaround (its transfer's end to the next transfer's start) lowers, and
// the two halves of that turnaround (median):
// go test -run XXX -bench Saturate -benchtime 150x ./bench/
func BenchmarkSaturate(b *testing.B) {
	sat, err := Saturate(context.Background(), b.TempDir(), max(b.N, 40), 200*time.Millisecond)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(100*sat.Transferring, "%slot-time-moving")
	b.ReportMetric(100*sat.TransferringAll, "%slot-time-moving-whole-run")
	b.ReportMetric(100*sat.Utilisation, "%slots-granted")
	b.ReportMetric(float64(Percentile(sat.ToDecision, 50).Microseconds()), "µs-end-to-decision-p50")
	b.ReportMetric(float64(Percentile(sat.ToStart, 50).Microseconds()), "µs-grant-to-start-p50")
}
