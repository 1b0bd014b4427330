package scheduler

// The acknowledgements that wait for the history: a step's inputs are
// acknowledged only once its history events are stored (so that a leader's
// crash loses none: at least once), but the committer does not wait for
// that. It hands each commit's acknowledgements to the
// history's acker, which sends them once the writer has stored the
// commit's events. The writer is asked to store what it holds once the
// oldest commit waiting has waited historyAckDelay: a DTR's events of the
// steps within that time go out as one message, not one message a step.

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// historyAckDelay is how long a commit's acknowledgements may wait for
// the history's writer to store on its own before it is asked to store at
// once.
const historyAckDelay = time.Second

// heldAcks are a commit's acknowledgements and terminations,
// waiting for the batches of history up to ticket to be stored.
type heldAcks struct {
	ticket      uint64
	at          time.Time
	terms, acks []jetstream.Msg
}

// send terminates the refused inputs and acknowledges the others.
func (h heldAcks) send() {
	for _, m := range h.terms {
		_ = m.Term()
	}
	for _, m := range h.acks {
		_ = m.Ack()
	}
}

// ackWhenStored hands the acknowledgements of commits whose records are
// journaled and whose outputs are published to the history's acker, to be
// sent once the history up to ticket is stored. It returns false, handing
// nothing, if there is no writer (history off) or no history was ever
// handed over, or if a commit has a caller waiting for it (done): such a
// caller hears of a change only once its history can be read, so the
// committer waits for it (awaitHistory) and acknowledges itself.
func (s *Service) ackWhenStored(ticket uint64, cs []*commit) bool {
	w := s.historyWriter.Load()
	if w == nil || ticket == 0 {
		return false
	}
	for _, c := range cs {
		if c.done != nil {
			return false
		}
	}
	h := heldAcks{ticket: ticket, at: time.Now()}
	for _, c := range cs {
		h.terms = append(h.terms, c.terms...)
		h.acks = append(h.acks, c.acks...)
	}
	return w.holdAcks(h)
}

// holdAcks queues h for the acker; false once the acker has stopped.
func (w *historyWriter) holdAcks(h heldAcks) bool {
	w.acksMu.Lock()
	defer w.acksMu.Unlock()
	if w.acks == nil || w.acksClosed {
		return false
	}
	w.acks <- h
	return true
}

// stopAcks ends the acker once it has taken what was queued.
func (w *historyWriter) stopAcks() {
	w.acksMu.Lock()
	defer w.acksMu.Unlock()
	if w.acks != nil && !w.acksClosed {
		w.acksClosed = true
		close(w.acks)
	}
}

// ackStored is the acker: it sends each commit's acknowledgements, in the
// order handed over, once the writer has stored the commit's history, or
// at once while the store lags (awaitHistory). What is still unstored when
// the writer has stopped (writerDone), and everything once this leader's
// term may have lapsed, is left unacknowledged, to be delivered again to
// whoever leads.
func (s *Service) ackStored(w *historyWriter, writerDone <-chan struct{}) {
	// asked is when the writer was last asked to store: it is asked at
	// most once every historyAckDelay.
	var asked time.Time
	for h := range w.acks {
		askAt := h.at
		if asked.After(askAt) {
			askAt = asked
		}
		askAt = askAt.Add(historyAckDelay)
		stored, askedAt := w.awaitStored(h.ticket, askAt, writerDone)
		if !askedAt.IsZero() {
			asked = askedAt
		}
		if !stored {
			continue
		}
		if s.election != nil && s.election.lapsed(time.Now()) {
			continue
		}
		h.send()
	}
}

// awaitStored waits until the writer has stored the first ticket batches,
// asking it to store what it holds from askAt on (asked: when it first
// asked, zero if it did not); it gives up after historyAwait of asking as
// awaitHistory does (the store lags: true), and says false if the writer
// stopped before storing them.
func (w *historyWriter) awaitStored(ticket uint64, askAt time.Time, writerDone <-chan struct{}) (stored bool, asked time.Time) {
	if w.lagging.Load() {
		w.stats.unawaited.Add(1)
		return true, asked
	}
	ask := time.NewTimer(time.Until(askAt))
	defer ask.Stop()
	var deadline <-chan time.Time
	for {
		grown, done := w.storedUpTo()
		if done >= ticket {
			return true, asked
		}
		if deadline != nil {
			w.askToStore()
		}
		select {
		case <-grown:
		case now := <-ask.C:
			asked, deadline = now, time.After(historyAwait)
		case <-deadline:
			w.lag()
			w.stats.unawaited.Add(1)
			return true, asked
		case <-writerDone:
			_, done := w.storedUpTo()
			return done >= ticket, asked
		}
	}
}

// askToStore asks the writer to store what it holds at once.
func (w *historyWriter) askToStore() {
	select {
	case w.flushNow <- struct{}{}:
	default:
	}
}

// startAcker starts the acker of w; the function returned stops it once
// the writer has stopped (writerDone is closed), waiting for it to finish.
func (s *Service) startAcker(w *historyWriter, writerDone <-chan struct{}) (stop func()) {
	w.acks = make(chan heldAcks, historyQueue)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.ackStored(w, writerDone)
	}()
	return func() {
		w.stopAcks()
		<-done
	}
}
