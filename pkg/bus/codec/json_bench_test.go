package codec

import (
	"encoding/json"
	"testing"
	"time"

	gojson "github.com/goccy/go-json"
	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

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
