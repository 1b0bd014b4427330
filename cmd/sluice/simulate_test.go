package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// simulateWork writes a workload of two VOs that both wait for slots.
func simulateWork(t *testing.T) string {
	t.Helper()
	work := filepath.Join(t.TempDir(), "work.csv")
	csv := "at,dn,fqan,bytes\n" + strings.Repeat("0,/CN=a,/atlas,1000000000\n0,/CN=c,/cms,1000000000\n0,/CN=l,/lhcb,1000000000\n", 20)
	if err := os.WriteFile(work, []byte(csv), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SLUICE_SHAREPOLICY", "voms:vo")
	t.Setenv("SLUICE_SHAREPRIORITY", "atlas=50,cms=30,lhcb=20")
	return work
}

func TestSimulateWithShardsPrintsTheSplitAndTheCapacity(t *testing.T) {
	work := simulateWork(t)
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"one number of shards: the run, the split and the capacity",
			[]string{"--shards", "2"},
			[]string{"policy arc:", "2 shards (shares by load, budgets every 1s)", "SHARE", "atlas", "largest error", "decisions/s"}},
		{"a list: the comparison",
			[]string{"--shards", "1,2,4", "--shard-by", "hash"},
			[]string{"shares by hash", "SHARDS", "MAX ERROR", "DECISIONS/S", "1 SHARD", "4 SHARDS", "lhcb"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			args := append([]string{"simulate", "--slots", "10", "--capacity-runs", "1"}, tt.args...)
			if err := run(append(args, work), &out); err != nil {
				t.Fatal(err)
			}
			for _, want := range tt.want {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

func TestSimulateWithShardsPrintsJSONLikeTheRestOfSimulate(t *testing.T) {
	work := simulateWork(t)
	var out bytes.Buffer
	if err := run([]string{"simulate", "--slots", "10", "--capacity-runs", "1", "--shards", "1,2", "--json", work}, &out); err != nil {
		t.Fatal(err)
	}
	var runs []struct {
		Policy   string `json:"policy"`
		Shards   int    `json:"shards"`
		Groups   []any  `json:"groups"`
		Split    []any  `json:"split"`
		Capacity struct {
			Decisions          uint64  `json:"decisions"`
			DecisionsPerSecond float64 `json:"decisions_per_second"`
		} `json:"capacity"`
	}
	if err := json.Unmarshal(out.Bytes(), &runs); err != nil {
		t.Fatalf("%v in\n%s", err, out.String())
	}
	if len(runs) != 2 || runs[1].Shards != 2 || runs[0].Policy != "arc" || len(runs[1].Groups) != 3 || len(runs[1].Split) != 3 ||
		runs[1].Capacity.Decisions == 0 || runs[1].Capacity.DecisionsPerSecond <= 0 {
		t.Fatalf("runs %+v", runs)
	}
}

func TestSimulateRefusesBadShardsAndTwoExamples(t *testing.T) {
	work := simulateWork(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"simulate", "--shards", "0", work}, `--shards "0"`},
		{[]string{"simulate", "--shards", "1,two", work}, `--shards "1,two"`},
		{[]string{"simulate", "--shards", "2", "--shard-by", "random", work}, `shard by "random"`},
		{[]string{"simulate", "--example", "--scale-example"}, "not both"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args[1:], " "), func(t *testing.T) {
			if err := run(tt.args, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
		})
	}
}

func TestSimulateWritesTheScaleExample(t *testing.T) {
	file := filepath.Join(t.TempDir(), "scale.csv")
	if err := run([]string{"simulate", "--scale-example", "--write-example", file}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(b, []byte("\n")); n != 40916 || !bytes.Contains(b, []byte("/skao/Role=production")) {
		t.Fatalf("%d lines", n)
	}
}
