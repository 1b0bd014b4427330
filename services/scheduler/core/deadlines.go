package core

// Ageing deadlines per state, as ARC sets them: how long a DTR waits in a
// queue before its priority starts to rise.

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// arcAgeAfterState is ARC's table of the deadlines that are not its default
// hour, by the queue state they hold for. ARC gives a cacheable DTR a day
// from NEW (its cache check may wait for another DTR's long download, and
// it holds through CACHE_WAIT), resets it to an hour at CACHE_CHECKED, and
// gives two hours to a DTR queued for TRANSFER; every other queue keeps the
// hour. DefaultConfig has a copy.
var arcAgeAfterState = map[dtr.State]time.Duration{
	dtr.CheckCache: 24 * time.Hour,
	dtr.Transfer:   2 * time.Hour,
}

// DeadlineFor returns how long a DTR waits in a state before its priority
// starts to rise, under ARC's defaults (DefaultConfig): a day for a
// cacheable DTR until its cache is checked, two hours for TRANSFER, an hour
// for the rest. See Config.DeadlineFor.
func DeadlineFor(state dtr.State, cacheable bool) time.Duration {
	return arcDeadlines.DeadlineFor(state, cacheable)
}

// arcDeadlines is the configuration DeadlineFor reads: DefaultConfig's,
// made once.
var arcDeadlines = Config{AgeAfter: DefaultConfig().AgeAfter, AgeAfterState: maps.Clone(arcAgeAfterState)}

// DeadlineFor returns how long a DTR in state waits before its priority
// starts to rise under this configuration: AgeAfterState's entry for the
// queue state it waits for or holds a slot of (an active or cancelling
// state counts as its queue's), else AgeAfter. A cacheable DTR in NEW or
// CACHE_WAIT, on its way to its cache check, has CHECK_CACHE's deadline,
// as ARC sets it at NEW. Zero or negative AgeAfter means DefaultConfig's.
func (cfg Config) DeadlineFor(state dtr.State, cacheable bool) time.Duration {
	if cacheable && (state == dtr.New || state == dtr.CacheWait) {
		state = dtr.CheckCache
	}
	if q, ok := queueOf(state); ok {
		state = q
	}
	if d, ok := cfg.AgeAfterState[state]; ok && d > 0 {
		return d
	}
	if cfg.AgeAfter > 0 {
		return cfg.AgeAfter
	}
	return DefaultConfig().AgeAfter
}

// deadlineAt returns when a DTR entered in its queue state at since, with
// that state's deadline, starts to age; a time outside [now, now+deadline]
// (an entry time before a long outage, or a clock that went back) is held
// to it.
func (c *Core) deadlineAt(now, since time.Time, d *dtr.DTR) int64 {
	wait := c.cfg.DeadlineFor(d.State, c.cacheable(d))
	if since.IsZero() {
		since = now // a record that does not say: as if it entered now
	}
	at := since.Add(wait)
	switch {
	case at.Before(now):
		at = now
	case at.After(now.Add(wait)):
		at = now.Add(wait)
	}
	return c.nanos(at)
}

// cacheWaitOver reports whether a DTR waiting in CACHE_WAIT for another's
// download of its file has waited CacheWaitTimeout (a day by default, as
// ARC's) since it entered CACHE_WAIT. The wait counts from
// DTR.StateEntered, which a change of priority does not move and a
// restart keeps.
func (c *Core) cacheWaitOver(now time.Time, d *dtr.DTR) bool {
	return !now.Before(d.EnteredState().Add(c.cfg.CacheWaitTimeout))
}

// skipCache gives up waiting for another DTR's download into the cache, as
// ARC does when a cacheable DTR's time in CACHE_WAIT runs out: the DTR
// goes through CACHE_PROCESSED straight to CACHE_CHECKED, spending no
// attempt, and fetches its file without the cache (Options.NoCache, ARC's
// CACHE_SKIP; a later retry from NEW does not go to the cache either).
// NEW's resets are not needed: the DTR passed NEW in this attempt and has
// not got past its cache check since; its cache state is cleared here.
func (c *Core) skipCache(now time.Time, e *entry) {
	d := e.d
	d.Options.NoCache = true
	c.uncache(e)
	d.Cache, d.CacheFile = "", ""
	c.must(d.Transition(dtr.CacheProcessed, now))
	c.must(d.Transition(dtr.CacheChecked, now))
}

// ParseAgeAfterStates reads per-state deadlines "STATE=duration,..." as in
// "TRANSFER=2h,CHECK_CACHE=24h": each STATE a queue state by its ARC name
// (any case), each duration positive. Empty gives an empty table. The
// scheduler lays what it reads over ARC's table (DefaultConfig's), so a
// state not named keeps ARC's deadline.
func ParseAgeAfterStates(s string) (map[dtr.State]time.Duration, error) {
	out := map[dtr.State]time.Duration{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, dur, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("age-after entry %q: want STATE=duration, e.g. TRANSFER=2h", item)
		}
		st, err := dtr.ParseState(strings.ToUpper(strings.TrimSpace(name)))
		if err != nil {
			return nil, fmt.Errorf("age-after entry %q: %w", item, err)
		}
		if !slices.Contains(dtr.QueueStates, st) {
			return nil, fmt.Errorf("age-after entry %q: %s is not a queue state (one of %s)", item, st, queueStateNames())
		}
		d, err := time.ParseDuration(strings.TrimSpace(dur))
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("age-after entry %q: %q is not a positive duration", item, strings.TrimSpace(dur))
		}
		if _, dup := out[st]; dup {
			return nil, fmt.Errorf("age-after entry %q: %s is given twice", item, st)
		}
		out[st] = d
	}
	return out, nil
}

func queueStateNames() string {
	names := make([]string, len(dtr.QueueStates))
	for i, s := range dtr.QueueStates {
		names[i] = s.String()
	}
	return strings.Join(names, ", ")
}
