package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// batchWindow bounds the acknowledgements one Batch leaves outstanding:
// nats.go refuses asynchronous publishes once 4,000 are pending on a
// connection (ErrTooManyStalledMsgs), which a slow server reaches quickly
// when several batches share one connection.
const batchWindow = 256

// Batch publishes messages to JetStream without waiting for each one, then
// waits for all of their acknowledgements at once. At most batchWindow of
// its messages are unacknowledged at any time: Add waits for the oldest
// before it publishes more.
type Batch struct {
	// Refused, if set, hears each message the server refuses, by its
	// index among those added since the last Wait, and decides whether
	// the refusal is an error (a create of a key that exists, say, may
	// not be).
	Refused func(i int, err error) error
	// Stored, if set, hears each message stored, by its index among
	// those added since the last Wait, with its stream sequence.
	Stored func(i int, seq uint64)
	// Last is the highest stream sequence the server has acknowledged
	// (useful when every message goes to one stream).
	Last uint64
	// Full, if set, makes a message that JetStream refuses for want of
	// space (StoreFull) be published again, after a pause growing from
	// MinBackoff to MaxBackoff, until it is stored or the context ends;
	// each such refusal is recorded in Full. Unset, the refusal is an
	// error like any other.
	Full *Space

	ctx     context.Context
	js      jetstream.JetStream
	futures []jetstream.PubAckFuture
	acked   int // futures[:acked] are known to be stored
	err     error
}

// NewBatch starts an empty batch; ctx bounds the waits inside Add.
func NewBatch(ctx context.Context, js jetstream.JetStream) *Batch { return &Batch{ctx: ctx, js: js} }

// Add publishes m; its acknowledgement is awaited by Wait.
func (b *Batch) Add(m *nats.Msg) {
	if b.err != nil {
		return
	}
	for len(b.futures)-b.acked >= batchWindow {
		if b.err = b.awaitAt(b.ctx, b.acked); b.err != nil {
			return
		}
		b.acked++
	}
	for {
		f, err := b.js.PublishMsgAsync(m)
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			// Other publishers on this connection fill the client's
			// window: wait for it to drain, then try again.
			select {
			case <-b.js.PublishAsyncComplete():
			case <-time.After(100 * time.Millisecond):
			case <-b.ctx.Done():
				b.err = fmt.Errorf("publish to %s: %w", m.Subject, b.ctx.Err())
				return
			}
			continue
		}
		if err != nil {
			b.err = fmt.Errorf("publish to %s: %w", m.Subject, err)
			return
		}
		b.futures = append(b.futures, f)
		return
	}
}

// Len returns the number of messages published so far.
func (b *Batch) Len() int { return len(b.futures) }

// Wait returns once every message is stored, or the first error.
func (b *Batch) Wait(ctx context.Context) error {
	defer func() { b.futures, b.acked = b.futures[:0], 0 }()
	if b.err != nil {
		return b.err
	}
	for i := b.acked; i < len(b.futures); i++ {
		if err := b.awaitAt(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

// awaitAt waits for the i-th message, handing a refusal to Refused.
func (b *Batch) awaitAt(ctx context.Context, i int) error {
	seq, err := b.await(ctx, b.futures[i])
	if err == nil {
		b.Last = max(b.Last, seq)
		if b.Stored != nil {
			b.Stored(i, seq)
		}
	}
	var api *jetstream.APIError
	if err != nil && b.Refused != nil && errors.As(err, &api) {
		return b.Refused(i, err)
	}
	return err
}

// Acknowledgements that do not come: a JetStream server that fails over
// may lose an asynchronous publish without an answer. The message is then
// published again, synchronously (a message with a Nats-Msg-Id is stored
// once however often it is sent; a key-value put sets the same value), up
// to ackTries times before Wait gives up with an error.
var ackTimeout = 5 * time.Second // a variable for tests

const ackTries = 6

// retryPause is the pause before the second try, doubled at each next one
// up to 2 s: 0.25+0.5+1+2+2 s in all.
var retryPause = 250 * time.Millisecond // a variable for tests

// await waits for f's acknowledgement, and returns the stream sequence
// its message was stored at.
func (b *Batch) await(ctx context.Context, f jetstream.PubAckFuture) (uint64, error) {
	subject := f.Msg().Subject
	var last error
	select {
	case ack := <-f.Ok():
		return ack.Sequence, nil
	case err := <-f.Err():
		last = err
	case <-time.After(ackTimeout):
		last = fmt.Errorf("no acknowledgement within %s", ackTimeout)
	case <-ctx.Done():
		return 0, fmt.Errorf("waiting for publish acknowledgements: %w", ctx.Err())
	}
	for try := 2; try <= ackTries; try++ {
		if b.Full != nil && StoreFull(last) {
			return b.untilStored(ctx, f.Msg(), last)
		}
		var api *jetstream.APIError
		if errors.As(last, &api) {
			// The server refused it: sending it again changes nothing.
			return 0, fmt.Errorf("publish to %s: %w", subject, last)
		}
		slog.Warn("publishing again", "subject", subject, "try", try, "err", last)
		// A stream electing a leader answers "no response" at once:
		// the tries are spread over a few seconds, as an election takes.
		select {
		case <-time.After(min(retryPause<<(try-2), 2*time.Second)):
		case <-ctx.Done():
			return 0, fmt.Errorf("waiting for publish acknowledgements: %w", ctx.Err())
		}
		pctx, cancel := context.WithTimeout(ctx, ackTimeout)
		var ack *jetstream.PubAck
		ack, last = b.js.PublishMsg(pctx, f.Msg())
		cancel()
		if last == nil {
			return ack.Sequence, nil
		}
		if ctx.Err() != nil {
			return 0, fmt.Errorf("waiting for publish acknowledgements: %w", ctx.Err())
		}
	}
	return 0, fmt.Errorf("publish to %s: no acknowledgement after %d tries: %w", subject, ackTries, last)
}

// Msg returns a received JetStream message as a *nats.Msg for codec.Decode.
func Msg(m jetstream.Msg) *nats.Msg {
	return &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}
}

// Each hands every message of a consumer to f, one at a time, until ctx
// ends. At most max messages wait in the client's buffer.
func Each(ctx context.Context, cons jetstream.Consumer, max int, f func(jetstream.Msg)) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(max))
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	go func() {
		<-ctx.Done()
		it.Stop()
	}()
	for {
		m, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			if ctx.Err() != nil {
				return nil
			}
			slog.Warn("consume", "consumer", cons.CachedInfo().Name, "err", err)
			continue
		}
		f(m)
	}
}

// EachBatch hands the messages of a consumer to f in batches, until ctx
// ends: a batch is the messages that have come in since f last returned,
// at most max, and at least one.
func EachBatch(ctx context.Context, cons jetstream.Consumer, max int, f func([]jetstream.Msg)) error {
	in := make(chan jetstream.Msg, max)
	errc := make(chan error, 1)
	go func() {
		defer close(in) // Each has returned: nothing more is sent
		errc <- Each(ctx, cons, max, func(m jetstream.Msg) {
			select {
			case in <- m:
			case <-ctx.Done():
			}
		})
	}()
	batch := make([]jetstream.Msg, 0, max)
	for m := range in {
		batch = append(batch[:0], m)
	drain:
		for len(batch) < max {
			select {
			case m, ok := <-in:
				if !ok {
					break drain
				}
				batch = append(batch, m)
			default:
				break drain
			}
		}
		f(batch)
	}
	return <-errc
}
