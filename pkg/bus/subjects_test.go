package bus

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestEnsureCreatesEverythingAndLeavesItAloneTheSecondTime(t *testing.T) {
	js := embeddedJS(t)
	nc := js.Conn()
	ctx := context.Background()
	if err := Ensure(ctx, js, Setup{}); err != nil {
		t.Fatal(err)
	}
	created := map[string]int64{}
	for _, name := range []string{StreamSubmit, StreamGrants, StreamResults, StreamEvents} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		created[name] = st.CachedInfo().Created.UnixNano()
	}
	for _, c := range [][2]string{{StreamSubmit, ConsumerSched}, {StreamResults, ConsumerSched}, {StreamEvents, ConsumerGen},
		{StreamGrants, "pre"}, {StreamGrants, "delivery"}, {StreamGrants, "post"}} {
		if _, err := js.Consumer(ctx, c[0], c[1]); err != nil {
			t.Fatalf("consumer %s on %s: %v", c[1], c[0], err)
		}
	}
	// A second Ensure changes nothing: JetStream announces no update and no
	// creation.
	advisories, err := nc.SubscribeSync("$JS.EVENT.ADVISORY.>")
	if err != nil {
		t.Fatal(err)
	}
	second := time.Now()
	if err := Ensure(ctx, js, Setup{}); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	for {
		m, err := advisories.NextMsg(200 * time.Millisecond)
		if err != nil {
			break
		}
		// The server sends advisories on its own time: one of the first
		// Ensure's may come only now. Its timestamp tells.
		var a struct {
			Timestamp time.Time `json:"timestamp"`
		}
		if json.Unmarshal(m.Data, &a) == nil && a.Timestamp.Before(second) {
			continue
		}
		if strings.Contains(m.Subject, "UPDATED") || strings.Contains(m.Subject, "CREATED") {
			t.Fatalf("the second Ensure changed something: %s", m.Subject)
		}
	}
	for name, at := range created {
		st, _ := js.Stream(ctx, name)
		if st.CachedInfo().Created.UnixNano() != at {
			t.Fatalf("stream %s was made again", name)
		}
	}
}

// embeddedJS returns JetStream on an embedded server that lives as long as
// the test.
func embeddedJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	ns, err := Embedded(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
