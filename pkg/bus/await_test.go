package bus

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"
)

func TestAwaitWaitsUntilTheSchedulerHasSetUpWhatARoleUses(t *testing.T) {
	js := embeddedJS(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	uses := []Use{{Stream: StreamResults}, {Stream: StreamGrants, Consumer: "delivery"}, {Bucket: BucketJobs}}

	// Nothing is set up: Await gives up only when its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := Await(ctx, js, log, uses...); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Await with nothing set up: %v, want the context's deadline", err)
	}

	done := make(chan error, 1)
	go func() { done <- Await(context.Background(), js, log, uses...) }()
	select {
	case err := <-done:
		t.Fatalf("Await returned %v before anything was set up", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := Ensure(context.Background(), js, Setup{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Await still waits after Ensure")
	}
}
