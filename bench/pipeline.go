package bench

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/bus"
)

// BarePipeline is the baseline Sluice is measured against: a 4-stage
// JetStream consume→publish pipeline (one work-queue stream per stage, a
// durable pull consumer each, every message acknowledged after the next
// publish is stored) on an embedded server like Sluice's, over loopback
// TCP or nats.go's in-process connection. It returns items per second
// through all four stages.
func BarePipeline(ctx context.Context, dir string, n int, inProcess bool) (float64, error) {
	ns, err := bus.Embedded(dir, 0)
	if err != nil {
		return 0, err
	}
	defer ns.Shutdown()
	connect := func() (*nats.Conn, error) {
		if inProcess {
			return nats.Connect("", nats.InProcessServer(ns))
		}
		return nats.Connect(ns.ClientURL())
	}
	const stages = 4
	nc, err := connect()
	if err != nil {
		return 0, fmt.Errorf("bare pipeline: %w", err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	for i := 0; i <= stages; i++ {
		name := "S" + strconv.Itoa(i)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"stage." + strconv.Itoa(i)},
			Retention: jetstream.WorkQueuePolicy}); err != nil {
			return 0, fmt.Errorf("bare pipeline: %w", err)
		}
		if _, err := js.CreateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			return 0, fmt.Errorf("bare pipeline: %w", err)
		}
	}
	var done sync.WaitGroup
	done.Add(n)
	errs := make(chan error, 1)
	for i := 0; i <= stages; i++ {
		snc, err := connect()
		if err != nil {
			return 0, fmt.Errorf("bare pipeline: %w", err)
		}
		defer snc.Close()
		sjs, _ := jetstream.New(snc)
		cons, err := sjs.Consumer(ctx, "S"+strconv.Itoa(i), "c")
		if err != nil {
			return 0, fmt.Errorf("bare pipeline: %w", err)
		}
		next := "stage." + strconv.Itoa(i+1)
		last := i == stages
		cc, err := cons.Consume(func(m jetstream.Msg) {
			if last {
				_ = m.Ack()
				done.Done()
				return
			}
			if _, err := sjs.Publish(ctx, next, m.Data()); err != nil {
				select {
				case errs <- err:
				default:
				}
			}
			_ = m.Ack()
		}, jetstream.PullMaxMessages(500))
		if err != nil {
			return 0, fmt.Errorf("bare pipeline: %w", err)
		}
		defer cc.Stop()
	}
	payload := make([]byte, 600) // about the size of a grant
	start := time.Now()
	out := bus.NewBatch(ctx, js)
	for i := 0; i < n; i++ {
		m := nats.NewMsg("stage.0")
		m.Data = payload
		out.Add(m)
		if out.Len() == 1000 {
			if err := out.Wait(ctx); err != nil {
				return 0, err
			}
		}
	}
	if err := out.Wait(ctx); err != nil {
		return 0, err
	}
	finished := make(chan struct{})
	go func() { done.Wait(); close(finished) }()
	select {
	case <-finished:
	case err := <-errs:
		return 0, fmt.Errorf("bare pipeline: %w", err)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// CopyBaseline copies n files of size bytes from one directory to another
// with cp (one process, as `cp -r`): what the file system alone allows for
// the files of a throughput run. It returns files per second, or 0 if
// there is no cp.
func CopyBaseline(ctx context.Context, dir string, n, size int) (float64, error) {
	cp, err := exec.LookPath("cp")
	if err != nil {
		return 0, nil
	}
	if _, err := files(dir, "c", n, size, nil); err != nil {
		return 0, err
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, cp, "-r", filepath.Join(dir, "in"), filepath.Join(dir, "out"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("cp baseline: %w: %s", err, out)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
