package core

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// activityDTR is a download by a member of vo for an activity ("" for
// none) from a storage.
func activityDTR(i int, vo, activity, host string) *dtr.DTR {
	d := newDTR(i, vo+"/"+activity+"@"+host, dtr.Download)
	d.Owner.FQANs = []string{"/" + vo}
	d.Options.Activity = activity
	d.Source = fmt.Sprintf("https://%s/data/%s/%d", host, strings.ReplaceAll(activity, " ", "_"), i)
	return d
}

// transfersByShare counts the running TRANSFER grants by share.
func (h *harness) transfersByShare() map[string]int {
	n := map[string]int{}
	for _, g := range h.running {
		if g.State == dtr.Transferring {
			n[g.DTR.Share]++
		}
	}
	return n
}

func TestActivitySharePoliciesNameSharesByTheActivity(t *testing.T) {
	for _, tt := range []struct {
		policy, fqan, dn, activity string
		dir                        dtr.Direction
		want                       string
	}{
		{"voms:vo+activity", "/atlas/prod/Role=production", "", "Production Input", dtr.Download, "atlas#Production Input-download"},
		{"voms:vo+activity", "/atlas", "", "", dtr.Upload, "atlas#default-upload"},
		{"voms:group+activity", "/atlas/prod", "", "User Subscriptions", dtr.Download, "atlas:prod#User Subscriptions-download"},
		{"voms:role+activity", "/atlas/Role=production", "", "Express", dtr.Download, "atlas:production#Express-download"},
		{"dn+activity", "", "/DC=org/CN=Alice", "T0 Export", dtr.Download, "/DC=org/CN=Alice#T0 Export-download"},
		{"activity", "/atlas", "/CN=Bob", "Data Consolidation", dtr.Download, "Data Consolidation-download"},
		{"activity", "", "", "", dtr.Download, "default-download"},
		{"voms:vo+activity", "", "/CN=NoVO", "Express", dtr.Download, "_default#Express-download"},
		{"voms:vo", "/atlas", "", "Express", dtr.Download, "atlas-download"},
	} {
		t.Run(tt.policy+" "+tt.want, func(t *testing.T) {
			p, err := ParseSharePolicy(tt.policy)
			if err != nil {
				t.Fatal(err)
			}
			cfg := DefaultConfig()
			cfg.SharePolicy = p
			c := New(cfg)
			d := newDTR(1, "x", tt.dir)
			d.Owner.DN = tt.dn
			if tt.fqan != "" {
				d.Owner.FQANs = []string{tt.fqan}
			}
			d.Options.Activity = tt.activity
			if err := c.Submit(t0, d); err != nil {
				t.Fatal(err)
			}
			if d.Share != tt.want {
				t.Fatalf("share %q, want %q", d.Share, tt.want)
			}
			if id, act, ok := p.SplitShare(d.Share); p.HasActivity() && (!ok || act != activityFor(tt.activity) || id+ActivitySeparator+act != strings.TrimSuffix(d.Share, "-"+string(tt.dir)) && p != PolicyActivity) {
				t.Fatalf("SplitShare(%q) = %q, %q, %v", d.Share, id, act, ok)
			}
		})
	}
}

// activitySplitConfig runs every DTR through pre-processing in one go, so
// that all reach TRANSFER at once and the split decides alone.
func activitySplitConfig(weights string, prios map[string]int) Config {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyVOMSVO + activitySuffix
	cfg.SharePriority = prios
	cfg.MaxProcessor, cfg.MaxDelivery, cfg.MaxEmergency = 10000, 100, 0
	w, err := ParseActivityWeights(weights)
	if err != nil {
		panic(err)
	}
	cfg.ActivityWeights = w
	return cfg
}

func TestActivityWeightsDivideAVOsPriorityExactly(t *testing.T) {
	weights := `{"atlas":{"Production Input":0.6,"User Subscriptions":0.1,"default":0.3}}`
	for _, tt := range []struct {
		name string
		work map[[2]string]int // (vo, activity) → DTRs
		want map[string]int
	}{
		{"every activity has work: atlas's 60 splits 36/6/18", map[[2]string]int{
			{"atlas", "Production Input"}: 200, {"atlas", "User Subscriptions"}: 200, {"atlas", ""}: 200, {"cms", "Production Input"}: 200},
			map[string]int{"atlas#Production Input-download": 36, "atlas#User Subscriptions-download": 6, "atlas#default-download": 18, "cms#Production Input-download": 40}},
		{"an activity without work leaves its part to the VO's others; one not listed is in default", map[[2]string]int{
			{"atlas", "Production Input"}: 200, {"atlas", "Analysis"}: 200, {"cms", "Production Input"}: 200},
			// Analysis is not in atlas's table: it is in atlas's default.
			map[string]int{"atlas#Production Input-download": 40, "atlas#default-download": 20, "cms#Production Input-download": 40}},
		{"a VO without a table weighs its activities evenly", map[[2]string]int{
			{"atlas", "Production Input"}: 200, {"cms", "Production Input"}: 200, {"cms", "Express"}: 200},
			map[string]int{"atlas#Production Input-download": 60, "cms#Production Input-download": 20, "cms#Express-download": 20}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, activitySplitConfig(weights, map[string]int{"atlas": 60, "cms": 40}))
			i := 0
			for k, n := range tt.work {
				for range n {
					i++
					h.submit(activityDTR(i, k[0], k[1], "se.example"))
				}
			}
			h.runToTransfer()
			if got := h.transfersByShare(); fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("transfers by share %v, want %v", got, tt.want)
			}
		})
	}
}

func TestReconfiguredPriorityReachesAVOsActivityShares(t *testing.T) {
	cfg := activitySplitConfig(`{"atlas":{"Production Input":3,"default":1}}`, map[string]int{"atlas": 60, "cms": 40})
	h := newHarness(t, cfg)
	d := activityDTR(1, "atlas", "Production Input", "se.example")
	h.submit(d)
	if p := h.c.SharePriority(d.Share); p != 60 {
		t.Fatalf("priority of %s: %d, want atlas's 60", d.Share, p)
	}
	if err := h.c.SetSharePriorities(h.now, map[string]int{"atlas": 20, "cms": 80}); err != nil {
		t.Fatal(err)
	}
	if p := h.c.SharePriority(d.Share); p != 20 {
		t.Fatalf("priority of %s after reconfigure: %d, want atlas's new 20", d.Share, p)
	}
	if err := h.c.SetSharePriorities(h.now, map[string]int{"atlas": 20, "atlas#Production Input": 90}); err != nil {
		t.Fatal(err)
	}
	if p := h.c.SharePriority(d.Share); p != 90 {
		t.Fatalf("priority of %s configured by its own name: %d, want 90", d.Share, p)
	}
}

// limitDTR is a transfer of an activity from src to dst (either may be "",
// a local file).
func limitDTR(i int, activity, src, dst string) *dtr.DTR {
	d := activityDTR(i, "atlas", activity, "x")
	d.Source, d.Destination = "file:///data/"+fmt.Sprint(i), "file:///out/"+fmt.Sprint(i)
	if src != "" {
		d.Source = fmt.Sprintf("https://%s/in/%d", src, i)
	}
	if dst != "" {
		d.Destination = fmt.Sprintf("https://%s/out/%d", dst, i)
	}
	return d
}

func (h *harness) transfersOf(activity string) int {
	n := 0
	for _, g := range h.running {
		if g.State == dtr.Transferring && g.DTR.Options.Activity == activity {
			n++
		}
	}
	return n
}

func TestActivityLimitHoldsAnEndpointAndHandsSlotsOn(t *testing.T) {
	for _, policy := range []SharePolicy{PolicyNone, PolicyVOMSVO + activitySuffix} {
		t.Run("policy "+string(policy), func(t *testing.T) {
			cfg := activitySplitConfig("", nil)
			cfg.SharePolicy, cfg.MaxDelivery = policy, 10
			var err error
			if cfg.ActivityLimits, err = ParseActivityLimits(`[{"activity":"User Subscriptions","destination":"se.example:443","max":2}]`); err != nil {
				t.Fatal(err)
			}
			h := newHarness(t, cfg)
			for i := range 20 {
				h.submit(limitDTR(i, "User Subscriptions", "", "se.example:443"), limitDTR(100+i, "Production Input", "", "se.example:443"))
			}
			h.runToTransfer()
			if us, all := h.transfersOf("User Subscriptions"), len(h.transfersByShareList()); us != 2 || all != 10 {
				t.Fatalf("%d User Subscriptions transfers (want the limit, 2), %d slots busy (want all 10)", us, all)
			}
			var waiting *dtr.DTR
			for _, d := range h.c.DTRs() {
				if d.State == dtr.Transfer && d.Options.Activity == "User Subscriptions" {
					waiting = &d
					break
				}
			}
			w, err := h.c.Explain(h.now, waiting.ID)
			if err != nil || !strings.Contains(w.Reason, `activity limit 1 (at most 2 "User Subscriptions" transfers at destination se.example:443)`) {
				t.Fatalf("why: %q, %v", w.Reason, err)
			}
			use := h.c.ActivityLimits()
			if len(use) != 1 || use[0].Running["se.example:443"] != 2 {
				t.Fatalf("activity limits' use %+v, want 2 running at se.example:443", use)
			}
			// One ends: another of the activity takes its place, no more.
			for _, g := range h.running {
				if g.State == dtr.Transferring && g.DTR.Options.Activity == "User Subscriptions" {
					h.answer(g, nil)
					break
				}
			}
			h.tick(time.Second)
			if us := h.transfersOf("User Subscriptions"); us != 2 {
				t.Fatalf("%d User Subscriptions transfers after one ended, want 2 again", us)
			}
		})
	}
}

// transfersByShareList lists the running TRANSFER grants.
func (h *harness) transfersByShareList() []Grant {
	var gs []Grant
	for _, g := range h.running {
		if g.State == dtr.Transferring {
			gs = append(gs, g)
		}
	}
	return gs
}

func TestActivityLimitAtAnySourceCountsEachEndpointAlone(t *testing.T) {
	cfg := activitySplitConfig("", nil)
	cfg.MaxDelivery = 20
	cfg.ActivityLimits = []ActivityLimit{{Activity: "default", Source: AnyEndpoint, Max: 3}}
	h := newHarness(t, cfg)
	for i := range 10 {
		// No activity: in "default". Local sources are not endpoints.
		h.submit(limitDTR(i, "", "a.example", ""), limitDTR(100+i, "", "b.example", ""), limitDTR(200+i, "", "", "c.example"))
	}
	h.runToTransfer()
	by := map[string]int{}
	for _, g := range h.transfersByShareList() {
		switch {
		case strings.Contains(g.DTR.Source, "a.example"):
			by["a"]++
		case strings.Contains(g.DTR.Source, "b.example"):
			by["b"]++
		default:
			by["local"]++
		}
	}
	if by["a"] != 3 || by["b"] != 3 || by["local"] != 10 {
		t.Fatalf("transfers %v, want 3 from a, 3 from b, and all 10 from local files", by)
	}
}

func TestRestoredCoreCountsTransfersPerActivityLimit(t *testing.T) {
	cfg := activitySplitConfig("", nil)
	cfg.MaxDelivery = 10
	cfg.ActivityLimits = []ActivityLimit{{Activity: "Express", Source: "slow.example", Max: 2}}
	h := newHarness(t, cfg)
	for i := range 5 {
		h.submit(limitDTR(i, "Express", "slow.example", ""))
	}
	h.runToTransfer()
	if n := h.transfersOf("Express"); n != 2 {
		t.Fatalf("%d transfers, want 2", n)
	}
	h2 := newHarness(t, cfg)
	for _, e := range h.c.dtrs {
		cp := *h.c.peekEntry(e)
		if err := h2.c.Restore(h.now, &cp); err != nil {
			t.Fatal(err)
		}
	}
	if got := h2.tick(time.Second); len(got) != 0 {
		t.Fatalf("a restored core started %d more transfers of an activity at its limit", len(got))
	}
	if use := h2.c.ActivityLimits(); use[0].Running["slow.example"] != 2 {
		t.Fatalf("restored use %+v, want 2 at slow.example", use)
	}
}

func TestParseActivityWeightsRefusesBadTables(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{`{"atlas":{"Production Input":0.6,"default":0.4}}`, ""},
		{``, ""},
		{`{"atlas":{"Production Input":-1,"default":1}}`, `activity "Production Input" has weight -1`},
		{`{"atlas":{"Production Input":0,"default":1}}`, `has weight 0`},
		{`{"atlas":{"Production Input":2e6,"default":1}}`, `has weight 2e+06; a weight must be a number above 0 and at most 1e+06`},
		{`{"atlas":{"Production Input":1}}`, `no "default" weight`},
		{`{"atlas":{}}`, `no "default" weight`},
		{`{"":{"default":1}}`, `an empty VO name`},
		{`{"atlas":{"":1,"default":1}}`, `an empty activity name`},
		{`{"atlas":{" x":1,"default":1}}`, `leading or trailing space`},
		{`{"atlas":{"default":NaN}}`, `not a JSON object`},
		{`{"atlas":{"default":"high"}}`, `not a JSON object`},
		{`["atlas"]`, `not a JSON object`},
		{`{"atlas":{"default":1}} {}`, `text after`},
	} {
		t.Run(tt.in, func(t *testing.T) {
			_, err := ParseActivityWeights(tt.in)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}

func TestParseActivityLimitsRefusesBadLimits(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{`[{"activity":"User Subscriptions","destination":"se.example.org:443","max":5},{"activity":"Production Input","source":"*","max":50}]`, ""},
		{``, ""},
		{`[{"destination":"se.example","max":5}]`, "no activity"},
		{`[{"activity":"a","max":5}]`, "exactly one of source and destination"},
		{`[{"activity":"a","source":"x","destination":"y","max":5}]`, "exactly one of source and destination"},
		{`[{"activity":"a","source":"x","max":0}]`, "max 0; it must be at least 1"},
		{`[{"activity":"a","source":"x","max":-2}]`, "max -2"},
		{`[{"activity":"a","source":"https://x/","max":2}]`, "is not an endpoint"},
		{`[{"activity":"a","source":"x y","max":2}]`, "is not an endpoint"},
		{`[{"activity":"a","source":"x","max":2},{"activity":"a","source":"x","max":3}]`, "activity limit 2 repeats limit 1"},
		{`[{"activity":"a","source":"x","max":2,"maximum":3}]`, "unknown field"},
		{`{"activity":"a"}`, "not a JSON array"},
	} {
		t.Run(tt.in, func(t *testing.T) {
			_, err := ParseActivityLimits(tt.in)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}

func TestParseSharePolicyTakesActivityForms(t *testing.T) {
	for _, s := range []string{"voms:vo+activity", "VOMS:Group+Activity", "voms:role+activity", "dn+activity", "activity"} {
		p, err := ParseSharePolicy(s)
		if err != nil || !p.HasActivity() {
			t.Fatalf("%q: %v, %v", s, p, err)
		}
	}
	for _, s := range []string{"none+activity", "activity+activity", "voms:vo+group"} {
		if _, err := ParseSharePolicy(s); err == nil {
			t.Fatalf("%q taken", s)
		}
	}
}

// Neither limits nor activity shares keep a submitter's activity in the
// table of names (it is never pruned): limits do not intern it, and
// under a weights table an activity it does not list is in "default".
func TestActivitiesStayOutOfTheTableOfNames(t *testing.T) {
	for _, policy := range []SharePolicy{PolicyNone, PolicyVOMSVO + activitySuffix, PolicyActivity} {
		t.Run(string(policy), func(t *testing.T) {
			cfg := activitySplitConfig(`{"*":{"Express":2,"default":1}}`, nil)
			cfg.SharePolicy = policy
			cfg.ActivityLimits = []ActivityLimit{{Activity: "Express", Destination: AnyEndpoint, Max: 2}}
			h := newHarness(t, cfg)
			submit := func(i int, activity string) *dtr.DTR {
				d := limitDTR(i, activity, "src.example", "dst.example")
				d.Owner.DN = "/CN=same"
				h.submit(d)
				return d
			}
			submit(0, "Express")
			submit(1, "")
			names := len(h.c.names)
			for i := range 1000 {
				d := submit(i+2, fmt.Sprintf("activity %d", i))
				if policy.HasActivity() && !strings.Contains(d.Share, "default") {
					t.Fatalf("an activity the table does not list is in share %q", d.Share)
				}
			}
			if len(h.c.names) != names {
				t.Fatalf("the table of names grew from %d to %d with 1000 activities", names, len(h.c.names))
			}
		})
	}
}

func FuzzParseActivitySettingsTakeOnlyWhatTheCoreCanUse(f *testing.F) {
	f.Add(`{"atlas":{"Production Input":0.6,"default":0.4}}`, `[{"activity":"Express","destination":"se.example:443","max":5},{"activity":"default","source":"*","max":1}]`)
	f.Add(`{"*":{"default":1e6,"a":1e-300}}`, `[{"activity":"a","source":"[::1]:8443","max":9223372036854775807}]`)
	f.Add(`{"a":{"default":-0}}`, `[{"activity":"a","source":"x:","max":1}]`)
	f.Fuzz(func(t *testing.T, weights, limits string) {
		w, werr := ParseActivityWeights(weights)
		ls, lerr := ParseActivityLimits(limits)
		if werr == nil {
			for vo, table := range w {
				for a, v := range table {
					if !(v > 0) || v > MaxActivityWeight || a == "" || vo == "" {
						t.Fatalf("taken: %q's %q weighs %v", vo, a, v)
					}
				}
			}
		}
		if lerr == nil {
			for _, l := range ls {
				if l.Max < 1 || (l.Source == "") == (l.Destination == "") || l.Activity == "" {
					t.Fatalf("taken: %+v", l)
				}
			}
		}
		if werr != nil || lerr != nil {
			return
		}
		// What was taken runs: a DTR of each activity is named a share,
		// weighed and counted without a panic.
		cfg := activitySplitConfig("", nil)
		cfg.ActivityWeights, cfg.ActivityLimits = w, ls
		h := newHarness(t, cfg)
		for i, l := range ls {
			ep := l.Endpoint()
			if ep == AnyEndpoint {
				ep = "any.example"
			}
			h.submit(limitDTR(i, l.Activity, ep, ""))
		}
		h.runToTransfer()
		h.c.Shares()
	})
}

func TestActivityLimitAtAHostNameCountsEveryPortOfIt(t *testing.T) {
	cfg := activitySplitConfig("", nil)
	cfg.MaxDelivery = 30
	cfg.ActivityLimits = []ActivityLimit{{Activity: "Express", Destination: "SE.example", Max: 3}, {Activity: "Express", Destination: "tape.example:8443", Max: 1}}
	h := newHarness(t, cfg)
	for i := range 5 {
		h.submit(limitDTR(i, "Express", "", "se.example"), limitDTR(10+i, "Express", "", "se.example:443"),
			limitDTR(20+i, "Express", "", "Se.Example:8443"), limitDTR(30+i, "Express", "", "other.example"),
			limitDTR(40+i, "Express", "", "tape.example:8443"), limitDTR(50+i, "Express", "", "tape.example"))
	}
	h.runToTransfer()
	by := map[string]int{}
	for _, g := range h.transfersByShareList() {
		u := strings.TrimPrefix(g.DTR.Destination, "https://")
		by[strings.ToLower(u[:strings.Index(u, "/")])]++
	}
	se := by["se.example"] + by["se.example:443"] + by["se.example:8443"]
	// A limit with a port counts that endpoint as written, no other.
	if se != 3 || by["other.example"] != 5 || by["tape.example:8443"] != 1 || by["tape.example"] != 5 {
		t.Fatalf("transfers by destination %v: want 3 to se.example on any port, 1 to tape.example:8443, and the rest all", by)
	}
	use := h.c.ActivityLimits()
	if use[0].Destination != "se.example" || use[0].Running["se.example"] != 3 || use[1].Running["tape.example:8443"] != 1 {
		t.Fatalf("use %+v", use)
	}
}
