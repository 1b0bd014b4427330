package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// A load of the checkpoints whose watch stops before it has delivered
// every record (here its context ends half way; a closed connection does
// the same) is an error, and restores nothing: restoring the records read
// so far would lose the rest without a word.
func TestACheckpointLoadStoppedHalfWayIsAnErrorNotAPartialRestore(t *testing.T) {
	nc, js, kv := journalServer(t)
	ctx := context.Background()
	const n = 50_000
	out := bus.NewBatch(ctx, js)
	now := time.Now()
	for i := range n {
		r := rec(t, newDTR("f"), dtr.Transfer, now)
		m := nats.NewMsg("$KV." + bus.BucketDTRs + "." + r.id.String())
		m.Data = r.data
		out.Add(m)
		if out.Len() == 5000 || i == n-1 {
			if err := out.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	s, err := New(Config{}, nc, quiet())
	if err != nil {
		t.Fatal(err)
	}
	// The load is stopped once its watch has been sent some records.
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := js.Stream(ctx, "KV_"+bus.BucketDTRs)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for lctx.Err() == nil {
			cs := st.ListConsumers(lctx)
			for c := range cs.Info() {
				if c.Delivered.Consumer > 1000 {
					cancel()
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	err = s.loadCheckpoints(lctx, kv)
	if err == nil || !strings.Contains(err.Error(), "before it caught up") {
		t.Fatalf("a load stopped half way: %v; want it to say the watch ended before it caught up", err)
	}
	if s.core.Len() != 0 {
		t.Fatalf("%d of %d restored from a load stopped half way, want none", s.core.Len(), n)
	}
	// The same load let run restores them all.
	if err := s.loadCheckpoints(ctx, kv); err != nil {
		t.Fatal(err)
	}
	if s.core.Len() != n {
		t.Fatalf("%d restored, want %d", s.core.Len(), n)
	}
}
