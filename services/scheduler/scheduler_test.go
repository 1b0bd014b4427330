package scheduler

import (
	"reflect"
	"testing"

	"github.com/kelseyhightower/envconfig"

	"github.com/sluice-dtr/sluice/services/scheduler/core"
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
	got.Policy, want.Policy = nil, nil
	if len(got.SharePriority) == 0 && len(want.SharePriority) == 0 {
		got.SharePriority, want.SharePriority = nil, nil // none configured, made or not
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the service's defaults make the core\n%+v\ncore.DefaultConfig is\n%+v", got, want)
	}
}
