package scheduler

import (
	"fmt"
	"testing"

	"github.com/google/uuid"
)

func TestSeenNeverForgetsAnIdAndRarelyClaimsANewOne(t *testing.T) {
	for _, tt := range []struct {
		name string
		ids  func(i int) uuid.UUID
		n    int
	}{
		{"random ids, within the first filter", func(int) uuid.UUID { return uuid.New() }, 100_000},
		// The generator's: SHA-1 of the job and the file's index.
		{"the generator's ids, over three filters", func(i int) uuid.UUID {
			return uuid.NewSHA1(uuid.NameSpaceURL, fmt.Appendf(nil, "sluice:job:j/%d", i))
		}, 4*firstCapacity + 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if testing.Short() && tt.n > firstCapacity {
				t.Skip("4M ids")
			}
			var s seen
			ids := make([]uuid.UUID, tt.n)
			for i := range ids {
				ids[i] = tt.ids(i)
				s.Add(ids[i])
			}
			for i, id := range ids {
				if !s.MayHave(id) {
					t.Fatalf("id %d of %d (%s) added and not found", i, tt.n, id)
				}
			}
			claimed := 0
			const fresh = 100_000
			for range fresh {
				if s.MayHave(uuid.New()) {
					claimed++
				}
			}
			// About 1% per filter that is full.
			if limit := fresh * 2 * len(s.filters) / 100; claimed > limit {
				t.Fatalf("%d of %d new ids claimed seen with %d filters, want at most %d", claimed, fresh, len(s.filters), limit)
			}
			t.Logf("%d ids in %d filters; %.2f%% of new ids claimed seen", tt.n, len(s.filters), 100*float64(claimed)/fresh)
		})
	}
}

func TestNothingIsSeenBeforeItIsAdded(t *testing.T) {
	var s seen
	if s.MayHave(uuid.New()) {
		t.Fatal("an empty filter claims an id")
	}
}
