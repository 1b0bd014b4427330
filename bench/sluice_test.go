package bench

import (
	"maps"
	"testing"

	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// The measurements' scheduler ages DTRs as the real one does by default:
// ARC's per-state deadlines and the CACHE_WAIT timeout, though its
// configuration is made in code, not read from the environment.
func TestTheMeasurementsAgeDTRsWithTheSchedulersDefaults(t *testing.T) {
	cc, err := config(10).Config.CoreConfig()
	if err != nil {
		t.Fatal(err)
	}
	got, want := core.New(cc).Config(), core.DefaultConfig()
	if !maps.Equal(got.AgeAfterState, want.AgeAfterState) || got.AgeAfter != want.AgeAfter || got.AgeEvery != want.AgeEvery ||
		got.CacheWaitTimeout != want.CacheWaitTimeout {
		t.Fatalf("the measurements age after %s (per state %v) every %s, and give up a cache wait after %s; the scheduler's defaults are %s (%v), %s, %s",
			got.AgeAfter, got.AgeAfterState, got.AgeEvery, got.CacheWaitTimeout, want.AgeAfter, want.AgeAfterState, want.AgeEvery, want.CacheWaitTimeout)
	}
}
