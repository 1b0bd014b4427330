package codec

import (
	"encoding/json"
	"math/rand/v2"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	gojson "github.com/goccy/go-json"
	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// randomDTR fills every field of a DTR, or leaves it zero, at random, with
// strings that need escaping.
func randomDTR(r *rand.Rand) dtr.DTR {
	pieces := []string{"", "a", "file:///a b", "<&>", "\u2028\u2029", "\x00\x1f", "é", "\"\\", "\xff", "日本", "https://h:1/p?q=1&r=2#f"}
	str := func() string {
		var b strings.Builder
		for range r.IntN(4) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		return b.String()
	}
	tm := func() time.Time {
		if r.IntN(3) == 0 {
			return time.Time{}
		}
		return time.Unix(r.Int64N(4e9), r.Int64N(1e9)).In(time.FixedZone("z", 3600*(r.IntN(25)-12)))
	}
	strs := func() []string {
		switch r.IntN(3) {
		case 0:
			return nil
		case 1:
			return []string{}
		}
		return []string{str(), str()}
	}
	d := dtr.DTR{ID: uuid.New(), JobID: str(), Source: str(), Destination: str(),
		Owner: dtr.Identity{DN: str(), FQANs: strs()}, Direction: dtr.Direction(str()), UserPriority: r.IntN(200) - 50,
		Options: dtr.Options{Checksum: str(), Overwrite: r.IntN(2) == 0, FailureAllowed: r.IntN(2) == 0, Stage: r.IntN(2) == 0, NoCache: r.IntN(2) == 0},
		Share:   str(), Priority: r.IntN(100), State: dtr.State(r.IntN(40)), Attempts: r.IntN(10), MaxAttempts: r.IntN(10),
		Cancel: r.IntN(2) == 0, Size: r.Int64() - r.Int64(), Bytes: r.Int64N(1 << 40), Checksum: str(),
		Created: tm(), Updated: tm(), Started: tm(), Ended: tm(), NextProcess: tm(), TraceParent: str(),
		TransferGrant: str(), Cleanup: r.IntN(2) == 0, Grant: str(), TURL: str(), Replicas: strs(), Replica: r.IntN(3),
		Cache: str(), CacheFile: str(), StateEntered: tm()}
	if r.IntN(2) == 0 {
		d.Error = &dtr.Failure{Kind: dtr.ErrorKind(str()), Text: str(), State: dtr.State(r.IntN(40)), Location: str()}
	}
	return d
}

func TestEncodeJSONWritesWhatEncodingJSONWrites(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		d := randomDTR(r)
		want, errStd := json.Marshal(d)
		got, err := EncodeJSON(d)
		if (err == nil) != (errStd == nil) {
			t.Fatalf("DTR %d: error %v, encoding/json's %v", i, err, errStd)
		}
		if string(got) != string(want) {
			t.Fatalf("DTR %d:\nEncodeJSON    %s\nencoding/json %s", i, got, want)
		}
		// And the Submission, the results and grants that carry DTRs.
		for _, v := range []any{d.Submission(), api.Result{DTR: d.ID, Grant: d.Grant, State: d.State, Error: d.Error, Size: d.Size, Checksum: d.Checksum, Started: d.Started},
			api.Grant{ID: d.Grant, Stage: dtr.StageDelivery, State: d.State, DTR: &d, LeaseSeconds: r.Float64() * 1e3}} {
			want, _ := json.Marshal(v)
			got, _ := EncodeJSON(v)
			if string(got) != string(want) {
				t.Fatalf("%T %d:\nEncodeJSON    %s\nencoding/json %s", v, i, got, want)
			}
		}
	}
}

// TestDTRWireHasTheFieldsOfADTR keeps dtrWire in step with dtr.DTR: the
// same fields in the same order with the same JSON names, the times that
// omitzero leaves out as pointers with omitempty.
func TestDTRWireHasTheFieldsOfADTR(t *testing.T) {
	dt, wt := reflect.TypeFor[dtr.DTR](), reflect.TypeFor[dtrWire]()
	if dt.NumField() != wt.NumField() {
		t.Fatalf("dtr.DTR has %d fields, dtrWire %d", dt.NumField(), wt.NumField())
	}
	for i := range dt.NumField() {
		df, wf := dt.Field(i), wt.Field(i)
		wantType, wantTag := df.Type, df.Tag.Get("json")
		if name, ok := strings.CutSuffix(wantTag, ",omitzero"); ok && df.Type == reflect.TypeFor[time.Time]() {
			wantType, wantTag = reflect.PointerTo(df.Type), name+",omitempty"
		}
		if wf.Name != df.Name || wf.Type != wantType || wf.Tag.Get("json") != wantTag {
			t.Errorf("field %d: dtrWire has %s %s %q, want %s %s %q", i, wf.Name, wf.Type, wf.Tag.Get("json"), df.Name, wantType, wantTag)
		}
	}
}

// benchDTR is a DTR as it goes to delivery: owner, options, times, grant.
func benchDTR() *dtr.DTR {
	t0 := time.Date(2026, 11, 25, 10, 0, 0, 123456789, time.UTC)
	return &dtr.DTR{ID: uuid.New(), JobID: "job-42", Source: "https://se.example.org:8443/atlas/data/file-000123.root",
		Destination: "file:///data/cache/atlas/file-000123.root", Owner: dtr.Identity{DN: "/DC=org/CN=robot", FQANs: []string{"/atlas/Role=production"}},
		Options: dtr.Options{Checksum: "adler32"}, Share: "atlas", Priority: 50, State: dtr.Transferring, Attempts: 1, MaxAttempts: 5,
		Size: 1 << 20, Created: t0, Updated: t0.Add(time.Second), Started: t0.Add(time.Second), Grant: "x.123",
		TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
}

func benchGrants() api.Grants {
	gs := api.Grants{}
	for range 100 {
		gs.Grants = append(gs.Grants, api.Grant{ID: "x.123", Stage: dtr.StageDelivery, State: dtr.Transferring, LeaseSeconds: 120,
			TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", DTR: benchDTR()})
	}
	return gs
}

func benchResults() api.Results {
	rs := api.Results{}
	t0 := time.Date(2026, 11, 25, 10, 0, 0, 123456789, time.UTC)
	for range 100 {
		rs.Results = append(rs.Results, api.Result{DTR: uuid.New(), Grant: "x.123", State: dtr.Transferring, Size: 1 << 20, Bytes: 1 << 20,
			Checksum: "adler32:0a1b2c3d", Started: t0, Ended: t0.Add(time.Second), TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
	}
	return rs
}

// BenchmarkJSON encodes and decodes a DTR, a Grants event of 100 grants and
// a Results event of 100 results with EncodeJSON and DecodeJSON, and with
// encoding/json and goccy/go-json as they are (a DTR without its dtrWire).
func BenchmarkJSON(b *testing.B) {
	libs := []struct {
		name      string
		marshal   func(any) ([]byte, error)
		unmarshal func([]byte, any) error
	}{
		{"bus", EncodeJSON, DecodeJSON},
		{"encoding-json", json.Marshal, json.Unmarshal},
		{"goccy", gojson.Marshal, gojson.Unmarshal},
	}
	values := []struct {
		name string
		v    any
		new  func() any
	}{
		{"dtr", benchDTR(), func() any { return new(dtr.DTR) }},
		{"grants100", benchGrants(), func() any { return new(api.Grants) }},
		{"results100", benchResults(), func() any { return new(api.Results) }},
	}
	for _, lib := range libs {
		for _, v := range values {
			b.Run(lib.name+"/encode/"+v.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := lib.marshal(v.v); err != nil {
						b.Fatal(err)
					}
				}
			})
			data, err := json.Marshal(v.v)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(lib.name+"/decode/"+v.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(data)))
				for b.Loop() {
					if err := lib.unmarshal(data, v.new()); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// The codec's JSON is goccy/go-json's: a move of these functions once left
// them on encoding/json, four times as slow, with every test still green.
func TestTheCodecWritesAndReadsWithGoccy(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{join .Imports " "}}`, ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports := strings.Fields(string(out))
	if !slices.Contains(imports, "github.com/goccy/go-json") || slices.Contains(imports, "encoding/json") {
		t.Fatalf("package codec imports %v: want goccy/go-json and not encoding/json", imports)
	}
}
