package scheduler

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/kelseyhightower/envconfig"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
	"github.com/sluice-dtr/sluice/services/scheduler/fairshare"
)

// TestTheCoresDefaultsAreTheServicesDefaults: one set of defaults, whether
// the core is made by the service from an empty environment or by
// core.DefaultConfig (the simulator, the tests).
func TestTheCoresDefaultsAreTheServicesDefaults(t *testing.T) {
	var cfg Config
	if err := envconfig.Process("sluice_defaults_test", &cfg); err != nil {
		t.Fatal(err)
	}
	got, err := cfg.CoreConfig()
	if err != nil {
		t.Fatal(err)
	}
	want := core.DefaultConfig()
	// The service turns the per-link optimizer on; a core made in code
	// has it off unless it asks (so that its limits are the ones it set).
	want.Optimizer = core.DefaultOptimizerConfig()
	// Chaining QUERY_REPLICA with PRE_CLEAN, likewise.
	want.ChainPreClean = true
	got.Policy, want.Policy = nil, nil
	if len(got.SharePriority) == 0 && len(want.SharePriority) == 0 {
		got.SharePriority, want.SharePriority = nil, nil // none configured, made or not
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the service's defaults make the core\n%+v\ncore.DefaultConfig is\n%+v", got, want)
	}
}

// The policies are made in package fairshare from their settings; here,
// that the configuration reaches them.
func TestPolicyIsChosenByConfigurationOrRefusedClearly(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		policy  string // name of the policy in force
		wantErr string
	}{
		{"the default is ARC's", Config{}, "arc", ""},
		{"arc by name", Config{Policy: "ARC"}, "arc", ""},
		{"dirac with its settings", Config{Policy: "dirac", Settings: fairshare.Settings{DIRACSettings: fairshare.DIRACSettings{
			DIRACGroups: "prod=100:sharing,user=50", DIRACSlices: "168h:80:2,1h:20:5", DIRACUnit: "bytes"}}}, "dirac", ""},
		{"an unknown policy", Config{Policy: "fifo"}, "", `policy "fifo" is not arc, dirac, enstore or sam`},
		{"a bad DIRAC group", Config{Policy: "dirac", Settings: fairshare.Settings{DIRACSettings: fairshare.DIRACSettings{DIRACGroups: "prod"}}},
			"", "want group=priority"},
		{"enstore owning more slots than the smallest state has", Config{Policy: "enstore",
			Settings:    fairshare.Settings{EnstoreSettings: fairshare.EnstoreSettings{EnstoreOwned: "cms=8,atlas=4"}},
			MaxDelivery: 20, MaxProcessor: 10}, "", "add up to 12, more than the 10 slots"},
		{"byte-fair on top of a policy", Config{Policy: "sam", Settings: fairshare.Settings{SAMSettings: fairshare.SAMSettings{SAMGroups: "cms=1"},
			ByteFairSettings: fairshare.ByteFairSettings{ByteFair: 10 * time.Minute}}}, "sam+bytes", ""},
		{"a negative maxperhost", Config{MaxPerHost: -1}, "", "maxperhost -1 is negative"},
		{"a negative bound on activities per identity", Config{MaxActivitiesPerIdentity: -1}, "", "SLUICE_ACTIVITY_MAX_PER_IDENTITY: -1 is negative"},
		{"activity shares with an activity policy", Config{SharePolicy: "voms:vo+activity",
			ActivityShares: `{"atlas":{"Production Input":0.6,"default":0.4}}`}, "arc", ""},
		{"a negative activity weight", Config{SharePolicy: "voms:vo+activity", ActivityShares: `{"atlas":{"Express":-1,"default":1}}`},
			"", `SLUICE_ACTIVITY_SHARES: activity shares of "atlas": activity "Express" has weight -1`},
		{"activity shares under a policy without activities", Config{SharePolicy: "voms:vo", ActivityShares: `{"atlas":{"default":1}}`},
			"", `share policy "voms:vo" does not name activities`},
		{"an activity limit without an endpoint", Config{ActivityLimits: `[{"activity":"Express","max":2}]`},
			"", `SLUICE_ACTIVITY_LIMITS: activity limit 1 ("Express"): give exactly one of source and destination`},
		{"activity shares under a policy of its own groups", Config{Policy: "sam", SharePolicy: "voms:vo+activity",
			ActivityShares: `{"atlas":{"default":1}}`, Settings: fairshare.Settings{SAMSettings: fairshare.SAMSettings{SAMGroups: "atlas=1"}}},
			"", `share policy "voms:vo+activity" names activities, but policy "sam" names its own groups`},
		{"activity limits under a policy of its own groups", Config{Policy: "sam", SharePolicy: "voms:vo",
			ActivityLimits: `[{"activity":"Express","source":"*","max":2}]`, Settings: fairshare.Settings{SAMSettings: fairshare.SAMSettings{SAMGroups: "atlas=1"}}},
			"sam", ""},
		{"an unknown share policy", Config{SharePolicy: "voms:vo+activities"}, "", `share policy "voms:vo+activities" is not one of`},
		{"an optimizer neither on nor off", Config{Optimizer: "yes"}, "", `optimizer "yes" is neither on nor off`},
		{"an optimizer max below its min", Config{Optimizer: "on", OptimizerMin: 5, OptimizerMax: 4}, "", "optimizer max 4 is below its min 5"},
		{"an optimizer start above its max", Config{Optimizer: "on", OptimizerStart: 500}, "", "optimizer start 500 is outside its min 2 and max 100"},
		{"a negative optimizer min", Config{Optimizer: "off", OptimizerMin: -1}, "", "optimizer min -1 is below 1"},
		{"an optimizer deciding too often", Config{Optimizer: "on", OptimizerInterval: time.Millisecond}, "", "optimizer interval 1ms is under 1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cc, err := tt.cfg.CoreConfig()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := core.New(cc).Policy().Name(); got != tt.policy {
				t.Fatalf("policy %q, want %q", got, tt.policy)
			}
		})
	}
}

// SLUICE_AGE_AFTER_STATES is laid over ARC's deadlines: a state it does
// not name keeps ARC's (CHECK_CACHE a day, TRANSFER two hours).
func TestAgeAfterStatesAreLaidOverARCsDeadlinesOrRefused(t *testing.T) {
	var def Config
	if err := envconfig.Process("SLUICE_TEST_UNSET", &def); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name                 string
		cfg                  Config
		transfer, checkCache time.Duration // the deadlines in the core
		wantErr              string
	}{
		{"the default is ARC's", def, 2 * time.Hour, 24 * time.Hour, ""},
		{"empty: ARC's deadlines, AGE_AFTER for the other states", Config{AgeAfter: 20 * time.Minute}, 2 * time.Hour, 24 * time.Hour, ""},
		{"TRANSFER given keeps CHECK_CACHE's day", Config{AgeAfter: 20 * time.Minute, AgeAfterStates: "TRANSFER=3h"}, 3 * time.Hour, 24 * time.Hour, ""},
		{"both named with AGE_AFTER's value: AGE_AFTER everywhere", Config{AgeAfter: 20 * time.Minute, AgeAfterStates: "TRANSFER=20m,CHECK_CACHE=20m"},
			20 * time.Minute, 20 * time.Minute, ""},
		{"a state that is not a queue", Config{AgeAfterStates: "DONE=1h"}, 0, 0, "SLUICE_AGE_AFTER_STATES: age-after entry \"DONE=1h\": DONE is not a queue state"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cc, err := tt.cfg.CoreConfig()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			cfg := core.New(cc).Config()
			if got := cfg.DeadlineFor(dtr.Transfer, false); got != tt.transfer {
				t.Errorf("TRANSFER ages after %s, want %s", got, tt.transfer)
			}
			if got := cfg.DeadlineFor(dtr.CheckCache, true); got != tt.checkCache {
				t.Errorf("CHECK_CACHE ages after %s, want %s", got, tt.checkCache)
			}
		})
	}
}

// SLUICE_CACHE_WAIT_TIMEOUT is its own setting: neither SLUICE_AGE_AFTER
// nor the per-state deadlines change it.
func TestCacheWaitTimeoutIsItsOwnSettingOrRefused(t *testing.T) {
	var def Config
	if err := envconfig.Process("SLUICE_TEST_UNSET", &def); err != nil {
		t.Fatal(err)
	}
	withAgeing := def
	withAgeing.AgeAfter, withAgeing.AgeAfterStates = 10*time.Minute, "CHECK_CACHE=10m"
	tests := []struct {
		name    string
		cfg     Config
		want    time.Duration
		wantErr string
	}{
		{"the default is a day", def, 24 * time.Hour, ""},
		{"the ageing settings do not change it", withAgeing, 24 * time.Hour, ""},
		{"set", Config{CacheWaitTimeout: 3 * time.Hour}, 3 * time.Hour, ""},
		{"unset in code: the default", Config{}, 24 * time.Hour, ""},
		{"negative", Config{CacheWaitTimeout: -time.Hour}, 0, "SLUICE_CACHE_WAIT_TIMEOUT -1h0m0s is negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cc, err := tt.cfg.CoreConfig()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := core.New(cc).Config().CacheWaitTimeout; got != tt.want {
				t.Fatalf("CACHE_WAIT times out after %s, want %s", got, tt.want)
			}
		})
	}
}

// Changing SLUICE_AGE_AFTER while CHECK_CACHE and TRANSFER keep ARC's
// deadlines is warned of, naming the states that do not follow it.
func TestAnAgeAfterThatSomeStatesDoNotFollowIsWarnedOf(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string // "" for no warning
	}{
		{"the defaults", Config{}, ""},
		{"AGE_AFTER changed", Config{AgeAfter: 20 * time.Minute},
			"SLUICE_AGE_AFTER is 20m0s, but CHECK_CACHE=24h0m0s, TRANSFER=2h0m0s keep ARC's deadlines"},
		{"AGE_AFTER changed, TRANSFER named", Config{AgeAfter: 20 * time.Minute, AgeAfterStates: "TRANSFER=20m"},
			"SLUICE_AGE_AFTER is 20m0s, but CHECK_CACHE=24h0m0s keep ARC's deadlines"},
		{"AGE_AFTER changed, both named", Config{AgeAfter: 20 * time.Minute, AgeAfterStates: "TRANSFER=1h,CHECK_CACHE=20m"}, ""},
		{"AGE_AFTER set to TRANSFER's two hours", Config{AgeAfter: 2 * time.Hour},
			"SLUICE_AGE_AFTER is 2h0m0s, but CHECK_CACHE=24h0m0s keep"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cc, err := tt.cfg.CoreConfig()
			if err != nil {
				t.Fatal(err)
			}
			got := ageAfterNotFollowed(cc)
			if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Fatalf("warning %q, want one containing %q", got, tt.want)
			}
		})
	}
}

// cancelCommand publishes a cancel command for a DTR on the submit stream
// and takes it with the scheduler's consumer, unacknowledged.
func cancelCommand(t *testing.T, nc *nats.Conn, js jetstream.JetStream, id uuid.UUID) jetstream.Msg {
	t.Helper()
	ctx := context.Background()
	ev, err := codec.NewEvent(api.TypeCancel, "test", "", api.Cancel{DTR: id})
	if err != nil {
		t.Fatal(err)
	}
	m, err := codec.Encode(ctx, api.SubjectCancelCommand, "", ev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, bus.StreamSubmit, bus.ConsumerSched)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for jm := range batch.Messages() {
		return jm
	}
	t.Fatal("the cancel command was not delivered")
	return nil
}

// TestAStepThatStopsWorkersOrLeavesNoDTRUnfinishedIsNotHeldForFinalDTRsToGather:
// a step whose notices tell workers to stop, or after which the scheduler
// holds no unfinished DTR (the end of a small job on a quiet scheduler),
// says so (commit.now), so that the committer announces what it gathered
// at once instead of holding it for gatherFinalsFor; any other step may be
// held.
func TestAStepThatStopsWorkersOrLeavesNoDTRUnfinishedIsNotHeldForFinalDTRsToGather(t *testing.T) {
	tests := []struct {
		name string
		// running DTRs are granted by a step before; queued ones are
		// submitted and not yet stepped on. The step takes a cancel
		// command of the first running one (cancelRunning) or of the
		// first queued one, or no input.
		running, queued int
		cancelRunning   bool
		cancelQueued    bool
		wantNow         bool
	}{
		{name: "it stops a running DTR's worker", running: 2, cancelRunning: true, wantNow: true},
		{name: "it ends the last unfinished DTR", queued: 1, cancelQueued: true, wantNow: true},
		{name: "it ends a DTR and another is unfinished", running: 1, queued: 1, cancelQueued: true},
		{name: "it stops no worker and ends no DTR", running: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nc, js, kv := journalServer(t)
			ctx := context.Background()
			s, err := New(Config{}, nc, quiet())
			if err != nil {
				t.Fatal(err)
			}
			s.kv = kv
			submit := func(n int, name string) []uuid.UUID {
				var ids []uuid.UUID
				for i := range n {
					d := newDTR(fmt.Sprint(name, i))
					if err := s.core.Submit(time.Now(), &d); err != nil {
						t.Fatal(err)
					}
					ids = append(ids, d.ID)
				}
				return ids
			}
			running := submit(tt.running, "running")
			if tt.running > 0 {
				c, err := s.step(ctx, kv, nil)
				if err != nil {
					t.Fatal(err)
				}
				if len(c.publish) == 0 {
					t.Fatal("the running DTRs were not granted")
				}
			}
			queued := submit(tt.queued, "queued")
			var batch []jetstream.Msg
			switch {
			case tt.cancelRunning:
				batch = append(batch, cancelCommand(t, nc, js, running[0]))
			case tt.cancelQueued:
				batch = append(batch, cancelCommand(t, nc, js, queued[0]))
			}
			c, err := s.step(ctx, kv, batch)
			if err != nil {
				t.Fatal(err)
			}
			if c.now != tt.wantNow {
				t.Fatalf("the step says now %v, want %v (%d stop notices, %d final DTRs, %d DTRs unfinished)",
					c.now, tt.wantNow, len(c.notices), len(c.announce), s.core.Len())
			}
			if tt.cancelRunning && len(c.notices) == 0 {
				t.Fatal("the step that cancelled a running DTR sent its worker no stop notice")
			}
			if tt.cancelQueued && len(c.announce) != 1 {
				t.Fatalf("the step that cancelled a queued DTR announces %d final DTRs, want 1", len(c.announce))
			}
		})
	}
}
