package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/bus"
)

// BatchedPipeline is the baseline Sluice's throughput is measured against
// first: the 4-stage JetStream pipeline of BarePipeline, batched as Sluice
// is. Each stage takes the messages that have come in (up to batchedPull
// of them, at least one), publishes the next stage's message of each
// without waiting, and hands the batch on; the acknowledgements of up to
// batchesInFlight batches are awaited meanwhile, and a batch's inputs are
// acknowledged once all of its outputs are stored, as the scheduler's
// committer does with a step's outputs and inputs. It returns items per
// second through all four stages.
func BatchedPipeline(ctx context.Context, dir string, n int, inProcess bool) (float64, error) {
	return barePipeline(ctx, dir, n, inProcess, "", true)
}

// BatchedPipelineSeparate is BatchedPipeline with each of its four stages a
// child process of the sluice binary exe (`exe bench --pipeline-stage N
// --pipeline-batched`), the baseline of Sluice with each role its own
// process.
func BatchedPipelineSeparate(ctx context.Context, dir string, n int, exe string) (float64, error) {
	return barePipeline(ctx, dir, n, false, exe, true)
}

// RunBatchedPipelineStage runs stage i of the batched pipeline against the
// NATS server at url until ctx ends or a publish fails: what `sluice bench
// --pipeline-stage i --pipeline-batched` does in the child processes of
// BatchedPipelineSeparate.
func RunBatchedPipelineStage(ctx context.Context, url string, i int) error {
	return runPipelineStage(ctx, url, i, true)
}

const (
	// batchedPull is the most messages a stage takes at once: as many as
	// DTRs are in flight in a state at Sluice's throughput figures.
	batchedPull = ThroughputSlots
	// batchesInFlight is the number of batches whose outputs may be
	// awaited at once while the next is published.
	batchesInFlight = 4
	// batchedMaxAckPending is each stage's consumer's limit on
	// unacknowledged messages, of the order of Sluice's consumers'.
	batchedMaxAckPending = 10_000
)

// published is a batch of a stage's inputs and the acknowledgements of its
// outputs, one each.
type published struct {
	inputs []jetstream.Msg
	stored []jetstream.PubAckFuture
}

// batchedStage consumes stage i's stream in batches and publishes each
// message to the next stage's subject asynchronously; another goroutine
// waits for each batch's outputs to be stored, then acknowledges its
// inputs. A failed publish goes to report, and its batch is left
// unacknowledged (delivered again after the consumer's wait).
func batchedStage(ctx context.Context, nc *nats.Conn, i int, report func(error)) (stop func(), err error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(2*batchesInFlight*batchedPull))
	if err != nil {
		return nil, fmt.Errorf("batched pipeline stage %d: %w", i, err)
	}
	cons, err := js.Consumer(ctx, "S"+strconv.Itoa(i), "c")
	if err != nil {
		return nil, fmt.Errorf("batched pipeline stage %d: %w", i, err)
	}
	next := "stage." + strconv.Itoa(i+1)
	ctx, cancel := context.WithCancel(ctx)
	batches := make(chan published, batchesInFlight-1) // and one in the acknowledging goroutine's hands
	var running sync.WaitGroup
	running.Go(func() {
		defer close(batches)
		_ = bus.EachBatch(ctx, cons, batchedPull, func(in []jetstream.Msg) {
			b := published{inputs: slices.Clone(in), stored: make([]jetstream.PubAckFuture, 0, len(in))}
			for _, m := range in {
				f, err := js.PublishMsgAsync(&nats.Msg{Subject: next, Data: m.Data()})
				if err != nil {
					report(fmt.Errorf("publish to %s: %w", next, err))
					return
				}
				b.stored = append(b.stored, f)
			}
			select {
			case batches <- b:
			case <-ctx.Done():
			}
		})
	})
	running.Go(func() {
		for b := range batches {
			for _, f := range b.stored {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					report(fmt.Errorf("publish to %s: %w", next, err))
					return
				case <-ctx.Done():
					return
				}
			}
			for _, m := range b.inputs {
				_ = m.Ack()
			}
		}
	})
	return func() { cancel(); running.Wait() }, nil
}
