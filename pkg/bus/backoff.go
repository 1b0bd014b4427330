package bus

import (
	"context"
	"time"
)

// Backoff is the pause before the next try of something refused: from
// Min, doubled at each try, up to Max (zero: MinBackoff and MaxBackoff,
// the pauses of a write refused for want of space).
type Backoff struct {
	Min, Max time.Duration
	next     time.Duration
}

// Next returns the pause before the next try and doubles the one after
// it, up to Max.
func (b *Backoff) Next() time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = MinBackoff
	}
	if hi <= 0 {
		hi = MaxBackoff
	}
	d := max(b.next, lo)
	b.next = min(2*d, hi)
	return d
}

// Reset starts again from Min (a write was stored).
func (b *Backoff) Reset() { b.next = 0 }

// Sleep waits for the next pause; false if ctx ended first.
func (b *Backoff) Sleep(ctx context.Context) bool {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
