package simulate

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/services/scheduler/core"
	"github.com/sluice-dtr/sluice/services/scheduler/fairshare"
)

func TestReadWorkloadTakesGoodFilesAndNamesBadLines(t *testing.T) {
	good := "# a comment\nat,dn,fqan,bytes,priority,direction\n0,/CN=a,/atlas,100,50,download\n1.5,/CN=b,,200,,upload\n"
	work, err := ReadWorkload(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	if len(work) != 2 || work[1].At != 1500*time.Millisecond || work[1].Group() != "/CN=b" || work[0].Group() != "atlas" {
		t.Fatalf("read %+v", work)
	}
	tests := []struct{ name, in, want string }{
		{"no header column at", "dn,bytes\n/CN=a,1\n", `lacks the column "at"`},
		{"a negative time", "at,dn,bytes\n-1,/CN=a,1\n", "line 2: at \"-1\""},
		{"an empty dn", "at,dn,bytes\n0,,1\n", "line 2: dn is empty"},
		{"a bad size", "at,dn,bytes\n0,/CN=a,lots\n", `line 2: bytes "lots"`},
		{"a priority out of range", "at,dn,bytes,priority\n0,/CN=a,1,101\n", `priority "101" is not 1–100`},
		{"a bad direction", "at,dn,bytes,direction\n0,/CN=a,1,sideways\n", `direction "sideways"`},
		{"a short line", "at,dn,bytes\n0,/CN=a\n", "wrong number of fields"},
		{"no arrivals", "at,dn,bytes\n", "no arrivals"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := ReadWorkload(strings.NewReader(tt.in)); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
		})
	}
}

func TestExampleWorkloadSurvivesWritingAndReading(t *testing.T) {
	var b bytes.Buffer
	if err := WriteWorkload(&b, Example()); err != nil {
		t.Fatal(err)
	}
	work, err := ReadWorkload(&b)
	if err != nil {
		t.Fatal(err)
	}
	ex := Example()
	if len(work) != len(ex) || work[len(ex)-1] != ex[len(ex)-1] || work[0] != ex[0] {
		t.Fatalf("read back %d arrivals (last %+v), want %d (last %+v)", len(work), work[len(work)-1], len(ex), ex[len(ex)-1])
	}
}

// saturated is two VOs that each alone could fill every slot.
func saturated() []Arrival {
	var work []Arrival
	for i := 0; i < 400; i++ {
		work = append(work, Arrival{DN: "/CN=a", FQAN: "/atlas", Bytes: 1e9}, Arrival{DN: "/CN=c", FQAN: "/cms", Bytes: 1e9})
	}
	return work
}

func TestRunSharesSlotTimeByThePolicyAndFinishesEveryFile(t *testing.T) {
	cfg := core.DefaultConfig()
	cfg.SharePolicy = core.PolicyVOMSVO
	cfg.SharePriority = map[string]int{"atlas": 60, "cms": 40}
	res, err := Run(cfg, saturated(), Options{Slots: 10, Overhead: 0})
	if err != nil {
		t.Fatal(err)
	}
	if res.Policy != "arc" || len(res.Groups) != 2 {
		t.Fatalf("result %+v", res)
	}
	a, c := res.Groups[0], res.Groups[1]
	if a.Files != 400 || c.Files != 400 {
		t.Fatalf("files done: atlas %d, cms %d, want 400 each", a.Files, c.Files)
	}
	// While both have work (until atlas is done), atlas gets 6 slots of 10.
	if a.Finished >= c.Finished {
		t.Fatalf("atlas finished at %s, cms at %s: the 60%% share should finish first", a.Finished, c.Finished)
	}
	wantA := 400 * 10 * time.Second / 6 // 400 files of 10 s on 6 slots
	if d := math.Abs(float64(a.Finished - wantA)); d > float64(30*time.Second) {
		t.Fatalf("atlas finished at %s, want about %s (6 of 10 slots)", a.Finished, wantA)
	}
	if res.Utilisation < 0.99 {
		t.Fatalf("utilisation %.3f while files waited, want 1", res.Utilisation)
	}
	if a.MeanWait <= 0 || a.MaxWait < a.MeanWait {
		t.Fatalf("waits mean %s max %s", a.MeanWait, a.MaxWait)
	}
	var b bytes.Buffer
	if err := res.Table(&b); err != nil || !strings.Contains(b.String(), "atlas") || !strings.Contains(b.String(), "fairness: Jain's index of slot-time over 2 groups") {
		t.Fatalf("table %q, %v", b.String(), err)
	}
}

func TestRunStopsAtItsLimitWithAClearError(t *testing.T) {
	_, err := Run(core.DefaultConfig(), []Arrival{{DN: "/CN=a", Bytes: 1e12}}, Options{Slots: 1, Limit: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "0 of 1 files done after 1m0s") {
		t.Fatalf("error %v", err)
	}
}

func TestSVGDrawsEveryGroupOfEveryPanel(t *testing.T) {
	cfg := core.DefaultConfig()
	cfg.SharePolicy = core.PolicyVOMSVO
	r1, err := Run(cfg, saturated(), Options{Slots: 10})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Policy = fairshare.NewEnstore(fairshare.EnstoreConfig{})
	r2, err := Run(cfg, saturated(), Options{Slots: 10})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := SVG(&b, []Result{r1, r2}, 10); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	if n := strings.Count(s, "<polygon"); n != 4 {
		t.Errorf("%d areas, want 2 groups × 2 panels", n)
	}
	for _, want := range []string{">arc<", ">enstore<", ">atlas<", ">cms<", "</svg>"} {
		if !strings.Contains(s, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
}

// TestNoGroupWithWorkWaitsForeverUnderAnyPolicy runs three groups that
// each could fill most slots, one of them favoured 98 to 1, under every
// policy, and checks that every group holds a transfer slot in every five
// minutes while it has work. What a policy lets wait on purpose is left
// out: SAM's back of the queue while front DTRs keep coming, DIRAC's
// background shares, Enstore's normal DTRs while admin ones fill every
// slot (docs/scheduling.md, Policies).
func TestNoGroupWithWorkWaitsForeverUnderAnyPolicy(t *testing.T) {
	var work []Arrival
	for at := time.Duration(0); at < time.Hour; at += 2 * time.Second {
		for _, vo := range []string{"atlas", "cms", "lhcb"} {
			work = append(work, Arrival{At: at, DN: "/CN=" + vo, FQAN: "/" + vo, Bytes: 1e9})
		}
	}
	base := core.DefaultConfig()
	base.SharePolicy = core.PolicyVOMSVO
	policies := map[string]core.PolicyMaker{
		"arc":     nil,
		"dirac":   fairshare.NewDIRAC(fairshare.DIRACConfig{Groups: map[string]fairshare.DIRACGroup{"atlas": {Priority: 98, JobSharing: true}, "cms": {Priority: 1, JobSharing: true}, "lhcb": {Priority: 1, JobSharing: true}}, Slices: []fairshare.DIRACSlice{{Span: time.Hour, Weight: 1, MaxCorrection: 5}}}),
		"sam":     fairshare.NewSAM(fairshare.SAMConfig{Fractions: map[string]float64{"atlas": 0.98, "cms": 0.01, "lhcb": 0.01}}),
		"enstore": fairshare.NewEnstore(fairshare.EnstoreConfig{}),
	}
	for name, p := range policies {
		t.Run(name, func(t *testing.T) {
			cfg := base
			cfg.SharePriority = map[string]int{"atlas": 98, "cms": 1, "lhcb": 1}
			cfg.Policy = p
			res, err := Run(cfg, work, Options{Slots: 10, Sample: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			for _, vo := range []string{"atlas", "cms", "lhcb"} {
				last := time.Duration(0)
				for _, s := range res.Samples {
					if s.At > time.Hour {
						break
					}
					if s.Running[vo] > 0 {
						last = s.At
					}
					if s.At-last > 5*time.Minute {
						t.Fatalf("%s held no transfer slot from %s to %s while it had work", vo, last, s.At)
					}
				}
			}
		})
	}
}

func TestWorkloadActivitiesAreReadWrittenAndSplitByTheirWeights(t *testing.T) {
	in := "at,dn,fqan,bytes,activity\n0,/CN=a,/atlas,100,Production Input\n0,/CN=b,/atlas,100,\n"
	work, err := ReadWorkload(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if work[0].Activity != "Production Input" || work[0].Group() != "atlas#Production Input" || work[1].Group() != "atlas" {
		t.Fatalf("read %+v (groups %q, %q)", work, work[0].Group(), work[1].Group())
	}
	if _, err := ReadWorkload(strings.NewReader("at,dn,bytes,activity\n0,/CN=a,1,x\x01y\n")); err == nil || !strings.Contains(err.Error(), "line 2: activity") {
		t.Fatalf("a bad activity: %v", err)
	}
	var b bytes.Buffer
	if err := WriteWorkload(&b, work); err != nil {
		t.Fatal(err)
	}
	if back, err := ReadWorkload(&b); err != nil || back[0] != work[0] || back[1] != work[1] {
		t.Fatalf("read back %+v, %v", back, err)
	}

	// Two activities of one VO, weighted 3:1, each with enough work to
	// fill every slot: while both have work, the slots split 3:1.
	cfg := core.DefaultConfig()
	cfg.SharePolicy = core.PolicyVOMSVO + "+activity"
	cfg.ActivityWeights = core.ActivityWeights{"atlas": {"Production Input": 3, "default": 1}}
	work = nil
	for range 400 {
		work = append(work, Arrival{DN: "/CN=a", FQAN: "/atlas", Bytes: 1e9, Activity: "Production Input"},
			Arrival{DN: "/CN=b", FQAN: "/atlas", Bytes: 1e9, Activity: "Express"})
	}
	res, err := Run(cfg, work, Options{Slots: 8, Overhead: 0})
	if err != nil {
		t.Fatal(err)
	}
	// Express is not in atlas's table: it is reported, as it is
	// scheduled, under default.
	if len(res.Groups) != 2 || res.Groups[0].Group != "atlas#Production Input" || res.Groups[1].Group != "atlas#default" {
		t.Fatalf("groups %+v", res.Groups)
	}
	prod, express := res.Groups[0], res.Groups[1]
	// Production's 400 files of 10 s on 6 of the 8 slots.
	want := 400 * 10 * time.Second / 6
	if d := math.Abs(float64(prod.Finished - want)); d > float64(30*time.Second) || express.Finished <= prod.Finished {
		t.Fatalf("production finished at %s, want about %s (6 of 8 slots); express at %s, after it", prod.Finished, want, express.Finished)
	}
}

// The figure of docs/scheduling.md's Activities: testdata/activities.csv
// under its settings holds 36/6/18/40 of 100 slots while all have work.
func TestActivitiesWorkloadSplitsAsTheDocsSay(t *testing.T) {
	f, err := os.Open("testdata/activities.csv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	work, err := ReadWorkload(f)
	if err != nil {
		t.Fatal(err)
	}
	cfg := core.DefaultConfig()
	cfg.SharePolicy = core.PolicyVOMSVO + "+activity"
	cfg.SharePriority = map[string]int{"atlas": 60, "cms": 40}
	cfg.ActivityWeights = core.ActivityWeights{"atlas": {"Production Input": 0.6, "User Subscriptions": 0.1, "default": 0.3}}
	res, err := Run(cfg, work, Options{Slots: 100, Overhead: 0, Sample: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"atlas#Production Input": 36, "atlas#User Subscriptions": 6, "atlas#default": 18, "cms#Production Input": 40}
	checked := 0
	for _, s := range res.Samples {
		if s.At > 0 && s.At <= 20*time.Second {
			if fmt.Sprint(s.Running) != fmt.Sprint(want) {
				t.Fatalf("slots at %s: %v, want %v", s.At, s.Running, want)
			}
			checked++
		}
	}
	if checked != 4 {
		t.Fatalf("%d samples in the first 20 s, want 4", checked)
	}
}
