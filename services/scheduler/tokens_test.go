package scheduler

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
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
