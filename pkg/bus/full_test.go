package bus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
)

// smallServer runs an embedded server whose JetStream store holds at most
// maxStore bytes, and connects to it.
func smallServer(t *testing.T, maxStore int64) jetstream.JetStream {
	t.Helper()
	ns, err := EmbeddedWith(t.TempDir(), 0, func(o *server.Options) { o.JetStreamMaxStore = maxStore })
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

// fill publishes 16 KiB messages to subject until JetStream refuses one,
// and returns the refusal.
func fill(t *testing.T, js jetstream.JetStream, subject string) error {
	t.Helper()
	data := make([]byte, 16<<10)
	for i := range 10000 {
		if _, err := js.Publish(context.Background(), subject, data); err != nil {
			return err
		}
		if i == 9999 {
			t.Fatalf("%s took 10000 messages of 16 KiB", subject)
		}
	}
	return nil
}

func TestJetStreamsRefusalsForWantOfSpaceAreStoreFull(t *testing.T) {
	ctx := context.Background()
	t.Run("the server's store is full: insufficient resources", func(t *testing.T) {
		js := smallServer(t, 1<<20)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FILL", Subjects: []string{"fill"}}); err != nil {
			t.Fatal(err)
		}
		err := fill(t, js, "fill")
		var api *jetstream.APIError
		if !errors.As(err, &api) || api.ErrorCode != JSErrCodeInsufficientResources || api.Code != 503 {
			t.Fatalf("refusal %v, want JetStream's 503 insufficient resources (10023)", err)
		}
		if !StoreFull(err) || FullReason(err) != "insufficient resources" {
			t.Fatalf("StoreFull(%v) = %v, reason %q", err, StoreFull(err), FullReason(err))
		}
		// A bucket on the same store is refused too.
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Create(ctx, "k", []byte("v")); !StoreFull(err) {
			t.Fatalf("a key created on a full store: %v, want a refusal for want of space", err)
		}
	})
	t.Run("a stream at its MaxBytes with DiscardNew: maximum bytes exceeded", func(t *testing.T) {
		js := smallServer(t, 64<<20)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WQ", Subjects: []string{"wq"},
			Retention: jetstream.WorkQueuePolicy, MaxBytes: 100 << 10, Discard: jetstream.DiscardNew}); err != nil {
			t.Fatal(err)
		}
		err := fill(t, js, "wq")
		var api *jetstream.APIError
		if !errors.As(err, &api) || api.ErrorCode != JSErrCodeStreamStoreFailed {
			t.Fatalf("refusal %v, want JetStream's stream store failure (10077)", err)
		}
		if !StoreFull(err) || FullReason(err) != "maximum bytes exceeded" {
			t.Fatalf("StoreFull(%v) = %v, reason %q", err, StoreFull(err), FullReason(err))
		}
	})
	t.Run("a bucket at its MaxBytes", func(t *testing.T) {
		js := smallServer(t, 64<<20)
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b", MaxBytes: 100 << 10})
		if err != nil {
			t.Fatal(err)
		}
		var last error
		for i := range 100 {
			if _, last = kv.Put(ctx, fmt.Sprint("k", i), make([]byte, 16<<10)); last != nil {
				break
			}
		}
		if !StoreFull(last) {
			t.Fatalf("a put to a full bucket: %v, want a refusal for want of space", last)
		}
	})
	t.Run("other refusals are not", func(t *testing.T) {
		js := smallServer(t, 64<<20)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}, MaxMsgSize: 10}); err != nil {
			t.Fatal(err)
		}
		_, tooLarge := js.Publish(ctx, "s", make([]byte, 100))
		_, wrongSeq := js.Publish(ctx, "s", nil, jetstream.WithExpectLastSequence(42))
		for _, err := range []error{nil, tooLarge, wrongSeq, errors.New("nats: timeout"), context.Canceled} {
			if StoreFull(err) {
				t.Errorf("StoreFull(%v) = true", err)
			}
		}
		if tooLarge == nil || wrongSeq == nil {
			t.Fatalf("refusals %v, %v: want both", tooLarge, wrongSeq)
		}
	})
	t.Run("a full disk", func(t *testing.T) {
		err := fmt.Errorf("store: %w", errors.New("write /data/jetstream/x: no space left on device"))
		if !StoreFull(err) {
			t.Fatal("no space left on device is not StoreFull")
		}
	})
}

func TestABatchHoldsAMessageTheStoreHasNoSpaceForUntilThereIsAndStoresItOnce(t *testing.T) {
	ctx := context.Background()
	js := smallServer(t, 1<<20)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FILL", Subjects: []string{"fill"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out"}, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := fill(t, js, "fill"); !StoreFull(err) {
		t.Fatalf("filling: %v", err)
	}
	var space Space
	b := NewBatch(ctx, js)
	b.Full = &space
	for i := range 3 {
		m := nats.NewMsg("out")
		m.Data = []byte{byte(i)}
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprint("m", i))
		b.Add(m)
	}
	waited := make(chan error, 1)
	go func() { waited <- b.Wait(ctx) }()
	// Held while the store is full: no error, the role reported full.
	deadline := time.Now().Add(5 * time.Second)
	for full, _, _ := space.Full(); !full; full, _, _ = space.Full() {
		if time.Now().After(deadline) {
			t.Fatal("the batch's refusals are not reported as full")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-waited:
		t.Fatalf("Wait returned %v while the store is full", err)
	case <-time.After(500 * time.Millisecond):
	}
	if d := space.Detail(); !strings.Contains(d, "store full") || !strings.Contains(d, "insufficient resources") {
		t.Fatalf("detail %q does not say the store is full and why", d)
	}
	freed := time.Now()
	if err := st.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("Wait after space returned: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait still holds 10 s after space returned")
	}
	t.Logf("stored %s after space returned", time.Since(freed).Round(time.Millisecond))
	out, err := js.Stream(ctx, "OUT")
	if err != nil {
		t.Fatal(err)
	}
	info, err := out.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 {
		t.Fatalf("OUT holds %d messages, want the 3 published once each", info.State.Msgs)
	}
	if space.Refusals() == 0 {
		t.Fatal("no refusal counted")
	}
}

func TestABatchWithoutFullFailsOnAFullStoreAsBefore(t *testing.T) {
	ctx := context.Background()
	js := smallServer(t, 1<<20)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FILL", Subjects: []string{"fill"}}); err != nil {
		t.Fatal(err)
	}
	if err := fill(t, js, "fill"); !StoreFull(err) {
		t.Fatalf("filling: %v", err)
	}
	b := NewBatch(ctx, js)
	b.Add(nats.NewMsg("fill"))
	if err := b.Wait(ctx); !StoreFull(err) {
		t.Fatalf("Wait: %v, want the refusal", err)
	}
}

func TestASpaceIsFullFromARefusalUntilAWriteIsStored(t *testing.T) {
	var s Space
	if full, _, _ := s.Full(); full || s.Detail() != "" {
		t.Fatal("full before any refusal")
	}
	refusal := &jetstream.APIError{Code: 503, ErrorCode: JSErrCodeInsufficientResources, Description: "insufficient resources"}
	if !s.Refused(refusal) {
		t.Fatal("the first refusal is not the first of its spell")
	}
	if s.Refused(refusal) {
		t.Fatal("the second refusal is the first of its spell")
	}
	full, reason, _ := s.Full()
	if !full || reason != "insufficient resources" {
		t.Fatalf("Full() = %v, %q", full, reason)
	}
	if d := s.Stored(); d <= 0 {
		t.Fatalf("Stored after refusals returned %s", d)
	}
	if full, _, _ := s.Full(); full {
		t.Fatal("still full after a write was stored")
	}
	if d := s.Stored(); d != 0 {
		t.Fatalf("Stored when not full returned %s", d)
	}
	var none *Space
	none.Refused(refusal) // a role without one: nothing happens
	if full, _, _ := none.Full(); full {
		t.Fatal("a nil Space is full")
	}
}

func TestEnsureGivesEveryStreamAndBucketItsLimit(t *testing.T) {
	ctx := context.Background()
	js := smallServer(t, 1<<30)
	// A stream as an earlier Sluice made it: no limit, DiscardOld.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: StreamSubmit, Subjects: []string{api.SubjectSubmit, api.SubjectCancelCommand},
		Retention: jetstream.WorkQueuePolicy, MaxMsgSize: MaxMessageBytes, Duplicates: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	l := Limits{Submit: 8 << 20, Grants: 9 << 20, Results: 10 << 20, Events: 11 << 20, Journal: 12 << 20, DTRs: 13 << 20, Jobs: 14 << 20, Rejections: 15 << 20}
	if err := Ensure(ctx, js, Setup{Limits: l}); err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		max     int64
		discard jetstream.DiscardPolicy
	}{
		StreamSubmit: {l.Submit, jetstream.DiscardNew}, StreamGrants: {l.Grants, jetstream.DiscardNew},
		StreamResults: {l.Results, jetstream.DiscardNew}, StreamEvents: {l.Events, jetstream.DiscardOld},
		StreamRejections:   {l.Rejections, jetstream.DiscardOld},
		StreamJournal:      {l.Journal, jetstream.DiscardNew},
		"KV_" + BucketDTRs: {l.DTRs, jetstream.DiscardNew}, "KV_" + BucketJobs: {l.Jobs, jetstream.DiscardNew},
	}
	check := func(scale int64) {
		t.Helper()
		for name, w := range want {
			st, err := js.Stream(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			cfg := st.CachedInfo().Config
			if cfg.MaxBytes != w.max*scale || cfg.Discard != w.discard {
				t.Errorf("%s: MaxBytes %d, %s; want %d, %s", name, cfg.MaxBytes, cfg.Discard, w.max*scale, w.discard)
			}
		}
	}
	check(1)
	// Other limits at the next start: the streams and buckets follow.
	l2 := Limits{Submit: 2 * l.Submit, Grants: 2 * l.Grants, Results: 2 * l.Results, Events: 2 * l.Events,
		Journal: 2 * l.Journal, DTRs: 2 * l.DTRs, Jobs: 2 * l.Jobs, Rejections: 2 * l.Rejections}
	if err := Ensure(ctx, js, Setup{Limits: l2}); err != nil {
		t.Fatal(err)
	}
	check(2)
	// Limits the server cannot reserve: an error that names the settings.
	err := Ensure(ctx, js, Setup{Limits: Limits{DTRs: 2 << 30}})
	if err == nil || !strings.Contains(err.Error(), "SLUICE_*_MAX_BYTES") {
		t.Fatalf("limits beyond the store: %v", err)
	}
	// A limit smaller than a message may be: refused before anything.
	err = Ensure(ctx, js, Setup{Limits: Limits{Journal: 1 << 20}})
	if err == nil || !strings.Contains(err.Error(), "SLUICE_JOURNAL_MAX_BYTES") {
		t.Fatalf("a 1 MiB journal: %v", err)
	}
}
