package core

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestSortReplicasFollowsThePreferredPattern(t *testing.T) {
	urls := []string{"https://a.slow.example/f", "https://b.ndgf.org/f", "https://c.cern.ch/f", "https://d.ac.uk/f", "https://e.cern.ch.evil.org/f"}
	tests := []struct {
		pattern string
		want    []string
	}{
		{"", urls},
		{"cern.ch", []string{"https://c.cern.ch/f", "https://e.cern.ch.evil.org/f", "https://a.slow.example/f", "https://b.ndgf.org/f", "https://d.ac.uk/f"}},
		{"cern.ch$", []string{"https://c.cern.ch/f", "https://a.slow.example/f", "https://b.ndgf.org/f", "https://d.ac.uk/f", "https://e.cern.ch.evil.org/f"}},
		{".uk$|ndgf.org", []string{"https://d.ac.uk/f", "https://b.ndgf.org/f", "https://a.slow.example/f", "https://c.cern.ch/f", "https://e.cern.ch.evil.org/f"}},
		{"!slow.example|cern.ch$", []string{"https://c.cern.ch/f", "https://b.ndgf.org/f", "https://d.ac.uk/f", "https://e.cern.ch.evil.org/f"}},
		{"!example|!org|!uk|!ch", urls}, // excluding every one keeps them all
	}
	for _, tt := range tests {
		t.Run(tt.pattern, func(t *testing.T) {
			if got := SortReplicas(urls, tt.pattern); strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Fatalf("got\n%v\nwant\n%v", got, tt.want)
			}
		})
	}
	if got := SortReplicas([]string{"https://a/f", "https://a/f", "https://b/f"}, ""); len(got) != 2 {
		t.Fatalf("duplicates kept: %v", got)
	}
}

func TestAFailingSourceMovesToTheNextReplicaBeforeARetryIsSpent(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PreferredPattern = "b.example"
	h := newHarness(t, cfg)
	d := newDTR(1, "alice", dtr.Download)
	d.Source = "https://a.example/f"
	d.Replicas = []string{"https://b.example/f", "https://c.example/f"}
	h.submit(d)
	var sources []string
	fail := func(g Grant) *dtr.Failure {
		if g.State == dtr.QueryingReplica {
			sources = append(sources, g.DTR.Source)
			if !strings.HasPrefix(g.DTR.Source, "https://c.") {
				return &dtr.Failure{Kind: dtr.ErrPermanentRemote, Text: "404", Location: dtr.LocationSource}
			}
		}
		return nil
	}
	for i := 0; i < 50 && len(h.final) == 0; i++ {
		for _, g := range h.tick(time.Second) {
			h.answer(g, fail(g))
		}
	}
	f := h.final[d.ID]
	if f.State != dtr.Done || f.Attempts != 1 || f.Source != "https://c.example/f" {
		t.Fatalf("ended %s after %d attempts from %s; want DONE after 1 from the third replica", f.State, f.Attempts, f.Source)
	}
	if fmt.Sprint(sources) != "[https://b.example/f https://a.example/f https://c.example/f]" {
		t.Fatalf("replicas tried in the order %v, want the preferred one first", sources)
	}
}

func TestADestinationFailureIsNotCuredByAnotherReplica(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	d := newDTR(1, "alice", dtr.Download)
	d.Replicas = []string{"https://other.example/f"}
	h.submit(d)
	queried := 0
	for i := 0; i < 50 && len(h.final) == 0; i++ {
		for _, g := range h.tick(time.Second) {
			var f *dtr.Failure
			switch g.State {
			case dtr.QueryingReplica:
				queried++
			case dtr.PreCleaning:
				f = &dtr.Failure{Kind: dtr.ErrPermanentRemote, Text: "destination exists", Location: dtr.LocationDestination}
			}
			h.answer(g, f)
		}
	}
	if f := h.final[d.ID]; f.State != dtr.Error || queried != 1 {
		t.Fatalf("ended %s after %d source queries; want ERROR after 1 (the other replica would not help)", f.State, queried)
	}
}

func TestEveryRetryStartsFromTheFirstReplica(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxTransferTries, cfg.RetryBase = 2, time.Millisecond
	h := newHarness(t, cfg)
	d := newDTR(1, "alice", dtr.Download)
	d.Source, d.Replicas = "https://a.example/f", []string{"https://b.example/f"}
	h.submit(d)
	var sources []string
	for i := 0; i < 100 && len(h.final) == 0; i++ {
		for _, g := range h.tick(time.Second) {
			var f *dtr.Failure
			if g.State == dtr.QueryingReplica {
				sources = append(sources, g.DTR.Source)
				f = &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "503", Location: dtr.LocationSource}
			}
			h.answer(g, f)
		}
	}
	if fmt.Sprint(sources) != "[https://a.example/f https://b.example/f https://a.example/f https://b.example/f]" || h.final[d.ID].Attempts != 2 {
		t.Fatalf("sources tried %v over %d attempts; want both replicas in each of 2 attempts", sources, h.final[d.ID].Attempts)
	}
}

func TestAnExcludedSourceIsNotTriedWhenOneReplicaIsLeft(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PreferredPattern = "!a.example"
	h := newHarness(t, cfg)
	d := newDTR(1, "alice", dtr.Download)
	d.Source = "https://a.example/f"
	d.Replicas = []string{"https://b.example/f"}
	h.submit(d)
	var sources []string
	for i := 0; i < 50 && len(h.final) == 0; i++ {
		for _, g := range h.tick(time.Second) {
			if g.State == dtr.QueryingReplica {
				sources = append(sources, g.DTR.Source)
			}
			h.answer(g, nil)
		}
	}
	if f := h.final[d.ID]; f.State != dtr.Done || fmt.Sprint(sources) != "[https://b.example/f]" {
		t.Fatalf("ended %s, sources tried %v; want DONE from the one replica left", f.State, sources)
	}
}
