package scitag

import (
	"strings"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestAnOwnersVOAndActivityMapToTheirTag(t *testing.T) {
	tab, err := New(Config{Experiments: "atlas=2, cms=3", Activities: "default=1,Production Input=2,cms:Production Input=5,atlas:default=9"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name     string
		fqans    []string
		activity string
		want     int
	}{
		{"a VOMS FQAN and a global activity", []string{"/atlas/Role=production"}, "Production Input", 2<<6 | 2},
		{"a token group and the VO's own entry", []string{"/cms", "/atlas"}, "Production Input", 3<<6 | 5},
		{"no activity is the VO's default", []string{"/atlas"}, "", 2<<6 | 9},
		{"an unknown activity falls back to default", []string{"/cms/production"}, "User Subscriptions", 3<<6 | 1},
		{"an unmapped VO gets none", []string{"/lhcb"}, "Production Input", 0},
		{"no FQAN gets none", nil, "Production Input", 0},
	} {
		if got := tab.Of(dtr.Identity{DN: "/CN=x", FQANs: tt.fqans}, tt.activity); got != tt.want {
			t.Errorf("%s: tag %d, want %d", tt.name, got, tt.want)
		}
	}
	chosen := &dtr.DTR{Owner: dtr.Identity{FQANs: []string{"/cms"}}, Options: dtr.Options{SciTag: 7<<6 | 7}}
	if got := tab.For(chosen); got != 7<<6|7 {
		t.Errorf("a tag the trusted submitter chose became %d", got)
	}
}

func TestAnActivityWithoutADefaultIsNotMarked(t *testing.T) {
	tab, err := New(Config{Experiments: "atlas=2", Activities: "Data Rebalancing=4"})
	if err != nil {
		t.Fatal(err)
	}
	if got := tab.Of(dtr.Identity{FQANs: []string{"/atlas"}}, "Analysis Input"); got != 0 {
		t.Fatalf("an unmapped activity with no default got tag %d", got)
	}
	var none *Table
	if none.For(&dtr.DTR{Owner: dtr.Identity{FQANs: []string{"/atlas"}}}) != 0 {
		t.Fatal("a nil table marked a transfer")
	}
}

func TestAnUnusableSciTagConfigurationIsRefusedNamingTheEntry(t *testing.T) {
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{Experiments: "atlas"}, `entry "atlas" is not name=id`},
		{Config{Experiments: "atlas=1024"}, "1–1023"},
		{Config{Experiments: "atlas=0"}, "1–1023"},
		{Config{Experiments: "/atlas=2"}, "atlas, not /atlas"},
		{Config{Experiments: "atlas=2,atlas=3"}, "given twice"},
		{Config{Experiments: "atlas=2", Activities: "default=64"}, "1–63"},
		{Config{Experiments: "atlas=2", Activities: "default=x"}, "1–63"},
		{Config{Activities: "default=1"}, "SLUICE_SCITAG_EXPERIMENTS is empty"},
	} {
		_, err := New(tt.cfg)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: %v, want an error saying %q", tt.cfg, err, tt.want)
		}
	}
}
