package bus

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// An acknowledgement lost in a fail-over: the server takes the publish and
// never answers. Here a responder on the subject plays the stream that
// answers only from the n-th try on.
func TestBatchPublishesAgainWhenAnAcknowledgementNeverComes(t *testing.T) {
	old, oldPause := ackTimeout, retryPause
	ackTimeout, retryPause = 100*time.Millisecond, 10*time.Millisecond
	defer func() { ackTimeout, retryPause = old, oldPause }()
	for _, tt := range []struct {
		name      string
		answerAt  int32 // the try the responder answers; 0: never
		wantTries int32
		wantErr   string
	}{
		{"answered at once", 1, 1, ""},
		{"lost once, answered the second time", 2, 2, ""},
		{"lost five times", 6, 6, ""},
		{"never answered", 0, ackTries, "no acknowledgement"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			js := embeddedJS(t)
			nc := js.Conn()
			var tries atomic.Int32
			sub, err := nc.Subscribe("lossy", func(m *nats.Msg) {
				if n := tries.Add(1); tt.answerAt != 0 && n >= tt.answerAt {
					_ = m.Respond([]byte(`{"stream":"LOSSY","seq":1}`))
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			b := NewBatch(context.Background(), js)
			b.Add(nats.NewMsg("lossy"))
			err = b.Wait(context.Background())
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("Wait: %v, want %q", err, tt.wantErr)
			}
			if got := tries.Load(); got != tt.wantTries {
				t.Fatalf("%d tries, want %d", got, tt.wantTries)
			}
		})
	}
}

// A stream without a leader for a while (an election after its server
// died): every publish is answered at once with "no response from stream".
// The tries wait for it, instead of spending all six within milliseconds.
func TestBatchWaitsForAStreamThatElectsALeader(t *testing.T) {
	old := ackTimeout
	ackTimeout = 100 * time.Millisecond
	defer func() { ackTimeout = old }()
	js := embeddedJS(t)
	nc := js.Conn()
	elected := make(chan struct{})
	go func() {
		time.Sleep(1200 * time.Millisecond) // no responder until then
		sub, err := nc.Subscribe("leaderless", func(m *nats.Msg) {
			_ = m.Respond([]byte(`{"stream":"LEADERLESS","seq":7}`))
		})
		if err != nil {
			t.Error(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		close(elected)
	}()
	b := NewBatch(context.Background(), js)
	b.Add(nats.NewMsg("leaderless"))
	if err := b.Wait(context.Background()); err != nil {
		t.Fatalf("Wait: %v; want the publish taken once the stream answers", err)
	}
	<-elected
	if b.Last != 7 {
		t.Fatalf("Last %d, want the acknowledged sequence 7", b.Last)
	}
}
