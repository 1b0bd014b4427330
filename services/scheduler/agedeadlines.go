package scheduler

// The ageing deadlines per state and the CACHE_WAIT timeout, from
// SLUICE_AGE_AFTER_STATES, SLUICE_AGE_AFTER and SLUICE_CACHE_WAIT_TIMEOUT.

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// ageAfterStates returns ARC's per-state deadlines (core.DefaultConfig's)
// with the entries of SLUICE_AGE_AFTER_STATES laid over them: a state the
// setting does not name keeps ARC's deadline.
func ageAfterStates(setting string) (map[dtr.State]time.Duration, error) {
	given, err := core.ParseAgeAfterStates(setting)
	if err != nil {
		return nil, fmt.Errorf("SLUICE_AGE_AFTER_STATES: %w", err)
	}
	out := core.DefaultConfig().AgeAfterState
	if out == nil {
		out = map[dtr.State]time.Duration{}
	}
	maps.Copy(out, given)
	return out, nil
}

// cacheWaitTimeout checks SLUICE_CACHE_WAIT_TIMEOUT. Zero, as a
// configuration made in code without it has, is core.DefaultConfig's.
func cacheWaitTimeout(d time.Duration) (time.Duration, error) {
	switch {
	case d < 0:
		return 0, fmt.Errorf("SLUICE_CACHE_WAIT_TIMEOUT %s is negative; want a positive duration such as 24h", d)
	case d == 0:
		return core.DefaultConfig().CacheWaitTimeout, nil
	}
	return d, nil
}

// ageAfterNotFollowed returns a warning, empty if none is due, when
// SLUICE_AGE_AFTER is not its default but some states keep ARC's own
// deadlines rather than follow it: an operator who shortens AGE_AFTER may
// expect every queue to age sooner, and CHECK_CACHE and TRANSFER do not.
func ageAfterNotFollowed(cc core.Config) string {
	def := core.DefaultConfig()
	if cc.AgeAfter <= 0 || cc.AgeAfter == def.AgeAfter { // <= 0: the default
		return ""
	}
	var kept []string
	for _, st := range slices.Sorted(maps.Keys(def.AgeAfterState)) {
		arc := def.AgeAfterState[st]
		if got, ok := cc.AgeAfterState[st]; ok && got == arc && arc != cc.AgeAfter {
			kept = append(kept, fmt.Sprintf("%s=%s", st, arc))
		}
	}
	if len(kept) == 0 {
		return ""
	}
	return fmt.Sprintf("SLUICE_AGE_AFTER is %s, but %s keep ARC's deadlines and do not follow it; name them in SLUICE_AGE_AFTER_STATES to change them",
		cc.AgeAfter, strings.Join(kept, ", "))
}
