// Package bustest runs, for a test, an embedded NATS JetStream server with
// Sluice's streams, consumers and buckets.
package bustest

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/bus"
)

// Server starts an embedded server that lives as long as the test, sets up
// what Sluice uses on it (bus.Ensure) and returns a connection to it.
func Server(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	ns, err := bus.Embedded(t.TempDir(), 0)
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
	if err := bus.Ensure(context.Background(), js, bus.Setup{}); err != nil {
		t.Fatal(err)
	}
	return nc, js
}
