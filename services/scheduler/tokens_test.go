package scheduler

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/token/tokentest"
)

func TestATransferIsExpectedToTakeItsSizeAtHalfItsLinksRecentThroughputOrTheFloor(t *testing.T) {
	const floor = 1e6 // bytes/s
	start := time.Date(2026, 11, 26, 7, 0, 0, 0, time.UTC)
	done := func(src, dst string, bytes int64, took time.Duration) *dtr.DTR {
		return &dtr.DTR{Source: src, Destination: dst, State: dtr.Done, Bytes: bytes, Started: start, Ended: start.Add(took)}
	}
	l := newLinkRates()
	// a → b moved 100 MB/s, then 40 MB/s: a third of the way, 80 MB/s.
	l.observe(done("https://a.example/f", "https://b.example/g", 1e9, 10*time.Second))
	l.observe(done("https://a.example/f2", "https://b.example/g2", 4e8, 10*time.Second))
	// What teaches nothing: a failure, nothing moved, no time taken.
	l.observe(&dtr.DTR{Source: "https://c.example/f", Destination: "https://b.example/g", State: dtr.Error, Bytes: 1e9, Started: start, Ended: start.Add(time.Second)})
	l.observe(done("https://c.example/f", "https://b.example/g", 0, time.Second))
	l.observe(done("https://c.example/f", "https://b.example/g", 1e9, 0))
	tests := []struct {
		name     string
		d        dtr.DTR
		expected time.Duration
	}{
		{"a link seen: half its 80 MB/s", dtr.DTR{Source: "https://a.example/x", Destination: "https://b.example/y", Size: 4e9}, 100 * time.Second},
		{"another link: the floor", dtr.DTR{Source: "https://c.example/x", Destination: "https://b.example/y", Size: 4e9}, 4000 * time.Second},
		{"the other way round is another link", dtr.DTR{Source: "https://b.example/x", Destination: "https://a.example/y", Size: 1e6}, time.Second},
		{"size unknown: nothing said", dtr.DTR{Source: "https://a.example/x", Destination: "https://b.example/y"}, 0},
		{"into the cache: the cache's link", dtr.DTR{Source: "https://a.example/x", Destination: "https://b.example/y", Cache: dtr.CacheDownload, CacheFile: "file:///cache/ab", Size: 2e6}, 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.d.ID = uuid.New()
			if got := l.expected(&tt.d, floor); got != tt.expected {
				t.Fatalf("expected %v, want %v", got, tt.expected)
			}
		})
	}
	if got := l.expected(&dtr.DTR{Source: "https://c.example/x", Destination: "https://b.example/y", Size: 1}, 0); got != 0 {
		t.Fatalf("no floor and no link: %v, want nothing said", got)
	}
}

func TestASubmitterCannotNameATokenRef(t *testing.T) {
	_, err := decodeSubmission([]byte(`{"id":"` + uuid.NewString() + `","source":"https://a.example/f","destination":"https://b.example/f","token_ref":"tSOMEONEELSES"}`))
	if err == nil || !strings.Contains(err.Error(), "token_ref") {
		t.Fatalf("a submission naming a token_ref: %v, want it refused", err)
	}
}

// tokenBucket sets up the streams and buckets on a real embedded NATS
// server, the bucket of submitters' tokens holding at most maxBytes and
// its entries at most ttl, and opens that bucket.
func tokenBucket(t *testing.T, maxBytes int64, ttl time.Duration) jetstream.KeyValue {
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
	js, _ := jetstream.New(nc)
	if err := bus.Ensure(t.Context(), js, bus.Setup{Limits: bus.Limits{SubjectTokens: maxBytes}, SubjectTokenTTL: ttl}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), bus.BucketSubjectTokens)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// TestAKeptTokenIsGoneFromTheBucketWhenItExpires: an entry lives as long
// as its token, not the bucket's 24 hours; a token that has expired is
// not kept at all; one without exp lives the bucket's TTL.
func TestAKeptTokenIsGoneFromTheBucketWhenItExpires(t *testing.T) {
	iss := tokentest.Start(t)
	kv := tokenBucket(t, bus.MinLimit, 24*time.Hour)
	k := newTokenKeeper(kv, 24*time.Hour)
	if st, err := kv.Status(t.Context()); err != nil || st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.MaxBytes != bus.MinLimit {
		t.Fatalf("the bucket's limit: %v, want %d bytes", err, bus.MinLimit)
	}
	short := iss.Mint(t, tokentest.Mint{Subject: "alice", Expiry: time.Now().Add(2 * time.Second)})
	ref, err := k.keep(t.Context(), short, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(t.Context(), bus.SubjectTokenKey(ref)); err != nil {
		t.Fatalf("the token just kept: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := kv.Get(t.Context(), bus.SubjectTokenKey(ref))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the entry of a token that expired is still there 10 s later: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	expired := iss.Mint(t, tokentest.Mint{Subject: "alice", Expiry: time.Now().Add(-time.Second)})
	if ref, err := k.keep(t.Context(), expired, time.Now()); !errors.Is(err, errTokenExpired) || ref != "" {
		t.Fatalf("an expired token: %q, %v; want it not kept", ref, err)
	}
}

// TestAKeptTokenIsReusedWhileItsEntryHasHalfTheLifeANewOneWouldHave: the
// rule that operations.md states, on a fake clock.
func TestAKeptTokenIsReusedWhileItsEntryHasHalfTheLifeANewOneWouldHave(t *testing.T) {
	iss := tokentest.Start(t)
	kv := tokenBucket(t, 0, time.Hour)
	k := newTokenKeeper(kv, time.Hour)
	now := time.Now()
	long := iss.Mint(t, tokentest.Mint{Subject: "alice", Expiry: now.Add(10 * time.Hour)})
	short := iss.Mint(t, tokentest.Mint{Subject: "bob", Expiry: now.Add(20 * time.Minute)})
	for _, tt := range []struct {
		name  string
		raw   string
		after time.Duration
		same  bool
	}{
		{"a token that outlives the TTL, a quarter of it later", long, 15 * time.Minute, true},
		{"a token that outlives the TTL, past half of it", long, 31 * time.Minute, false},
		{"a token that expires before the TTL, near its end", short, 19 * time.Minute, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			first, err := k.keep(t.Context(), tt.raw, now)
			if err != nil {
				t.Fatal(err)
			}
			again, err := k.keep(t.Context(), tt.raw, now.Add(tt.after))
			if err != nil {
				t.Fatal(err)
			}
			if (first == again) != tt.same {
				t.Errorf("reused: %v, want %v", first == again, tt.same)
			}
		})
	}
}

// TestAFullTokenBucketAdmitsTheDTRsWithoutTheirTokenAndSchedulingGoesOn:
// with the bucket full, keeping a token does not fail the scheduler's
// step (which would stop all scheduling): the message's DTRs are marked
// as submitted with a token and get none, so they fail saying so.
func TestAFullTokenBucketAdmitsTheDTRsWithoutTheirTokenAndSchedulingGoesOn(t *testing.T) {
	iss := tokentest.Start(t)
	kv := tokenBucket(t, bus.MinLimit, time.Hour)
	// Filled to the last few bytes: no token fits.
	n := 0
	for _, size := range []int{60 << 10, 4 << 10, 256} {
		for {
			if _, err := kv.Put(t.Context(), "filler"+uuid.NewString()[:8], bytes.Repeat([]byte("x"), size)); err != nil {
				break
			}
			if n++; n > 10000 {
				t.Fatal("the bucket never filled")
			}
		}
	}
	var logs bytes.Buffer
	s := &Service{log: slog.New(slog.NewTextHandler(&logs, nil)), keeper: newTokenKeeper(kv, time.Hour)}
	alice := iss.Mint(t, tokentest.Mint{Subject: "alice"})
	sub := submitted{caller: auth.Caller{Via: auth.ViaToken}}
	s.keepToken(t.Context(), time.Now(), nats.Header{"Authorization": {"Bearer " + alice}}, &sub)
	if sub.err != nil || !sub.withToken || sub.tokenRef != "" {
		t.Fatalf("err %v, with a token %v, ref %q: want the DTRs taken, marked, with no ref", sub.err, sub.withToken, sub.tokenRef)
	}
	if !strings.Contains(logs.String(), "is not kept") || strings.Contains(logs.String(), alice[strings.LastIndex(alice, ".")+1:]) {
		t.Errorf("the log says %q: want it to say the token is not kept, without the token", logs.String())
	}
}
