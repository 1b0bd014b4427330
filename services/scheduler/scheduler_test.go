package scheduler

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kelseyhightower/envconfig"

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
