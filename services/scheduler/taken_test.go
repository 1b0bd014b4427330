package scheduler

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

func TestTheSameTransferHasTheSameDestinationAndTheSourcesKept(t *testing.T) {
	earlier := &dtr.DTR{Source: "http://b/f", Destination: "file:///d/f",
		Replicas: []string{"http://b/f", "http://a/f"}, Replica: 1} // as the core keeps it: sorted, Source moved on
	tests := []struct {
		name string
		d    dtr.DTR
		same bool
	}{
		{"the same source and replicas", dtr.DTR{Source: "http://a/f", Replicas: []string{"http://b/f"}, Destination: "file:///d/f"}, true},
		{"the replicas in another order", dtr.DTR{Source: "http://b/f", Replicas: []string{"http://a/f"}, Destination: "file:///d/f"}, true},
		{"a source repeated among the replicas", dtr.DTR{Source: "http://a/f", Replicas: []string{"http://a/f", "http://b/f"}, Destination: "file:///d/f"}, true},
		{"another destination", dtr.DTR{Source: "http://a/f", Replicas: []string{"http://b/f"}, Destination: "file:///d/g"}, false},
		{"a replica missing", dtr.DTR{Source: "http://a/f", Destination: "file:///d/f"}, false},
		{"a replica more (one the preferred pattern dropped)", dtr.DTR{Source: "http://a/f", Replicas: []string{"http://b/f", "http://c/f"}, Destination: "file:///d/f"}, true},
		{"another source altogether", dtr.DTR{Source: "http://c/f", Destination: "file:///d/f"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sameTransfer(earlier, &tt.d); got != tt.same {
				t.Fatalf("sameTransfer = %v, want %v", got, tt.same)
			}
		})
	}
}

func TestAResubmissionIsTheSameTransferWhateverThePreferredPatternDropped(t *testing.T) {
	for _, pattern := range []string{"", "b.example", "!a.example", "!c.example", "!example"} {
		t.Run(pattern, func(t *testing.T) {
			cfg := core.DefaultConfig()
			cfg.PreferredPattern = pattern
			c := core.New(cfg)
			submitted := func() *dtr.DTR {
				return &dtr.DTR{ID: uuid.MustParse("6ba7b810-9dad-11d1-80b4-00c04fd430c8"), Source: "https://a.example/f",
					Replicas: []string{"https://b.example/f", "https://c.example/f"}, Destination: "file:///d/f"}
			}
			if err := c.Submit(time.Now(), submitted()); err != nil {
				t.Fatal(err)
			}
			held, ok := c.Get(submitted().ID)
			if !ok {
				t.Fatal("the core does not hold the DTR")
			}
			if !sameTransfer(&held, submitted()) {
				t.Fatalf("the DTR as held (%s, replicas %v) is not the one submitted again", held.Source, held.Replicas)
			}
		})
	}
}
