package worker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
)

// maxBatchResults bounds the results of one Results event.
const maxBatchResults = 256

// resultSender publishes the results of one pool's grants. The results
// handed to it while it publishes go together in the next Results event,
// so that a busy stage sends one message for many grants and an idle one
// sends each result at once.
type resultSender struct {
	js      jetstream.JetStream
	subject string
	source  string
	// maxBytes bounds a message: a batch larger than it is split.
	maxBytes int
	in       chan *pendingResult
	// stopping is closed when the pool stops: from then on a result is
	// given up after publishTries.
	stopping chan struct{}
	// space follows the results refused for want of space; such a
	// result is held back and published again until it is stored.
	space *bus.Space
}

type pendingResult struct {
	r    api.Result
	done chan error
}

func newResultSender(nc *nats.Conn, js jetstream.JetStream, subject, source string) *resultSender {
	maxBytes := int(nc.MaxPayload()) / 2
	if maxBytes <= 0 {
		maxBytes = bus.MaxMessageBytes / 2
	}
	return &resultSender{js: js, subject: subject, source: source, maxBytes: maxBytes, in: make(chan *pendingResult, maxBatchResults),
		stopping: make(chan struct{}), space: bus.SpaceOf(nc)}
}

// pendingResults are the pending results (and their channels) of results
// answered, for the next ones: every grant's result has one.
var pendingResults = sync.Pool{New: func() any { return &pendingResult{done: make(chan error, 1)} }}

// send hands r to the sender and returns once it is stored, or why not.
func (s *resultSender) send(ctx context.Context, r api.Result) error {
	p := pendingResults.Get().(*pendingResult)
	p.r = r
	select {
	case s.in <- p:
	case <-ctx.Done():
		p.r = api.Result{}
		pendingResults.Put(p)
		return ctx.Err()
	}
	// The sender answers every result it took, within its publish
	// timeout, even while the pool shuts down: once answered, the
	// sender is done with p.
	err := <-p.done
	p.r = api.Result{}
	pendingResults.Put(p)
	return err
}

// run publishes until ctx ends; a result handed over before then is
// answered.
func (s *resultSender) run(ctx context.Context) {
	var batch []*pendingResult
	go func() { <-ctx.Done(); close(s.stopping) }()
	for {
		batch = batch[:0]
		select {
		case p := <-s.in:
			batch = append(batch, p)
		case <-ctx.Done():
			return
		}
	more:
		for len(batch) < maxBatchResults {
			select {
			case p := <-s.in:
				batch = append(batch, p)
			default:
				break more
			}
		}
		s.publish(batch)
	}
}

// publish sends a batch as one Results event, or as several when it is
// too large for one message, and tells each result's sender the outcome.
func (s *resultSender) publish(batch []*pendingResult) {
	rs := api.Results{Results: make([]api.Result, len(batch))}
	for i, p := range batch {
		rs.Results[i] = p.r
	}
	err := s.publishResults(rs)
	if tooLarge(err) && len(batch) > 1 {
		s.publish(batch[:len(batch)/2])
		s.publish(batch[len(batch)/2:])
		return
	}
	for _, p := range batch {
		p.done <- err
	}
}

var errTooLarge = errors.New("results event too large")

func tooLarge(err error) bool { return errors.Is(err, errTooLarge) }

func (s *resultSender) publishResults(rs api.Results) error {
	ev, err := codec.NewEvent(api.TypeResults, s.source, "", rs)
	if err != nil {
		return err
	}
	// The event id is the message id: a publish tried again after a lost
	// acknowledgement is stored once.
	m, err := codec.Encode(context.Background(), s.subject, "", ev)
	if err != nil {
		return err
	}
	if len(m.Data) > s.maxBytes && len(rs.Results) > 1 {
		return errTooLarge
	}
	// While NATS fails over, or is away, a publish can go unanswered or be
	// refused, and while JetStream has no space for it, it is refused: the
	// same message (the same id, stored once) is sent again until it is
	// stored, however long that takes, so that work finished meanwhile is
	// reported (the scheduler's lease clock stood still while it could not
	// hear), and once the pool stops for about half a minute more.
	var full bus.Backoff
	afterStop := 0 // tries since the pool stopped
	for try := 1; ; try++ {
		pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = s.js.PublishMsg(pctx, m)
		cancel()
		if err == nil {
			s.space.Stored()
			return nil
		}
		if s.stopped() {
			if afterStop++; afterStop >= publishTries {
				return err
			}
		}
		pause := min(time.Duration(try)*500*time.Millisecond, 5*time.Second)
		if bus.StoreFull(err) {
			if s.space.Refused(err) {
				slog.Warn("JetStream store full: results are held back and published again once there is room",
					"subject", s.subject, "reason", bus.FullReason(err))
			}
			pause = full.Next()
		}
		time.Sleep(pause)
	}
}

func (s *resultSender) stopped() bool {
	select {
	case <-s.stopping:
		return true
	default:
		return false
	}
}

// publishTries is how often a Results event is sent, once the pool stops,
// before its results are given up (their grants' leases then run out).
const publishTries = 6
