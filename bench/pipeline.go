package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
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
	return barePipeline(ctx, dir, n, inProcess, "", false)
}

// BarePipelineSeparate is BarePipeline with each of its four stages a child
// process of the sluice binary exe (`exe bench --pipeline-stage N`), as
// Sluice's roles run when each is its own process: the baseline of that
// shape. The items are published and counted in this process.
func BarePipelineSeparate(ctx context.Context, dir string, n int, exe string) (float64, error) {
	return barePipeline(ctx, dir, n, false, exe, false)
}

// pipelineStages is the number of consume→publish stages; a last stream
// takes what the last stage publishes.
const pipelineStages = 4

// barePipeline runs n items through the pipeline: its stages in this
// process, or each a child process of exe; each stage one message at a
// time, or batched (BatchedPipeline).
func barePipeline(ctx context.Context, dir string, n int, inProcess bool, exe string, batched bool) (float64, error) {
	what := "bare pipeline"
	stage := pipelineStage
	consumer := jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy}
	if batched {
		what, stage = "batched pipeline", batchedStage
		// As many unacknowledged as Sluice's consumers allow.
		consumer.MaxAckPending = batchedMaxAckPending
	}
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
	nc, err := connect()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	for i := 0; i <= pipelineStages; i++ {
		name := "S" + strconv.Itoa(i)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"stage." + strconv.Itoa(i)},
			Retention: jetstream.WorkQueuePolicy}); err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
		if _, err := js.CreateConsumer(ctx, name, consumer); err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
	}
	errs := make(chan error, 1)
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	for i := 0; i < pipelineStages; i++ {
		if exe != "" {
			args := []string{"bench", "--pipeline-stage", strconv.Itoa(i)}
			if batched {
				args = append(args, "--pipeline-batched")
			}
			cmd := exec.CommandContext(ctx, exe, args...)
			cmd.Env = append(os.Environ(), "NATS_URL="+ns.ClientURL())
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				return 0, fmt.Errorf("%s: %w", what, err)
			}
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			continue
		}
		snc, err := connect()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
		defer snc.Close()
		stop, err := stage(ctx, snc, i, report)
		if err != nil {
			return 0, err
		}
		defer stop()
	}
	// The last stream is read here, counting the items that come out
	// (each once: one delivered again is not counted again).
	arrived := newArrivals(n)
	snc, err := connect()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	defer snc.Close()
	sjs, _ := jetstream.New(snc)
	cons, err := sjs.Consumer(ctx, "S"+strconv.Itoa(pipelineStages), "c")
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		arrived.add(m.Data())
	}, jetstream.PullMaxMessages(500))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	defer cc.Stop()
	if err := pipelineReady(ctx, js, what); err != nil {
		return 0, err
	}

	start := time.Now()
	out := bus.NewBatch(ctx, js)
	for i := 0; i < n; i++ {
		m := nats.NewMsg("stage.0")
		m.Data = make([]byte, 600) // about the size of a grant
		binary.BigEndian.PutUint64(m.Data, uint64(i))
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
	select {
	case <-arrived.all:
	case err := <-errs:
		return 0, fmt.Errorf("%s: %w", what, err)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// arrivals counts the items that have come out of the pipeline, each
// once, and closes all when every one of the n has.
type arrivals struct {
	mu   sync.Mutex
	seen []bool
	left int
	all  chan struct{}
}

func newArrivals(n int) *arrivals {
	return &arrivals{seen: make([]bool, n), left: n, all: make(chan struct{})}
}

// add counts the item whose number begins data.
func (a *arrivals) add(data []byte) {
	if len(data) < 8 {
		return
	}
	i := binary.BigEndian.Uint64(data)
	a.mu.Lock()
	defer a.mu.Unlock()
	if i >= uint64(len(a.seen)) || a.seen[i] {
		return
	}
	a.seen[i] = true
	if a.left--; a.left == 0 {
		close(a.all)
	}
}

// pipelineStage consumes stage i's stream and publishes each message to
// the next stage's subject, acknowledging it once that publish is stored.
// A failed publish goes to report.
func pipelineStage(ctx context.Context, nc *nats.Conn, i int, report func(error)) (stop func(), err error) {
	js, _ := jetstream.New(nc)
	cons, err := js.Consumer(ctx, "S"+strconv.Itoa(i), "c")
	if err != nil {
		return nil, fmt.Errorf("bare pipeline stage %d: %w", i, err)
	}
	next := "stage." + strconv.Itoa(i+1)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if _, err := js.Publish(ctx, next, m.Data()); err != nil {
			report(err)
		}
		_ = m.Ack()
	}, jetstream.PullMaxMessages(500))
	if err != nil {
		return nil, fmt.Errorf("bare pipeline stage %d: %w", i, err)
	}
	return cc.Stop, nil
}

// RunPipelineStage runs stage i of the bare pipeline against the NATS
// server at url until ctx ends or a publish fails: what `sluice bench
// --pipeline-stage i` does in the child processes of BarePipelineSeparate.
func RunPipelineStage(ctx context.Context, url string, i int) error {
	return runPipelineStage(ctx, url, i, false)
}

func runPipelineStage(ctx context.Context, url string, i int, batched bool) error {
	what, stage := "bare pipeline", pipelineStage
	if batched {
		what, stage = "batched pipeline", batchedStage
	}
	if i < 0 || i >= pipelineStages {
		return fmt.Errorf("%s: no stage %d (0 to %d)", what, i, pipelineStages-1)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		return fmt.Errorf("%s stage %d: %w", what, i, err)
	}
	defer nc.Close()
	errs := make(chan error, 1)
	stop, err := stage(ctx, nc, i, func(err error) {
		select {
		case errs <- err:
		default:
		}
	})
	if err != nil {
		return err
	}
	defer stop()
	select {
	case err := <-errs:
		return fmt.Errorf("%s stage %d: %w", what, i, err)
	case <-ctx.Done():
		return nil
	}
}

// pipelineReady waits until every stage's consumer has a pull waiting, so
// that no process's start is measured.
func pipelineReady(ctx context.Context, js jetstream.JetStream, what string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for i := 0; i <= pipelineStages; i++ {
		for {
			c, err := js.Consumer(ctx, "S"+strconv.Itoa(i), "c")
			if err == nil {
				info, err := c.Info(ctx)
				if err == nil && info.NumWaiting > 0 {
					break
				}
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s: stage %d did not start: %w", what, i, ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
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
