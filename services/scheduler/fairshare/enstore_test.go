package fairshare

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
	"github.com/sluice-dtr/sluice/services/scheduler/core/coretest"
)

func TestEnstoreAdminRulesMatchUserGroupAndHost(t *testing.T) {
	p := NewEnstore(EnstoreConfig{Admin: []EnstoreRule{
		{User: "/CN=joe", Host: "mynode1"},
		{User: "/CN=george"},
		{Host: "myspecialnode"},
		{Group: "daq"},
	}})(core.PolicyEnv{ShareName: core.PolicyVOMSVO.ShareName, SharePriority: func(string) int { return 50 }}).(*Enstore)
	tests := []struct {
		name      string
		dn, group string
		src       string
		want      bool
	}{
		{"joe from mynode1", "/CN=joe", "cms", "https://mynode1/f", true},
		{"joe from elsewhere", "/CN=joe", "cms", "https://other/f", false},
		{"george from any node", "/CN=george", "cms", "https://other/f", true},
		{"anyone from myspecialnode", "/CN=kim", "cms", "https://myspecialnode:8443/f", true},
		{"anyone of the daq group", "/CN=kim", "daq", "https://other/f", true},
		{"anyone else", "/CN=kim", "cms", "https://other/f", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &dtr.DTR{Source: tt.src, Destination: "file:///x", Owner: dtr.Identity{DN: tt.dn}}
			if got := p.Admin(d, tt.group); got != tt.want {
				t.Fatalf("admin = %v, want %v", got, tt.want)
			}
		})
	}
}

func enstoreSim(t *testing.T, ecfg EnstoreConfig) *coretest.Sim {
	cfg := core.DefaultConfig()
	cfg.SharePolicy = core.PolicyDN
	cfg.MaxDelivery, cfg.MaxProcessor, cfg.MaxEmergency = 10, 100, 0
	cfg.Lease = 24 * time.Hour
	cfg.Policy = NewEnstore(ecfg)
	return coretest.NewSim(t, cfg)
}

func TestEnstoreAdminRequestsGoFirstWithoutStoppingRunningTransfers(t *testing.T) {
	s := enstoreSim(t, EnstoreConfig{Admin: []EnstoreRule{{User: "joe"}}})
	s.Submit("a", 500, 50)
	s.Submit("b", 500, 50)
	s.Run(time.Minute, 100*time.Millisecond)
	admin := map[uuid.UUID]bool{}
	for _, id := range s.Submit("joe", 20, 50) {
		admin[id] = true
	}
	granted := 0
	for step := 0; step < 3000 && granted < len(admin); step++ {
		waiting := s.QueuedIn(dtr.Transfer, "admin:")
		n := len(s.GrantsOrder)
		s.Run(10*time.Millisecond, 10*time.Millisecond)
		normal, toAdmin := 0, 0
		for _, id := range s.GrantsOrder[n:] {
			if admin[id] {
				toAdmin++
			} else {
				normal++
			}
		}
		granted += toAdmin
		if normal > 0 && toAdmin < waiting {
			t.Fatalf("%d normal transfers started while %d admin DTRs waited in TRANSFER and only %d of them started", normal, waiting, toAdmin)
		}
	}
	if granted != len(admin) {
		t.Fatalf("%d of %d admin DTRs got a transfer slot", granted, len(admin))
	}
}

func TestEnstoreOwnerReclaimsItsSlotsAsTransfersFinish(t *testing.T) {
	s := enstoreSim(t, EnstoreConfig{Owned: map[string]int{"cms": 6}})
	s.TransferTime = func(share string, i int) time.Duration { return time.Duration(10+i%7) * time.Second }
	s.Submit("atlas", 2000, 50)
	s.Run(time.Minute, 100*time.Millisecond)
	if n := s.Running("atlas"); n != 10 {
		t.Fatalf("atlas runs %d transfers while cms is idle, want all 10 slots (borrowed)", n)
	}
	s.Submit("cms", 2000, 50)
	for i := 0; i < 100 && s.QueuedIn(dtr.Transfer, "cms") == 0; i++ {
		s.Run(10*time.Millisecond, 10*time.Millisecond) // through pre-processing
	}
	// Every atlas transfer that finishes frees a slot for cms, until cms
	// has its 6: atlas starts nothing new meanwhile.
	for i := 0; i < 400 && s.Running("cms") < 6; i++ {
		atlasBefore := s.Running("atlas")
		s.Run(100*time.Millisecond, 100*time.Millisecond)
		if s.Running("atlas") > atlasBefore {
			t.Fatalf("atlas went from %d to %d running while cms, which owns 6 slots, had %d; want the freed slots back to their owner",
				atlasBefore, s.Running("atlas"), s.Running("cms"))
		}
	}
	if s.Running("cms") != 6 || s.Running("atlas") != 4 {
		t.Fatalf("cms %d, atlas %d running; want cms its 6 owned slots, atlas the other 4", s.Running("cms"), s.Running("atlas"))
	}
	s.Run(10*time.Minute, 100*time.Millisecond)
	if s.Running("cms") < 6 {
		t.Fatalf("cms fell to %d running while it has work; it owns 6", s.Running("cms"))
	}
}

func TestEnstorePrefersGroupsWithNothingInProgress(t *testing.T) {
	p := NewEnstore(EnstoreConfig{})(core.PolicyEnv{ShareName: core.PolicyVOMSVO.ShareName, SharePriority: func(string) int { return 50 }})
	shares := []core.ShareDemand{{Name: "a", Demand: 5, Running: 1}, {Name: "b", Demand: 5, Running: 1}, {Name: "c", Demand: 5}}
	p.Weigh(coretest.T0, dtr.Transfer, shares)
	got := core.Split(2, shares)
	if got["c"] != 1 {
		t.Fatalf("split of 2 slots between two busy groups and an idle one: %v, want the idle group c to get one", got)
	}
}

func TestEnstoreConfigurationIsParsedOrRefusedClearly(t *testing.T) {
	rules, err := ParseEnstoreAdmin(`[{"user":"/CN=joe","host":"mynode1"},{"host":"myspecialnode"}]`)
	if err != nil || len(rules) != 2 || rules[0] != (EnstoreRule{User: "/CN=joe", Host: "mynode1"}) {
		t.Fatalf("rules %v, %v", rules, err)
	}
	owned, err := ParseOwned("cms=4, atlas=2")
	if err != nil || owned["cms"] != 4 || owned["atlas"] != 2 {
		t.Fatalf("owned %v, %v", owned, err)
	}
	for _, bad := range []struct{ in, want string }{
		{`{"user":"x"}`, "JSON array"},
		{`[{"node":"x"}]`, "unknown field"},
		{`[{}]`, "would match every DTR"},
	} {
		if _, err := ParseEnstoreAdmin(bad.in); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("admin %q: error %v, want %q", bad.in, err, bad.want)
		}
	}
	for _, bad := range []string{"cms", "cms=0", "cms=x", "=3"} {
		if _, err := ParseOwned(bad); err == nil || !strings.Contains(err.Error(), "want group=slots") {
			t.Errorf("owned %q: error %v", bad, err)
		}
	}
}
