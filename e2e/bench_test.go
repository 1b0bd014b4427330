package e2e

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/bench"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// BenchmarkBarePipeline is the baseline Sluice is measured against
// (bench.BarePipeline), over loopback TCP and nats.go's in-process
// connection.
func BenchmarkBarePipeline(b *testing.B) {
	for _, mode := range []string{"loopback", "inprocess"} {
		b.Run(mode, func(b *testing.B) {
			rate, err := bench.BarePipeline(context.Background(), b.TempDir(), b.N, mode == "inprocess")
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(rate, "items/s")
		})
	}
}

// BenchmarkSluice1KiBFiles moves b.N files of 1 KiB file→file through every
// service in one process on an embedded NATS server, as one job, and reports
// DTRs per second from submission to the job's end; the services connect
// over loopback TCP or nats.go's in-process connection.
func BenchmarkSluice1KiBFiles(b *testing.B) {
	for _, mode := range []string{"loopback", "inprocess"} {
		b.Run(mode, func(b *testing.B) {
			cfg := testConfig()
			cfg.MaxProcessor, cfg.MaxDelivery = 50, 50
			cfg.Processor.PreWorkers, cfg.Processor.PostWorkers, cfg.Delivery.Workers = 50, 50, 50
			s := startMode(b, cfg, mode == "inprocess")
			j := &job.Job{}
			for i := 0; i < b.N; i++ {
				src := filepath.Join(s.dir, "in", strconv.Itoa(i))
				writeFile(b, src, 1024, i)
				j.Inputs = append(j.Inputs, job.File{Source: fileURL(src), Destination: fileURL(filepath.Join(s.dir, "out", strconv.Itoa(i)))})
			}
			b.ResetTimer()
			start := time.Now()
			r := s.submit(j)
			ev := s.wait(r.JobID, 10*time.Minute)
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "DTR/s")
			if ev.Done != b.N {
				b.Fatalf("%d of %d done", ev.Done, b.N)
			}
		})
	}
}

// BenchmarkRestartToFirstGrant measures how long a scheduler takes from
// start to its first grant with 100,000 DTRs stored as queued for transfer
// (bench.RestartToFirstGrant).
func BenchmarkRestartToFirstGrant(b *testing.B) {
	for range b.N {
		took, err := bench.RestartToFirstGrant(context.Background(), b.TempDir(), 100_000)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(took.Seconds(), "s-to-first-grant")
	}
}
