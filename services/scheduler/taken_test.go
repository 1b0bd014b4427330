package scheduler

import (
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestTheSameTransferHasTheSameDestinationAndSources(t *testing.T) {
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
		{"a replica more", dtr.DTR{Source: "http://a/f", Replicas: []string{"http://b/f", "http://c/f"}, Destination: "file:///d/f"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sameTransfer(earlier, &tt.d); got != tt.same {
				t.Fatalf("sameTransfer = %v, want %v", got, tt.same)
			}
		})
	}
}
