package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
	"github.com/sluice-dtr/sluice/services/scheduler"
)

// BenchmarkBarePipeline is the baseline Sluice is measured against: a
// 4-stage JetStream consume→publish pipeline (one work-queue stream per
// stage, a durable pull consumer each, every message acknowledged after the
// next publish is stored) on the same kind of embedded server, over a
// loopback TCP connection and over nats.go's in-process connection.
func BenchmarkBarePipeline(b *testing.B) {
	for _, mode := range []string{"loopback", "inprocess"} {
		b.Run(mode, func(b *testing.B) {
			ns, err := bus.Embedded(b.TempDir(), 0)
			if err != nil {
				b.Fatal(err)
			}
			defer ns.Shutdown()
			connect := func() *nats.Conn {
				var nc *nats.Conn
				if mode == "loopback" {
					nc, err = nats.Connect(ns.ClientURL())
				} else {
					nc, err = nats.Connect("", nats.InProcessServer(ns))
				}
				if err != nil {
					b.Fatal(err)
				}
				return nc
			}
			ctx := context.Background()
			const stages = 4
			nc := connect()
			defer nc.Close()
			js, _ := jetstream.New(nc)
			for i := 0; i <= stages; i++ {
				name := "S" + strconv.Itoa(i)
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"stage." + strconv.Itoa(i)},
					Retention: jetstream.WorkQueuePolicy}); err != nil {
					b.Fatal(err)
				}
				if _, err := js.CreateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
					b.Fatal(err)
				}
			}
			var done sync.WaitGroup
			done.Add(b.N)
			var finished atomic.Bool
			var stops []func()
			for i := 0; i <= stages; i++ {
				snc := connect()
				defer snc.Close()
				sjs, _ := jetstream.New(snc)
				cons, _ := sjs.Consumer(ctx, "S"+strconv.Itoa(i), "c")
				next := "stage." + strconv.Itoa(i+1)
				last := i == stages
				cc, err := cons.Consume(func(m jetstream.Msg) {
					if last {
						_ = m.Ack()
						done.Done()
						return
					}
					if _, err := sjs.Publish(ctx, next, m.Data()); err != nil && !finished.Load() {
						b.Error(err)
					}
					_ = m.Ack()
				}, jetstream.PullMaxMessages(500))
				if err != nil {
					b.Fatal(err)
				}
				stops = append(stops, cc.Stop)
			}
			payload := make([]byte, 600) // about the size of a grant
			b.ResetTimer()
			start := time.Now()
			out := bus.NewBatch(context.Background(), js)
			for i := 0; i < b.N; i++ {
				m := nats.NewMsg("stage.0")
				m.Data = payload
				out.Add(m)
				if out.Len() == 1000 {
					if err := out.Wait(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			if err := out.Wait(ctx); err != nil {
				b.Fatal(err)
			}
			done.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "items/s")
			finished.Store(true)
			for _, stop := range stops {
				stop()
			}
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
// start to its first grant with 100,000 DTRs stored as queued for transfer:
// recovery reads every record back from the sluice_dtrs bucket.
func BenchmarkRestartToFirstGrant(b *testing.B) {
	const queued = 100_000
	for range b.N {
		b.StopTimer()
		ns, err := bus.Embedded(b.TempDir(), 0)
		if err != nil {
			b.Fatal(err)
		}
		nc, err := nats.Connect(ns.ClientURL())
		if err != nil {
			b.Fatal(err)
		}
		js, _ := jetstream.New(nc)
		ctx := context.Background()
		if err := bus.Ensure(ctx, js, bus.Setup{}); err != nil {
			b.Fatal(err)
		}
		out := bus.NewBatch(context.Background(), js)
		now := time.Now()
		for i := 0; i < queued; i++ {
			d := dtr.DTR{ID: uuid.New(), JobID: "bench", Source: fmt.Sprintf("https://storage.example.org/data/file-%07d", i),
				Destination: fmt.Sprintf("file:///scratch/bench/file-%07d", i), Share: "_default-download", Direction: dtr.Download,
				Priority: 25, State: dtr.Transfer, MaxAttempts: 10, Created: now, Updated: now}
			m := nats.NewMsg("$KV." + bus.BucketDTRs + "." + d.ID.String())
			m.Data, _ = json.Marshal(d)
			out.Add(m)
			if out.Len() == 5000 {
				if err := out.Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
		if err := out.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		first := make(chan time.Time, 1)
		sub, _ := nc.Subscribe(bus.GrantSubject(dtr.StageDelivery), func(*nats.Msg) {
			select {
			case first <- time.Now():
			default:
			}
		})
		cfg := testConfig()
		s, err := scheduler.New(cfg.Config, nc, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			b.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		b.StartTimer()
		start := time.Now()
		go func() { _ = s.Run(rctx) }()
		var at time.Time
		select {
		case at = <-first:
		case <-time.After(time.Minute):
			b.Fatal("no grant within a minute")
		}
		b.StopTimer()
		b.ReportMetric(at.Sub(start).Seconds(), "s-to-first-grant")
		cancel()
		sub.Unsubscribe()
		nc.Close()
		ns.Shutdown()
	}
}
