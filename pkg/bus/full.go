package bus

// A full JetStream store: how it is recognised, how each role follows it,
// and how long a role waits before it tries again.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream's refusals for want of space (nats-server's
// jetstream_errors_generated.go). A publish to a stream whose
// MaxBytes/MaxMsgs with DiscardNew is reached (a full work-queue stream or
// bucket) is refused with JSStreamStoreFailedF and the store's own error
// as its description.
const (
	// JSErrCodeAccountResourcesExceeded (400): the account's JetStream
	// limits are reached.
	JSErrCodeAccountResourcesExceeded = 10002
	// JSErrCodeInsufficientResources (503): the server's JetStream store
	// (max_file_store, max_memory_store) is full.
	JSErrCodeInsufficientResources = 10023
	// JSErrCodeMemoryResourcesExceeded and JSErrCodeStorageResourcesExceeded
	// (500): a stream's MaxBytes cannot be reserved.
	JSErrCodeMemoryResourcesExceeded  = 10028
	JSErrCodeStorageResourcesExceeded = 10047
	// JSErrCodeStreamStoreFailed (503): the stream's store refused the
	// message: "maximum bytes exceeded", "maximum messages exceeded" and
	// "maximum messages per subject exceeded" (a stream limit with
	// DiscardNew) or "no space left on device" (the disk under it).
	JSErrCodeStreamStoreFailed = 10077
)

// storeFullTexts are the descriptions of JSStreamStoreFailedF that mean a
// full stream or disk (any other store failure is not a matter of space).
var storeFullTexts = []string{
	"maximum bytes exceeded", "maximum messages exceeded", "maximum messages per subject exceeded",
	"no space left on device", "insufficient resources", "resources exceeded",
}

// StoreFull says whether err is JetStream refusing to store a message, or
// to create something, for want of space: its store, an account's limits,
// a stream's or bucket's limits, or the disk under them. Such a refusal
// ends when space returns (consumers take what they were given, a
// retention purges, an operator frees the disk), so the write is tried
// again later; any other refusal is not.
func StoreFull(err error) bool { return FullReason(err) != "" }

// FullReason returns JetStream's own words for a refusal for want of space
// ("insufficient resources", "maximum bytes exceeded", ...), or "" if err
// is no such refusal.
func FullReason(err error) string {
	if err == nil {
		return ""
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode {
		case JSErrCodeAccountResourcesExceeded, JSErrCodeInsufficientResources,
			JSErrCodeMemoryResourcesExceeded, JSErrCodeStorageResourcesExceeded:
			return api.Description
		case JSErrCodeStreamStoreFailed:
			if fullText(api.Description) {
				return api.Description
			}
		}
		return ""
	}
	// nats.go's older API and plain errors of a store that fails under a
	// full disk.
	if s := err.Error(); strings.Contains(s, "no space left on device") {
		return "no space left on device"
	}
	return ""
}

func fullText(s string) bool {
	s = strings.ToLower(s)
	for _, t := range storeFullTexts {
		if strings.Contains(s, t) {
			return true
		}
	}
	return false
}

// Space follows whether a role's writes to JetStream are refused for want
// of space, for /healthz and the sluice_store_full metric. A role reports
// each refusal (Refused) and each write stored after one (Stored). It is
// full from its first refusal until a write is stored, or until it has
// heard of no refusal for spaceForget (it has nothing left to write: a
// refused job submission, say, that was not sent again).
type Space struct {
	mu     sync.Mutex
	since  time.Time // the first refusal of the current spell; zero: not full
	last   time.Time // the latest refusal
	reason string
	count  int64 // refusals in all
}

// spaceForget is how long a role stays full without a new refusal: more
// than the longest pause between two tries (MaxBackoff).
const spaceForget = 30 * time.Second

// Refused records a refusal; err says why (StoreFull's kind of error).
// It returns true for the first refusal of a spell, which the role logs.
func (s *Space) Refused(err error) (first bool) {
	if s == nil {
		return false
	}
	reason := FullReason(err)
	if reason == "" && err != nil {
		reason = err.Error()
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.since.IsZero() || now.Sub(s.last) > spaceForget {
		s.since, first = now, true
	}
	s.last, s.reason = now, reason
	s.count++
	return first
}

// Stored records that a write was stored: space has returned. It returns
// how long the role's writes had been refused (0 if they were not).
func (s *Space) Stored() time.Duration {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.since.IsZero() {
		return 0
	}
	d := time.Since(s.since)
	s.since = time.Time{}
	return d
}

// Full reports whether the role's writes are refused for want of space:
// the reason as JetStream gave it, and since when.
func (s *Space) Full() (full bool, reason string, since time.Time) {
	if s == nil {
		return false, "", time.Time{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.since.IsZero() || time.Since(s.last) > spaceForget {
		return false, "", time.Time{}
	}
	return true, s.reason, s.since
}

// Refusals returns how many refusals for want of space the role has met.
func (s *Space) Refusals() int64 {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
}

// Detail says what a full Space means, for /healthz: "" if not full.
func (s *Space) Detail() string {
	full, reason, since := s.Full()
	if !full {
		return ""
	}
	return fmt.Sprintf("store full: JetStream refuses to store (%s) since %s; trying again", reason,
		since.UTC().Format(time.RFC3339))
}

// spaces holds the Space of each connection: every role has its own
// connection (internal/app), so this is the role's.
var spaces sync.Map // *nats.Conn → *Space

// SpaceOf returns the Space of the role on nc (a new one, followed by
// nobody, if nc is nil).
func SpaceOf(nc *nats.Conn) *Space {
	if nc == nil {
		return new(Space)
	}
	s, _ := spaces.LoadOrStore(nc, new(Space))
	return s.(*Space)
}

// ForgetSpace drops nc's Space once its role has ended.
func ForgetSpace(nc *nats.Conn) { spaces.Delete(nc) }

// The pauses between tries of a write refused for want of space: from
// MinBackoff, doubled at each refusal, up to MaxBackoff.
const (
	MinBackoff = 100 * time.Millisecond
	MaxBackoff = 5 * time.Second
)

// untilStored publishes m again, after a growing pause, while JetStream
// refuses it for want of space (err is the first refusal), until it is
// stored or ctx ends. Each refusal goes to b.Full. A message refused is
// not stored, so sending it again stores it once (and it carries the same
// Nats-Msg-Id in any case).
func (b *Batch) untilStored(ctx context.Context, m *nats.Msg, err error) (uint64, error) {
	var pause Backoff
	timeouts := 0
	for {
		if StoreFull(err) {
			if b.Full.Refused(err) {
				slog.Warn("JetStream store full: a message is held back and published again once there is room",
					"subject", m.Subject, "reason", FullReason(err))
			}
			timeouts = 0
		} else if timeouts++; timeouts >= ackTries {
			return 0, fmt.Errorf("publish to %s: %w", m.Subject, err)
		}
		if !pause.Sleep(ctx) {
			return 0, fmt.Errorf("publish to %s: the store is full (%s) and %w", m.Subject, FullReason(err), ctx.Err())
		}
		pctx, cancel := context.WithTimeout(ctx, ackTimeout)
		var ack *jetstream.PubAck
		ack, err = b.js.PublishMsg(pctx, m)
		cancel()
		if err == nil {
			return ack.Sequence, nil
		}
		if ctx.Err() != nil {
			return 0, fmt.Errorf("publish to %s: %w", m.Subject, ctx.Err())
		}
		var api *jetstream.APIError
		if errors.As(err, &api) && !StoreFull(err) {
			return 0, fmt.Errorf("publish to %s: %w", m.Subject, err) // refused for another reason
		}
	}
}
