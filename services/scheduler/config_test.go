package scheduler

import (
	"strings"
	"testing"

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
		{"an unknown policy", Config{Policy: "fifo"}, "", `policy "fifo" is not arc or dirac`},
		{"a bad DIRAC group", Config{Policy: "dirac", DIRACGroups: "prod"}, "", "want group=priority"},
		{"a bad DIRAC slice", Config{Policy: "dirac", DIRACSlices: "1h"}, "", "want span:weight:maxcorrection"},
		{"a bad DIRAC unit", Config{Policy: "dirac", DIRACUnit: "jobs"}, "", `unit "jobs" is not seconds, bytes or files`},
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
