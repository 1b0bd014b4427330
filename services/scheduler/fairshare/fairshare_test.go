package fairshare

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

func TestPolicyIsMadeFromItsSettingsOrRefusedClearly(t *testing.T) {
	ten := Slots{Processor: 10, Delivery: 10}
	tests := []struct {
		name    string
		policy  string
		s       Settings
		slots   Slots
		want    string // name of the policy in force
		wantErr string
	}{
		{"the default is ARC's", "", Settings{}, Slots{}, "arc", ""},
		{"arc by name", "ARC", Settings{}, Slots{}, "arc", ""},
		{"dirac with groups and slices", "dirac", Settings{DIRACSettings: DIRACSettings{DIRACGroups: "prod=100:sharing,user=50",
			DIRACSlices: "168h:80:2,1h:20:5", DIRACUnit: "bytes"}}, Slots{}, "dirac", ""},
		{"an unknown policy", "fifo", Settings{}, Slots{}, "", `policy "fifo" is not arc, dirac, enstore or sam`},
		{"sam with priority groups and fractions", "sam", Settings{SAMSettings: SAMSettings{SAMGroups: "daq=priority,cms=0.6,atlas=0.4", SAMUnit: "bytes"}}, Slots{}, "sam", ""},
		{"sam without fractions", "sam", Settings{SAMSettings: SAMSettings{SAMGroups: "daq=priority"}}, Slots{}, "", "no fair-share group"},
		{"a bad SAM unit", "sam", Settings{SAMSettings: SAMSettings{SAMGroups: "cms=1", SAMUnit: "jobs"}}, Slots{}, "", `SAM: usage unit "jobs" is not files, bytes or seconds`},
		{"enstore with admin rules and owned slots", "enstore", Settings{EnstoreSettings: EnstoreSettings{EnstoreAdmin: `[{"group":"daq"}]`,
			EnstoreOwned: "cms=4"}}, ten, "enstore", ""},
		{"enstore owning more slots than there are", "enstore", Settings{EnstoreSettings: EnstoreSettings{EnstoreOwned: "cms=8,atlas=4"}},
			ten, "", "add up to 12, more than the 10 slots"},
		{"enstore owning more slots than the smallest state has", "enstore", Settings{EnstoreSettings: EnstoreSettings{EnstoreOwned: "cms=8"}},
			Slots{Processor: 20, Delivery: 6}, "", "add up to 8, more than the 6 slots"},
		{"enstore with the slots unknown", "enstore", Settings{EnstoreSettings: EnstoreSettings{EnstoreOwned: "cms=8"}}, Slots{}, "enstore", ""},
		{"byte-fair on top of a policy", "enstore", Settings{ByteFairSettings: ByteFairSettings{ByteFair: 10 * time.Minute}}, Slots{}, "enstore+bytes", ""},
		{"byte-fair on top of the default", "", Settings{ByteFairSettings: ByteFairSettings{ByteFair: time.Minute}}, Slots{}, "arc+bytes", ""},
		{"a negative byte-fair span", "", Settings{ByteFairSettings: ByteFairSettings{ByteFair: -time.Minute}}, Slots{}, "", "negative"},
		{"a bad Enstore rule", "enstore", Settings{EnstoreSettings: EnstoreSettings{EnstoreAdmin: `[{}]`}}, Slots{}, "", "would match every DTR"},
		{"a bad DIRAC group", "dirac", Settings{DIRACSettings: DIRACSettings{DIRACGroups: "prod"}}, Slots{}, "", "want group=priority"},
		{"a bad DIRAC slice", "dirac", Settings{DIRACSettings: DIRACSettings{DIRACSlices: "1h"}}, Slots{}, "", "want span:weight:maxcorrection"},
		{"a bad DIRAC unit", "dirac", Settings{DIRACSettings: DIRACSettings{DIRACUnit: "jobs"}}, Slots{}, "", `DIRAC: usage unit "jobs" is not files, bytes or seconds`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Make(tt.policy, tt.s, tt.slots)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			cfg := core.DefaultConfig()
			cfg.Policy = p
			if got := core.New(cfg).Policy().Name(); got != tt.want {
				t.Fatalf("policy %q, want %q", got, tt.want)
			}
		})
	}
}

func TestNamesListsEveryFactoryTheDefaultFirst(t *testing.T) {
	if _, ok := Factories[Default]; !ok {
		t.Fatalf("the default, %s, has no factory", Default)
	}
	got := Names()
	if got != "arc, dirac, enstore or sam" {
		t.Fatalf("Names() = %q", got)
	}
	for name := range Factories {
		if !strings.Contains(got, name) {
			t.Fatalf("Names() = %q lacks %s", got, name)
		}
	}
}

// TestSettingsKeepTheirVariablesAndDefaults: the settings are read under
// the names and with the defaults the documentation gives.
func TestSettingsKeepTheirVariablesAndDefaults(t *testing.T) {
	t.Run("unset, the defaults", func(t *testing.T) {
		for _, k := range []string{"DIRAC_GROUPS", "DIRAC_SLICES", "DIRAC_MAX_CORRECTION", "DIRAC_UNIT", "DIRAC_USER_SLICES", "DIRAC_USER_MAX_CORRECTION", "SAM_GROUPS",
			"SAM_UNIT", "ENSTORE_ADMIN", "ENSTORE_OWNED", "BYTEFAIR", "BYTEFAIR_MAX"} {
			for _, k := range []string{"SLUICE_" + k, k} { // envconfig also reads the name without the prefix
				t.Setenv(k, "") // restored after the test
				os.Unsetenv(k)
			}
		}
		var s Settings
		if err := envconfig.Process("sluice", &s); err != nil {
			t.Fatal(err)
		}
		want := Settings{DIRACSettings: DIRACSettings{DIRACMaxCorrection: 5, DIRACUnit: "seconds"},
			SAMSettings: SAMSettings{SAMUnit: "files"}, ByteFairSettings: ByteFairSettings{ByteFairMax: 20}}
		if s != want {
			t.Fatalf("settings %+v, want %+v", s, want)
		}
	})
	t.Run("set, each in its field", func(t *testing.T) {
		for k, v := range map[string]string{
			"SLUICE_DIRAC_GROUPS": "prod=100:sharing", "SLUICE_DIRAC_SLICES": "1h:1:5", "SLUICE_DIRAC_MAX_CORRECTION": "3",
			"SLUICE_DIRAC_UNIT": "bytes", "SLUICE_DIRAC_USER_SLICES": "off", "SLUICE_DIRAC_USER_MAX_CORRECTION": "2",
			"SLUICE_SAM_GROUPS": "cms=1", "SLUICE_SAM_UNIT": "seconds",
			"SLUICE_ENSTORE_ADMIN": `[{"group":"daq"}]`, "SLUICE_ENSTORE_OWNED": "cms=4",
			"SLUICE_BYTEFAIR": "10m", "SLUICE_BYTEFAIR_MAX": "7",
		} {
			t.Setenv(k, v)
		}
		var s Settings
		if err := envconfig.Process("sluice", &s); err != nil {
			t.Fatal(err)
		}
		want := Settings{
			DIRACSettings: DIRACSettings{DIRACGroups: "prod=100:sharing", DIRACSlices: "1h:1:5", DIRACMaxCorrection: 3, DIRACUnit: "bytes",
				DIRACUserSlices: "off", DIRACUserMaxCorrection: 2},
			ByteFairSettings: ByteFairSettings{ByteFair: 10 * time.Minute, ByteFairMax: 7},
			SAMSettings:      SAMSettings{SAMGroups: "cms=1", SAMUnit: "seconds"},
			EnstoreSettings:  EnstoreSettings{EnstoreAdmin: `[{"group":"daq"}]`, EnstoreOwned: "cms=4"},
		}
		if s != want {
			t.Fatalf("settings %+v, want %+v", s, want)
		}
	})
}
