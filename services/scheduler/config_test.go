package scheduler

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

func TestPolicyIsChosenByConfigurationOrRefusedClearly(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		policy  string // name of the policy in force
		wantErr string
	}{
		{"the default is ARC's", Config{}, "arc", ""},
		{"arc by name", Config{Policy: "ARC"}, "arc", ""},
		{"dirac with groups and slices", Config{Policy: "dirac", DIRACGroups: "prod=100:sharing,user=50",
			DIRACSlices: "168h:80:2,1h:20:5", DIRACUnit: "bytes"}, "dirac", ""},
		{"an unknown policy", Config{Policy: "fifo"}, "", `policy "fifo" is not arc, dirac, sam or enstore`},
		{"sam with priority groups and fractions", Config{Policy: "sam", SAMGroups: "daq=priority,cms=0.6,atlas=0.4", SAMUnit: "bytes"}, "sam", ""},
		{"sam without fractions", Config{Policy: "sam", SAMGroups: "daq=priority"}, "", "no fair-share group"},
		{"a bad SAM unit", Config{Policy: "sam", SAMGroups: "cms=1", SAMUnit: "jobs"}, "", `SAM: usage unit "jobs" is not files, bytes or seconds`},
		{"enstore with admin rules and owned slots", Config{Policy: "enstore", EnstoreAdmin: `[{"group":"daq"}]`,
			EnstoreOwned: "cms=4", MaxDelivery: 10, MaxProcessor: 10}, "enstore", ""},
		{"enstore owning more slots than there are", Config{Policy: "enstore", EnstoreOwned: "cms=8,atlas=4",
			MaxDelivery: 10, MaxProcessor: 10}, "", "add up to 12, more than the 10 slots"},
		{"byte-fair on top of a policy", Config{Policy: "enstore", ByteFair: 10 * time.Minute}, "enstore+bytes", ""},
		{"byte-fair on top of the default", Config{ByteFair: time.Minute}, "arc+bytes", ""},
		{"a negative byte-fair span", Config{ByteFair: -time.Minute}, "", "negative"},
		{"a negative maxperhost", Config{MaxPerHost: -1}, "", "maxperhost -1 is negative"},
		{"a bad Enstore rule", Config{Policy: "enstore", EnstoreAdmin: `[{}]`}, "", "would match every DTR"},
		{"a bad DIRAC group", Config{Policy: "dirac", DIRACGroups: "prod"}, "", "want group=priority"},
		{"a bad DIRAC slice", Config{Policy: "dirac", DIRACSlices: "1h"}, "", "want span:weight:maxcorrection"},
		{"a bad DIRAC unit", Config{Policy: "dirac", DIRACUnit: "jobs"}, "", `DIRAC: usage unit "jobs" is not files, bytes or seconds`},
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

func TestEveryPolicyIsNamedInTheRegistryAndItsErrorText(t *testing.T) {
	if len(policyOrder) != len(Policies) {
		t.Fatalf("policyOrder %v, Policies has %d", policyOrder, len(Policies))
	}
	for _, name := range policyOrder {
		if _, ok := Policies[name]; !ok {
			t.Fatalf("%s is listed but not registered", name)
		}
	}
	if got := policyNames(); got != "arc, dirac, sam or enstore" {
		t.Fatalf("policyNames() = %q", got)
	}
}
