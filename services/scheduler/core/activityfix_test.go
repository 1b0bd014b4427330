package core

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// sharesOfVO sums running TRANSFER grants by the VO part of their share.
func (h *harness) transfersByVO() map[string]int {
	n := map[string]int{}
	for share, k := range h.transfersByShare() {
		vo, _, _ := strings.Cut(share, ActivitySeparator)
		n[vo] += k
	}
	return n
}

func TestManyActivitiesGiveAVONoMoreThanItsPriority(t *testing.T) {
	for _, tt := range []struct {
		name      string
		slots     int
		atlasActs int
		want      map[string]int
	}{
		{"9 activities of atlas=10 against cms=90 on 10 slots", 10, 9, map[string]int{"atlas": 1, "cms": 9}},
		{"3 activities of atlas=10 against cms=90 on 10 slots", 10, 3, map[string]int{"atlas": 1, "cms": 9}},
		{"9 activities of atlas=10 against cms=90 on 2 slots", 2, 9, map[string]int{"atlas": 1, "cms": 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := activitySplitConfig("", map[string]int{"atlas": 10, "cms": 90})
			cfg.MaxDelivery = tt.slots
			h := newHarness(t, cfg)
			i := 0
			for a := range tt.atlasActs {
				for range 20 {
					i++
					h.submit(activityDTR(i, "atlas", fmt.Sprintf("made-up %d", a), "se.example"))
				}
			}
			for range 100 {
				i++
				h.submit(activityDTR(i, "cms", "", "se.example"))
			}
			h.runToTransfer()
			if got := h.transfersByVO(); fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("transfers by VO %v, want %v (by share %v)", got, tt.want, h.transfersByShare())
			}
		})
	}
}

func TestAnIdleActivitysSlotsStayWithItsVOAtFewSlots(t *testing.T) {
	// atlas=50, cms=50 on 2 slots: atlas's one slot stays atlas's when
	// one of its two activities runs out of work.
	cfg := activitySplitConfig(`{"atlas":{"A":1,"B":1,"default":1}}`, map[string]int{"atlas": 50, "cms": 50})
	cfg.MaxDelivery = 2
	h := newHarness(t, cfg)
	for i := range 10 {
		h.submit(activityDTR(i, "atlas", "A", "se.example"), activityDTR(100+i, "cms", "", "se.example"))
	}
	h.submit(activityDTR(200, "atlas", "B", "se.example"))
	h.runToTransfer()
	if got := h.transfersByVO(); got["atlas"] != 1 || got["cms"] != 1 {
		t.Fatalf("transfers by VO %v, want atlas 1, cms 1", got)
	}
}

func TestSplitShareKeepsADNWithTheSeparatorWhole(t *testing.T) {
	for _, tt := range []struct {
		policy         SharePolicy
		share, id, act string
	}{
		{PolicyDN + activitySuffix, "/CN=a#b#Express-download", "/CN=a#b", "Express"},
		{PolicyVOMSGroup + activitySuffix, "vo:g#x#User-upload", "vo:g#x", "User"},
		{PolicyVOMSVO + activitySuffix, "atlas#default", "atlas", "default"},
	} {
		id, act, ok := tt.policy.SplitShare(tt.share)
		if !ok || id != tt.id || act != tt.act {
			t.Errorf("%s SplitShare(%q) = %q, %q, %v; want %q, %q", tt.policy, tt.share, id, act, ok, tt.id, tt.act)
		}
	}
}

func TestAnOldRecordsActivityWithTheSeparatorGoesToDefault(t *testing.T) {
	cfg := activitySplitConfig("", nil)
	cfg.SharePolicy = PolicyDN + activitySuffix
	c := New(cfg)
	d := newDTR(1, "x", dtr.Download)
	d.Owner.DN = "/CN=g0"
	d.Options.Activity = "P" // checked; a record from before the check may hold "#"
	if got := cfg.SharePolicy.ShareOf(&dtr.DTR{Owner: d.Owner, Options: dtr.Options{Activity: "x#P"}}, nil); got != "/CN=g0#default" {
		t.Fatalf("share of activity x#P: %q, want /CN=g0#default", got)
	}
	if err := c.Submit(t0, d); err != nil {
		t.Fatal(err)
	}
	if d.Share != "/CN=g0#P-download" {
		t.Fatalf("share %q", d.Share)
	}
}

func TestALimitOnDefaultHoldsActivitiesTheTableDoesNotList(t *testing.T) {
	cfg := activitySplitConfig(`{"atlas":{"Production Input":1,"default":1}}`, nil)
	cfg.MaxDelivery = 10
	cfg.ActivityLimits = []ActivityLimit{{Activity: DefaultActivity, Destination: "se.example:443", Max: 2}}
	h := newHarness(t, cfg)
	for i := range 10 {
		h.submit(limitDTR(i, fmt.Sprintf("invented %d", i), "", "se.example:443"))
	}
	h.runToTransfer()
	if n := len(h.transfersByShareList()); n != 2 {
		t.Fatalf("%d transfers of unlisted activities run, want the limit on default, 2", n)
	}
}

func TestAnIdentityWithoutATableGetsBoundedActivityShares(t *testing.T) {
	cfg := activitySplitConfig("", nil)
	cfg.MaxDelivery = 100
	cfg.MaxActivitiesPerIdentity = 3
	h := newHarness(t, cfg)
	for i := range 10 {
		h.submit(activityDTR(i, "atlas", fmt.Sprintf("act %d", i), "se.example"))
	}
	shares := map[string]bool{}
	for _, d := range h.c.DTRs() {
		shares[d.Share] = true
	}
	want := map[string]bool{"atlas#act 0-download": true, "atlas#act 1-download": true, "atlas#act 2-download": true, "atlas#default-download": true}
	if fmt.Sprint(shares) != fmt.Sprint(want) {
		t.Fatalf("shares %v, want %v", shares, want)
	}
}

func TestEndpointsAreComparedInNormalForm(t *testing.T) {
	for _, tt := range []struct{ url, want string }{
		{"https://SE.example.org./f", "se.example.org:443"},
		{"https://se.example.org:443/f", "se.example.org:443"},
		{"davs://se.example.org/f", "se.example.org:443"},
		{"http://se.example.org/f", "se.example.org:80"},
		{"root://xrd.example.org//f", "xrd.example.org:1094"},
		{"s3s://s3.example.org/b/k", "s3.example.org:443"},
		{"https://[::1]:8443/f", "[::1]:8443"},
		{"file:///data/f", ""},
	} {
		if got := endpointOf(tt.url); got != tt.want {
			t.Errorf("endpointOf(%q) = %q, want %q", tt.url, got, tt.want)
		}
	}
}

func TestLimitsHoldEndpointsHoweverTheURLsWriteThem(t *testing.T) {
	for _, tt := range []struct {
		name    string
		limit   ActivityLimit
		perHost int
	}{
		{"an activity limit with the default port", ActivityLimit{Activity: "default", Source: "SE.example.org.:443", Max: 2}, 0},
		{"an activity limit at the host name", ActivityLimit{Activity: "default", Source: "se.example.org.", Max: 2}, 0},
		{"max per host", ActivityLimit{}, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := activitySplitConfig("", nil)
			cfg.SharePolicy, cfg.MaxDelivery, cfg.MaxPerHost = PolicyNone, 10, tt.perHost
			if tt.limit.Max > 0 {
				cfg.ActivityLimits = []ActivityLimit{tt.limit}
				if err := ValidateActivityLimits(cfg.ActivityLimits); err != nil {
					t.Fatal(err)
				}
			}
			h := newHarness(t, cfg)
			for i := range 5 {
				a, b := activityDTR(i, "atlas", "", "x"), activityDTR(100+i, "atlas", "", "x")
				a.Source = fmt.Sprintf("https://SE.example.org./a/%d", i)
				b.Source = fmt.Sprintf("https://se.example.org:443/b/%d", i)
				h.submit(a, b)
			}
			h.runToTransfer()
			if n := len(h.transfersByShareList()); n != 2 {
				t.Fatalf("%d transfers from se.example.org, written two ways; want the limit, 2", n)
			}
		})
	}
}

// TestRestoredDTRsRebuildTheBoundOnAnIdentitysActivities: restored
// records count the activities their shares name for their identity,
// whatever their order, so that the DTRs submitted after a restart get
// the shares the ones before it got.
func TestRestoredDTRsRebuildTheBoundOnAnIdentitysActivities(t *testing.T) {
	cfg := activitySplitConfig("", nil)
	cfg.MaxActivitiesPerIdentity = 1
	h := newHarness(t, cfg)
	h.submit(activityDTR(0, "atlas", "A", "se.example"), activityDTR(1, "atlas", "B", "se.example"))
	records := h.c.DTRs()
	slices.SortFunc(records, func(x, y dtr.DTR) int { return strings.Compare(y.Share, x.Share) }) // atlas#default first
	if records[0].Share != "atlas#default-download" || records[1].Share != "atlas#A-download" {
		t.Fatalf("shares before the restart %s, %s", records[0].Share, records[1].Share)
	}
	restarted := newHarness(t, cfg)
	for i := range records {
		if err := restarted.c.Restore(restarted.now, &records[i]); err != nil {
			t.Fatal(err)
		}
	}
	restarted.submit(activityDTR(2, "atlas", "A", "se.example"), activityDTR(3, "atlas", "B", "se.example"))
	got := map[string]string{}
	for _, d := range restarted.c.DTRs() {
		got[d.Options.Activity] += d.Share + " "
	}
	want := map[string]string{"A": "atlas#A-download atlas#A-download ", "B": "atlas#default-download atlas#default-download "}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("shares by activity after the restart %v, want %v", got, want)
	}
}
