package scheduler

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus/bustest"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// ackedInput is a consumed message that notes its acknowledgement.
type ackedInput struct {
	jetstream.Msg
	acked chan struct{}
}

func (m *ackedInput) Ack() error { close(m.acked); return nil }

func TestInputsAreAcknowledgedOnlyOnceTheirHistoryIsStoredWithoutTheCommitterWaiting(t *testing.T) {
	nc, js := bustest.Server(t)
	ctx := context.Background()
	var dropped atomic.Uint64
	s := &Service{nc: nc, js: js, log: quiet(), historyStats: &historyStats{}, history: &historyRecorder{dropped: &dropped}}
	s.journal = newJournal(js, nil, quiet(), 1<<20, time.Hour, 0)
	in := make(chan []historyItem, historyQueue)
	s.history.out = in
	w := &historyWriter{js: js, log: quiet(), in: in, stats: s.historyStats, flushNow: make(chan struct{}, 1), stored: make(chan struct{})}
	s.history.queued = &w.queued
	s.historyWriter.Store(w)
	wctx, cancel := context.WithCancel(ctx)
	written := make(chan struct{})
	go func() { defer close(written); w.run(wctx) }()
	stopAcker := s.startAcker(w, written)
	defer func() { close(in); <-written; cancel(); stopAcker() }()

	step := func(done func(error)) (uuid.UUID, *ackedInput) {
		id := uuid.New()
		input := &ackedInput{acked: make(chan struct{})}
		c := &commit{records: []record{{id: id, data: []byte(`{"id":"` + id.String() + `"}`)}},
			events: []historyItem{{id: id, first: true, ev: api.HistoryEvent{Time: time.Now(), State: dtr.New}}},
			acks:   []jetstream.Msg{input}, done: done}
		began := time.Now()
		if err := s.carryOut(ctx, []*commit{c}); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(began); done == nil && took >= historyAckDelay {
			t.Errorf("the commit took %s: it waited for its history", took)
		}
		return id, input
	}
	for _, asked := range []bool{false, true} {
		var done func(error)
		if asked { // a change asked through the API: its caller hears of it once its history can be read
			done = func(error) {}
		}
		id, input := step(done)
		if asked {
			select {
			case <-input.acked:
			default:
				t.Fatal("a change asked through the API: its input is not acknowledged when the commit is done")
			}
		}
		select {
		case <-input.acked:
		case <-time.After(historyAckDelay + historyAwait):
			t.Fatalf("asked %v: the input is not acknowledged", asked)
		}
		if events, _, err := readHistory(ctx, js, id); err != nil || len(events) != 1 {
			t.Fatalf("asked %v: acknowledged with its history %+v (%v): want its event stored first", asked, events, err)
		}
	}
}
