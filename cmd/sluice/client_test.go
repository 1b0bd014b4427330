package main

import (
	"strings"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestSharesListActivityLimitsWithTheirUse(t *testing.T) {
	var b strings.Builder
	printShares(&b, api.SharesReply{
		Shares: []api.ShareStats{{Share: "atlas#Production Input-download", State: dtr.Transfer, Priority: 60, Running: 2, Queued: 8, Activity: "Production Input"},
			{Share: "cms-download", State: dtr.PreClean, Priority: 40, Weight: 40, Running: 1, Reserved: 3, Queued: 5, Slots: 4}},
		ActivityLimits: []api.ActivityLimitUse{
			{Activity: "Production Input", Source: "*", Max: 2, Running: map[string]int{"b.example:443": 1, "a.example": 2}},
			{Activity: "Express", Destination: "se.example:443", Max: 5},
		},
	})
	out := b.String()
	for _, want := range []string{
		"atlas#Production Input-download  60",
		"STATE      RUNNING  RESERVED  QUEUED  SLOTS",
		"cms-download                     40        40      PRE_CLEAN  1        3         5       4",
		"ACTIVITY          AT           ENDPOINT        MAX  RUNNING",
		"Production Input  source       a.example       2    2\nProduction Input  source       b.example:443   2    1",
		"Express           destination  se.example:443  5    0",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("sluice shares printed\n%s\nwithout %q", out, want)
		}
	}
}
