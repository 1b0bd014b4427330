package fairshare

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
	"github.com/sluice-dtr/sluice/services/scheduler/core/coretest"
)

func TestDIRACCorrectionMatchesHandComputedCases(t *testing.T) {
	week := DIRACSlice{Span: 168 * time.Hour, Weight: 80, MaxCorrection: 2}
	hour := DIRACSlice{Span: time.Hour, Weight: 20, MaxCorrection: 5}
	tests := []struct {
		name   string
		S      []float64
		H      [][]float64
		slices []DIRACSlice
		G      float64
		want   []float64
	}{
		{
			// week: a 2/3 vs 100/120 → 0.8; b 1/3 vs 20/120 → 2 (the cap).
			// hour: a 2/3 vs 10/10 → 0.667; b used nothing → 5 (the cap).
			// C_a = (80·0.8 + 20·0.667)/100 = 0.7733; C_b = (80·2 + 20·5)/100 = 2.6.
			name: "the seed's week and hour slices", S: []float64{2, 1},
			H: [][]float64{{100, 20}, {10, 0}}, slices: []DIRACSlice{week, hour}, G: 3,
			want: []float64{(80*0.8 + 20*(2.0/3)) / 100, 2.6},
		},
		{
			name: "no history corrects nothing", S: []float64{2, 1},
			H: [][]float64{{0, 0}, {0, 0}}, slices: []DIRACSlice{week, hour}, G: 3,
			want: []float64{1, 1},
		},
		{
			// a: 0.5 vs 100/101 → 0.505; b: 0.5 vs 1/101 → 50.5, capped at 10, then at G = 2.
			name: "the global maximum caps the total", S: []float64{1, 1},
			H: [][]float64{{100, 1}}, slices: []DIRACSlice{{Span: time.Hour, Weight: 1, MaxCorrection: 10}}, G: 2,
			want: []float64{0.5 / (100.0 / 101), 2},
		},
		{
			// DIRAC would keep the empty slice's weight and halve both.
			name: "a slice with no usage at all is left out of the weights", S: []float64{1, 1},
			H:      [][]float64{{30, 10}, {0, 0}},
			slices: []DIRACSlice{{Span: time.Hour, Weight: 50, MaxCorrection: 2}, {Span: time.Minute, Weight: 50, MaxCorrection: 5}}, G: 5,
			want: []float64{0.5 / 0.75, 2},
		},
		{
			// DIRAC adds M unweighted; Sluice weighs it like every value.
			name: "a share absent from a slice gets its maximum, weighted", S: []float64{1, 1},
			H:      [][]float64{{10, 0}, {10, 10}},
			slices: []DIRACSlice{{Span: time.Hour, Weight: 1, MaxCorrection: 3}, {Span: time.Minute, Weight: 3, MaxCorrection: 3}}, G: 5,
			want: []float64{(1*0.5 + 3*1) / 4, (1*3 + 3*1) / 4.0},
		},
		{
			name: "an entity without an expected share takes no part", S: []float64{1, 0},
			H: [][]float64{{10, 1000}}, slices: []DIRACSlice{hour}, G: 5,
			want: []float64{1, 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := DIRACCorrection(tt.S, tt.H, tt.slices, tt.G)
			for i := range tt.want {
				if math.Abs(got[i]-tt.want[i]) > 1e-9 {
					t.Fatalf("C = %v, want %v", got, tt.want)
				}
			}
		})
	}
}

// diracDTR is a DTR of a user (DN) in a VO group (FQAN).
func diracDTR(i int, group, user string) *dtr.DTR {
	d := coretest.NewDTR(i, group+"-"+user, dtr.Download)
	d.Owner = dtr.Identity{DN: "/CN=" + user, FQANs: []string{"/" + group}}
	return d
}

func diracConfig() core.Config {
	cfg := core.DefaultConfig()
	cfg.SharePolicy = core.PolicyVOMSVO
	cfg.Policy = NewDIRAC(DIRACConfig{Groups: map[string]DIRACGroup{
		"prod": {Priority: 100, JobSharing: true},
		"user": {Priority: 50},
	}})
	return cfg
}

func TestDIRACSharesAndWeights(t *testing.T) {
	c := core.New(diracConfig())
	share := func(group, user string) string {
		d := diracDTR(0, group, user)
		return core.SubShare(c.Policy().Share(d), d.Direction)
	}
	if a, b := share("prod", "alice"), share("prod", "bob"); a != b || a != "prod-download" {
		t.Fatalf("a job-sharing group's users have shares %q and %q, want one, prod-download", a, b)
	}
	if a, b := share("user", "alice"), share("user", "bob"); a == b || a != "user|/CN=alice-download" {
		t.Fatalf("users of a group without job sharing have shares %q and %q, want one each", a, b)
	}
	tests := []struct {
		name   string
		shares []core.ShareDemand
		want   []int64
	}{
		{"a sharing group weighs its priority; the others' is divided among users with work",
			[]core.ShareDemand{{Name: "prod-download", Weight: 0, Demand: 10}, {Name: "user|/CN=alice-download", Weight: 0, Demand: 10}, {Name: "user|/CN=bob-download", Weight: 0, Demand: 10}},
			[]int64{100e6, 25e6, 25e6}},
		{"a user without work does not divide the group's priority",
			[]core.ShareDemand{{Name: "prod-download", Weight: 0, Demand: 10}, {Name: "user|/CN=alice-download", Weight: 0, Demand: 10}, {Name: "user|/CN=bob-download", Weight: 0, Demand: 0}},
			[]int64{100e6, 50e6, 1}},
		{"users count per direction",
			[]core.ShareDemand{{Name: "user|/CN=alice-download", Weight: 0, Demand: 10}, {Name: "user|/CN=bob-upload", Weight: 0, Demand: 10}},
			[]int64{50e6, 50e6}},
	}
	share("user", "bob")
	bob := diracDTR(0, "user", "bob")
	bob.Direction = dtr.Upload
	c.Policy().Share(bob)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c.Policy().Weigh(coretest.T0, dtr.Transfer, tt.shares)
			for i, s := range tt.shares {
				if s.Weight != tt.want[i] {
					t.Fatalf("share %s weighs %d, want %d", s.Name, s.Weight, tt.want[i])
				}
			}
		})
	}
}

func TestDIRACPriorityIsTheUserPriority(t *testing.T) {
	c := core.New(diracConfig())
	for _, tt := range []struct{ user, want int }{{0, 50}, {1, 1}, {77, 77}, {100, 100}} {
		d := diracDTR(0, "user", "alice")
		d.UserPriority = tt.user
		if got := c.Policy().Priority("x", d); got != tt.want {
			t.Errorf("user priority %d gives %d, want %d", tt.user, got, tt.want)
		}
	}
}

// diracSim runs a saturated TRANSFER state under DIRAC's policy and returns
// each share's part of the slot-time.
func diracSim(t *testing.T, cfg core.Config, users map[string][2]string, d time.Duration) (*coretest.Sim, map[string]float64) {
	cfg.MaxDelivery = 10
	cfg.MaxProcessor = 100
	cfg.Lease = 24 * time.Hour
	s := coretest.NewSim(t, cfg)
	s.TransferTime = func(share string, i int) time.Duration {
		return time.Duration(5000+(i*7919+len(share)*104729)%10000) * time.Millisecond
	}
	for name, gu := range users {
		for i := 0; i < 4000; i++ {
			if err := s.Core.Submit(s.Now, diracDTR(i, gu[0], gu[1]+name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	s.Run(d, 100*time.Millisecond)
	var total time.Duration
	for _, v := range s.SlotTime {
		total += v
	}
	parts := map[string]float64{}
	for k, v := range s.SlotTime {
		parts[k] = 100 * float64(v) / float64(total)
	}
	return s, parts
}

func TestDIRACSaturatedSplitFollowsTheWeights(t *testing.T) {
	_, parts := diracSim(t, diracConfig(), map[string][2]string{
		"p1": {"prod", "pat"}, "p2": {"prod", "pia"}, "a": {"user", "al"}, "b": {"user", "bo"},
	}, time.Hour)
	t.Logf("parts %v", parts)
	want := map[string]float64{"prod-download": 100.0 * 100 / 150, "user|/CN=ala-download": 100.0 * 25 / 150,
		"user|/CN=bob-download": 100.0 * 25 / 150}
	for share, w := range want {
		if math.Abs(parts[share]-w) > 1 {
			t.Errorf("share %s had %.2f%% of the slot-time, want %.2f%% ± 1", share, parts[share], w)
		}
	}
	if len(parts) != len(want) {
		t.Errorf("slot-time went to %v, want only %v", parts, want)
	}
}

func TestDIRACHistoryCorrectionFavoursTheShareThatUsedLess(t *testing.T) {
	cfg := diracConfig()
	cfg.Policy = NewDIRAC(DIRACConfig{
		Groups: map[string]DIRACGroup{"user": {Priority: 50}},
		Slices: []DIRACSlice{{Span: time.Hour, Weight: 1, MaxCorrection: 5}}, MaxGlobalCorrection: 5,
	})
	// Alice works alone for half an hour, then Bob arrives with as much work.
	s, _ := diracSim(t, cfg, map[string][2]string{"a": {"user", "al"}}, 30*time.Minute)
	before := s.SlotTime["user|/CN=bob-download"]
	aliceBefore := s.SlotTime["user|/CN=ala-download"]
	for i := 0; i < 4000; i++ {
		if err := s.Core.Submit(s.Now, diracDTR(i, "user", "bob")); err != nil {
			t.Fatal(err)
		}
	}
	s.Run(10*time.Minute, 100*time.Millisecond)
	bob := s.SlotTime["user|/CN=bob-download"] - before
	alice := s.SlotTime["user|/CN=ala-download"] - aliceBefore
	t.Logf("bob %s alice %s", bob, alice)
	// Equal shares, but Alice has used the last half hour: Bob gets most.
	if bob < 3*alice {
		t.Errorf("after Alice's half hour alone, Bob had %s of slot-time to her %s in 10 minutes, want at least 3×", bob, alice)
	}
	if alice == 0 {
		t.Error("Alice got no slot at all; every active share keeps one")
	}
}

func TestDIRACConfigurationIsParsedOrRefusedClearly(t *testing.T) {
	groups, err := ParseDIRACGroups("lhcb_prod=100:sharing, lhcb_user=50:background")
	if err != nil || groups["lhcb_prod"] != (DIRACGroup{Priority: 100, JobSharing: true}) ||
		groups["lhcb_user"] != (DIRACGroup{Priority: 50, AllowBackground: true}) {
		t.Fatalf("groups %v, %v", groups, err)
	}
	slices, err := ParseDIRACSlices("168h:80:2,1h:20:5")
	if err != nil || len(slices) != 2 || slices[1] != (DIRACSlice{time.Hour, 20, 5}) {
		t.Fatalf("slices %v, %v", slices, err)
	}
	for _, bad := range []struct{ in, want string }{
		{"prod", "want group=priority"},
		{"prod=x", "not a positive number"},
		{"prod=-1", "not a positive number"},
		{"prod=NaN", "not a positive number"},
		{"prod=Inf", "not a positive number"},
		{"prod=10:shared", `not "sharing" or "background"`},
	} {
		if _, err := ParseDIRACGroups(bad.in); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("groups %q: error %v, want %q", bad.in, err, bad.want)
		}
	}
	for _, bad := range []struct{ in, want string }{
		{"1h:20", "want span:weight:maxcorrection"},
		{"soon:20:5", "not a positive duration"},
		{"1h:0:5", "weight"},
		{"1h:20:0.5", "max correction"},
		{"1h:NaN:5", "weight"},
		{"1h:20:+Inf", "max correction"},
	} {
		if _, err := ParseDIRACSlices(bad.in); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("slices %q: error %v, want %q", bad.in, err, bad.want)
		}
	}
	_ = fmt.Sprint()
}

func TestDIRACRealPriorityMapsTheBounds(t *testing.T) {
	for _, tt := range []struct {
		user int
		want float64
	}{{1, 1e-5}, {2, 2}, {50, 50}, {99, 99}, {100, 1e6}} {
		if got := RealPriority(tt.user); got != tt.want {
			t.Errorf("RealPriority(%d) = %g, want %g", tt.user, got, tt.want)
		}
	}
}

func TestDIRACBackgroundShareGetsOnlyWhatOthersCannotUse(t *testing.T) {
	tests := []struct {
		name       string
		background bool
		wantAlice  func(alice, bob time.Duration) bool
		want       string
	}{
		{"with AllowBackground, the lowest-priority share waits for unused slots", true,
			func(alice, bob time.Duration) bool { return alice == 0 }, "no slot-time for alice while bob can use every slot"},
		{"without it, the lowest priority still has its share", false,
			func(alice, bob time.Duration) bool { return math.Abs(float64(alice-bob)) < 0.02*float64(alice+bob) }, "equal slot-time"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := diracConfig()
			cfg.Policy = NewDIRAC(DIRACConfig{Groups: map[string]DIRACGroup{"user": {Priority: 50, AllowBackground: tt.background}}})
			cfg.MaxDelivery, cfg.MaxProcessor, cfg.Lease = 10, 100, 24*time.Hour
			s := coretest.NewSim(t, cfg)
			for i := 0; i < 3000; i++ {
				d := diracDTR(i, "user", "alice")
				d.UserPriority = 1
				if err := s.Core.Submit(s.Now, d); err != nil {
					t.Fatal(err)
				}
				if err := s.Core.Submit(s.Now, diracDTR(i, "user", "bob")); err != nil {
					t.Fatal(err)
				}
			}
			s.Run(30*time.Minute, 100*time.Millisecond)
			alice, bob := s.SlotTime["user|/CN=alice-download"], s.SlotTime["user|/CN=bob-download"]
			if !tt.wantAlice(alice, bob) {
				t.Fatalf("alice %s, bob %s of slot-time: want %s", alice, bob, tt.want)
			}
		})
	}
}

func TestDIRACPicksInsideAShareInProportionToRealPriority(t *testing.T) {
	cfg := diracConfig()
	cfg.MaxDelivery, cfg.MaxProcessor, cfg.MaxEmergency, cfg.Lease = 1, 5000, 0, 24*time.Hour
	s := coretest.NewSim(t, cfg)
	s.TransferTime = func(string, int) time.Duration { return time.Second }
	prio := map[string]int{}
	for i := 0; i < 2000; i++ {
		d := diracDTR(i, "user", "alice")
		d.UserPriority = []int{10, 30}[i%2]
		prio[d.ID.String()] = d.UserPriority
		if err := s.Core.Submit(s.Now, d); err != nil {
			t.Fatal(err)
		}
	}
	s.Run(10*time.Second, 100*time.Millisecond) // everything reaches TRANSFER
	first := len(s.GrantsOrder)
	s.Run(400*time.Second, 100*time.Millisecond)
	picks := s.GrantsOrder[first:]
	high := 0
	for _, id := range picks {
		if prio[id.String()] == 30 {
			high++
		}
	}
	// 1,000 each at weights 10 and 30: 3 picks in 4 go to priority 30,
	// drifting a little as they are taken.
	frac := float64(high) / float64(len(picks))
	if len(picks) < 300 || frac < 0.70 || frac > 0.82 {
		t.Fatalf("%d of %d picks went to priority 30 (%.2f), want about 0.75: a pick in proportion to RealPriority", high, len(picks), frac)
	}
}

// twoLevelSim runs first (group/user-name pairs as for diracSim) for half
// an hour, then adds later's work, and returns each share's slot-time in
// the 10 minutes after.
func twoLevelSim(t *testing.T, cfg core.Config, first, later map[string][2]string) map[string]time.Duration {
	t.Helper()
	s, _ := diracSim(t, cfg, first, 30*time.Minute)
	before := maps.Clone(s.SlotTime)
	for name, gu := range later {
		for i := 0; i < 4000; i++ {
			if err := s.Core.Submit(s.Now, diracDTR(i, gu[0], gu[1]+name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	s.Run(10*time.Minute, 100*time.Millisecond)
	after := map[string]time.Duration{}
	for k, v := range s.SlotTime {
		after[k] = v - before[k]
	}
	return after
}

func TestDIRACCorrectsGroupsThenUsersInsideAGroup(t *testing.T) {
	hour := []DIRACSlice{{Span: time.Hour, Weight: 1, MaxCorrection: 5}}
	twoGroups := func(dc DIRACConfig) core.Config {
		cfg := diracConfig()
		dc.Groups = map[string]DIRACGroup{"prod": {Priority: 50, JobSharing: true}, "user": {Priority: 50}}
		dc.MaxGlobalCorrection = 5
		cfg.Policy = NewDIRAC(dc)
		return cfg
	}
	const prod, alice, bob = "prod-download", "user|/CN=ala-download", "user|/CN=bob-download"
	part := func(got map[string]time.Duration, shares ...string) float64 {
		var total, of time.Duration
		for _, v := range got {
			total += v
		}
		for _, s := range shares {
			of += got[s]
		}
		return 100 * float64(of) / float64(total)
	}

	t.Run("a user who hogged inside a group gets less next, the group's total unchanged", func(t *testing.T) {
		// prod and Alice's half of the user group share the slots for
		// half an hour; then Bob, of Alice's group, arrives.
		got := twoLevelSim(t, twoGroups(DIRACConfig{Slices: hour}),
			map[string][2]string{"p": {"prod", "pat"}, "a": {"user", "al"}}, map[string][2]string{"b": {"user", "bo"}})
		t.Logf("the 10 minutes after Bob came: prod %s, alice %s, bob %s", got[prod], got[alice], got[bob])
		if got[bob] < 3*got[alice] || got[alice] == 0 {
			t.Errorf("Bob had %s of slot-time to Alice's %s, who used the group's half alone before: want at least 3×, and Alice some", got[bob], got[alice])
		}
		// Both groups had half: no group is corrected, and the user
		// level only divides the user group's half (DIRAC's own user
		// corrections, not scaled back to the group's, gave it 64%).
		if g := part(got, alice, bob); math.Abs(g-50) > 3 {
			t.Errorf("the user group had %.1f%% of the slot-time, want its uncorrected 50%% ± 3", g)
		}
	})

	t.Run("without the user level the group divides equally", func(t *testing.T) {
		got := twoLevelSim(t, twoGroups(DIRACConfig{Slices: hour, NoUserCorrection: true}),
			map[string][2]string{"p": {"prod", "pat"}, "a": {"user", "al"}}, map[string][2]string{"b": {"user", "bo"}})
		t.Logf("prod %s, alice %s, bob %s", got[prod], got[alice], got[bob])
		if a, b := part(got, alice), part(got, bob); math.Abs(a-b) > 3 || math.Abs(a+b-50) > 3 {
			t.Errorf("Alice had %.1f%% and Bob %.1f%%, want 25%% each ± 3", a, b)
		}
	})

	t.Run("a group that used less gets more, its fresh users alike", func(t *testing.T) {
		// prod works alone for half an hour; then Alice and Bob arrive.
		got := twoLevelSim(t, twoGroups(DIRACConfig{Slices: hour}),
			map[string][2]string{"p": {"prod", "pat"}}, map[string][2]string{"a": {"user", "al"}, "b": {"user", "bo"}})
		t.Logf("prod %s, alice %s, bob %s", got[prod], got[alice], got[bob])
		if g := part(got, alice, bob); g < 70 {
			t.Errorf("the user group, which used nothing of the last hour, had %.1f%% of the slot-time, want over 70%%", g)
		}
		if a, b := part(got, alice), part(got, bob); math.Abs(a-b) > 0.15*(a+b) {
			t.Errorf("Alice had %.1f%% and Bob %.1f%%: fresh users of one group, want equal parts", a, b)
		}
	})
}

func TestDIRACUserLevelSettingsAreParsedOrRefusedClearly(t *testing.T) {
	tests := []struct {
		name    string
		s       DIRACSettings
		wantErr string
	}{
		{"empty: the groups' slices", DIRACSettings{DIRACSlices: "1h:1:5"}, ""},
		{"off", DIRACSettings{DIRACSlices: "1h:1:5", DIRACUserSlices: "OFF"}, ""},
		{"their own", DIRACSettings{DIRACSlices: "1h:1:5", DIRACUserSlices: "24h:1:2", DIRACUserMaxCorrection: 2}, ""},
		{"a bad slice", DIRACSettings{DIRACUserSlices: "24h:1"}, "SLUICE_DIRAC_USER_SLICES: DIRAC slice \"24h:1\": want span:weight:maxcorrection"},
		{"a bound below 1", DIRACSettings{DIRACUserMaxCorrection: 0.5}, "SLUICE_DIRAC_USER_MAX_CORRECTION: 0.5 is not a number ≥ 1"},
		{"a bound that is not a number", DIRACSettings{DIRACUserMaxCorrection: math.NaN()}, "SLUICE_DIRAC_USER_MAX_CORRECTION: NaN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.s.Maker()
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// A scheduler restarted with DTRs of a group without job sharing weighs
// their restored shares, "group|DN", before Share has seen any of them:
// they are read back as users of the group, not taken for groups.
func TestDIRACReadsBackUserSharesItHasNotSeen(t *testing.T) {
	c := core.New(diracConfig())
	shares := []core.ShareDemand{{Name: "user|/CN=al-download", Demand: 10}, {Name: "user|/CN=bo-download", Demand: 10}}
	c.Policy().Weigh(coretest.T0, dtr.Transfer, shares)
	for _, s := range shares {
		if s.Weight != 25e6 {
			t.Errorf("restored share %s weighs %d, want 25e6 (its group's 50 divided between two users)", s.Name, s.Weight)
		}
	}
}

// A restored user share "group|DN" is read back right when the group or
// the DN holds '|' itself: with the dn policy the group is the DN, and an
// OIDC subject such as auth0|123 is a DN; with a VOMS policy a DN may
// hold '|' after a configured group's name.
func TestDIRACReadsBackUserSharesWhoseNamesHoldTheSeparator(t *testing.T) {
	weigh := func(cfg core.Config, names ...string) []int64 {
		c := core.New(cfg)
		shares := make([]core.ShareDemand, len(names))
		for i, n := range names {
			shares[i] = core.ShareDemand{Name: n, Demand: 10}
		}
		c.Policy().Weigh(coretest.T0, dtr.Transfer, shares)
		out := make([]int64, len(shares))
		for i, s := range shares {
			out[i] = int64(s.Weight)
		}
		return out
	}
	byDN := func() core.Config {
		cfg := core.DefaultConfig()
		cfg.SharePolicy = core.PolicyDN
		cfg.Policy = NewDIRAC(DIRACConfig{Groups: map[string]DIRACGroup{
			core.DefaultShare: {Priority: 50},
			"auth0":           {Priority: 50},
		}})
		return cfg
	}
	tests := []struct {
		name       string
		cfg        core.Config
		shares     []string
		likeShares []string // shares without '|' in their parts, read the same way
	}{
		{"dn policy: each subject its own group", byDN(),
			[]string{"auth0|123|auth0|123-download", "auth0|456|auth0|456-download", "auth0|789|auth0|789-download"},
			[]string{"/CN=a|/CN=a-download", "/CN=b|/CN=b-download", "/CN=c|/CN=c-download"}},
		{"voms policy: a DN with '|' in a configured group", diracConfig(),
			[]string{"user|auth0|123-download", "user|auth0|456-download", "prod-download"},
			[]string{"user|/CN=a-download", "user|/CN=b-download", "prod-download"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, want := weigh(tt.cfg, tt.shares...), weigh(tt.cfg, tt.likeShares...)
			if !slices.Equal(got, want) {
				t.Fatalf("restored shares %q weigh %v, want %v as %q do", tt.shares, got, want, tt.likeShares)
			}
		})
	}
}

func TestDIRACSplitsARestoredUserShareAtTheRightSeparator(t *testing.T) {
	byDN := core.DefaultConfig()
	byDN.SharePolicy = core.PolicyDN
	byDN.Policy = NewDIRAC(DIRACConfig{Groups: map[string]DIRACGroup{"auth0": {Priority: 50}}})
	tests := []struct {
		name        string
		cfg         core.Config
		share       string
		group, user string
	}{
		{"dn policy, an OIDC subject", byDN, "auth0|123|auth0|123", "auth0|123", "auth0|123"},
		{"dn policy, a plain DN", byDN, "/CN=a|/CN=a", "/CN=a", "/CN=a"},
		{"voms policy, a DN with '|'", diracConfig(), "user|auth0|123", "user", "auth0|123"},
		{"voms policy, an unconfigured group", diracConfig(), "atlas|/CN=a|b", "atlas", "/CN=a|b"},
		{"a group share", diracConfig(), "prod", "prod", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := core.New(tt.cfg).Policy().(*DIRAC)
			e, _ := p.entity(tt.share)
			if e.group != tt.group || e.user != tt.user {
				t.Fatalf("%q read as group %q, user %q; want %q, %q", tt.share, e.group, e.user, tt.group, tt.user)
			}
		})
	}
}
