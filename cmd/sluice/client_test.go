package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
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

func TestSharesSayWhileARestartedSchedulerStillReadsItsStoredDTRs(t *testing.T) {
	for _, reading := range []bool{false, true} {
		var b strings.Builder
		printShares(&b, api.SharesReply{Reading: reading, Shares: []api.ShareStats{
			{Share: "atlas-download", State: dtr.Transfer, Queued: 900, Unread: 700},
			{Share: "cms-download", State: dtr.Transfer, Queued: 50, Unread: 30}}})
		said := strings.Contains(b.String(), "still reading its stored DTRs, about 730 of those queued not yet read")
		if said != reading {
			t.Errorf("reading %v: sluice shares printed\n%s", reading, b.String())
		}
	}
}

func TestAJobOverTheServersMaxPayloadIsRefusedNamingBothSizes(t *testing.T) {
	ns, err := bus.Embedded(filepath.Join(t.TempDir(), "js"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	t.Setenv("SLUICE_NATS_URL", ns.ClientURL())
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	limit := nc.MaxPayload()
	nc.Close()
	// No generator runs: the client refuses before anything is sent.
	var files strings.Builder
	files.WriteString(`{"files":[`)
	for i := 0; files.Len() <= int(limit); i++ {
		if i > 0 {
			files.WriteByte(',')
		}
		fmt.Fprintf(&files, `{"source":"https://src.example/data/file-%d","destination":"file:///data/file-%d"}`, i, i)
	}
	files.WriteString(`]}`)
	job := filepath.Join(t.TempDir(), "job.json")
	if err := os.WriteFile(job, []byte(files.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = run([]string{"submit", job}, &out)
	for _, want := range []string{fmt.Sprintf("the request is %d bytes", files.Len()), fmt.Sprintf("more than the %d", limit), "split the job"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v, want one saying %q", err, want)
		}
	}
}
