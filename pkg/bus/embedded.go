package bus

import (
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Embedded runs a NATS server with JetStream inside this process, storing
// its streams under dir and listening on a free loopback port: a loopback
// TCP connection measured 2–4× faster than nats.go's in-process connection
// under pipelined load here.
func Embedded(dir string, port int) (*server.Server, error) {
	return EmbeddedWith(dir, port, nil)
}

// EmbeddedWith is Embedded with its options changed by set first (a test's
// small JetStream store, say: JetStreamMaxStore).
func EmbeddedWith(dir string, port int, set func(*server.Options)) (*server.Server, error) {
	if port == 0 {
		port = -1 // a free port
	}
	opts := &server.Options{
		ServerName: "sluice-embedded",
		Host:       "127.0.0.1",
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		NoSigs:     true,
		NoLog:      true,
		MaxPayload: 8 << 20,
	}
	if set != nil {
		set(opts)
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS server: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded NATS server (store %s) not ready after 10s", dir)
	}
	return ns, nil
}
