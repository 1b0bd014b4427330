package transfer

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// ErrLeaseLost is wrapped by the error of an operation that a Fence
// stopped: the grant it ran for may already belong to another worker, so
// it did nothing more on storage, not even remove what it wrote.
var ErrLeaseLost = errors.New("the grant's lease may have passed to another worker")

// A Fence says whether the holder of a grant may still act on storage: nil
// while its lease surely holds, an error wrapping ErrLeaseLost once it may
// not. It is asked immediately before every step that changes storage.
type Fence func() error

type fenceKey struct{}

// WithFence returns a context under which every operation of a Client
// asks f before it changes storage (writes a chunk, deletes, renames,
// makes a directory, cleans up after a failure) and stops without that
// step once f refuses.
func WithFence(ctx context.Context, f Fence) context.Context {
	return context.WithValue(ctx, fenceKey{}, f)
}

// fenced returns the error of a step that the fence of ctx refuses, nil if
// the step may go ahead (or ctx has no fence).
func fenced(ctx context.Context, op, rawURL string) *Error {
	f, _ := ctx.Value(fenceKey{}).(Fence)
	if f == nil {
		return nil
	}
	if err := f(); err != nil {
		return fenceError(op, rawURL, err)
	}
	return nil
}

// fenceError is the error of a step that a fence refused with err.
func fenceError(op, rawURL string, err error) *Error {
	return &Error{Kind: dtr.ErrInternalProcess, Op: op, URL: rawURL, Err: fmt.Errorf("stopped before changing storage: %w", err)}
}

// mayAct reports whether the fence of ctx, if any, allows a step that
// changes storage.
func mayAct(ctx context.Context) bool { return fenced(ctx, "", "") == nil }

// IsLeaseLost reports whether err is a step that a Fence stopped.
func IsLeaseLost(err error) bool { return errors.Is(err, ErrLeaseLost) }

// CheckFence returns the error of a step on rawURL that the fence of ctx
// refuses, nil if the step may go ahead: for steps on storage made outside
// a Client (a hard link, say).
func CheckFence(ctx context.Context, op, rawURL string) error {
	if e := fenced(ctx, op, rawURL); e != nil {
		return e
	}
	return nil
}
