package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Use names one thing a role uses: a Bucket, a Consumer on a Stream, or a
// Stream.
type Use struct {
	Stream, Consumer, Bucket string
}

func (u Use) String() string {
	switch {
	case u.Bucket != "":
		return "bucket " + u.Bucket
	case u.Consumer != "":
		return "consumer " + u.Consumer + " on stream " + u.Stream
	}
	return "stream " + u.Stream
}

// lookup returns nil if u exists.
func (u Use) lookup(ctx context.Context, js jetstream.JetStream) (err error) {
	switch {
	case u.Bucket != "":
		_, err = js.KeyValue(ctx, u.Bucket)
	case u.Consumer != "":
		_, err = js.Consumer(ctx, u.Stream, u.Consumer)
	default:
		_, err = js.Stream(ctx, u.Stream)
	}
	return err
}

// notFound says whether err means that a stream, consumer or bucket does
// not exist (yet).
func notFound(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrBucketNotFound)
}

// Await returns once everything in uses exists. Only the scheduler creates
// streams, consumers and buckets (Ensure), so that only it needs the rights
// to; the other roles wait for it here, whatever order they start in. It
// looks again after 50 ms, backing off to 2 s, and logs once per thing it
// waits for. It fails only when ctx ends.
func Await(ctx context.Context, js jetstream.JetStream, log *slog.Logger, uses ...Use) error {
	wait := Backoff{Min: 50 * time.Millisecond, Max: 2 * time.Second}
	logged := map[string]bool{}
	for _, u := range uses {
		for {
			lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := u.lookup(lctx, js)
			cancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("waiting for %s: %w", u, ctx.Err())
			}
			missing := notFound(err)
			if key := fmt.Sprint(u, missing); !logged[key] {
				logged[key] = true
				if missing {
					log.Info("waiting for the scheduler to set up " + u.String())
				} else {
					log.Warn("cannot look up "+u.String()+"; trying again", "err", err)
				}
			}
			if !wait.Sleep(ctx) {
				return fmt.Errorf("waiting for %s: %w", u, ctx.Err())
			}
		}
	}
	return nil
}
