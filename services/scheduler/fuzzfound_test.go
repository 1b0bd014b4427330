package scheduler

import (
	"context"
	"maps"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/api"
)

// Found by FuzzControlRequestsAreRefusedWithAReasonOrWithinBounds and
// FuzzDecodeSubmitNeverPanicsAndRefusesWithAReason: a body of JSON null (or
// of any value that is not an object) was taken as an empty request, and
// the checks of bounds came only later, in the core, if at all.
func TestControlRequestsAreRefusedWithAReason(t *testing.T) {
	const id = "c3e12bfa-ba9a-4a45-be73-0b3b2a206e1c"
	decoders := map[string]func([]byte) error{
		"priority":    func(b []byte) error { _, err := decodePriorityRequest(b); return err },
		"cancel":      func(b []byte) error { _, err := decodeCancelRequest(b); return err },
		"reconfigure": func(b []byte) error { _, err := decodeReconfigureRequest(b); return err },
	}
	tests := []struct {
		endpoint, body string
		want           string // "" means accepted
	}{
		{"priority", `{"dtr":"` + id + `","priority":90}`, ""},
		{"priority", `null`, "malformed request: null is not a JSON object"},
		{"priority", `[1]`, "malformed request: an array is not a JSON object"},
		{"priority", `{"priority":90}`, "dtr is missing"},
		{"priority", `{"dtr":"` + id + `","priority":0}`, "priority 0 is outside 1–100"},
		{"priority", `{"dtr":"` + id + `","priority":101}`, "priority 101 is outside 1–100"},
		{"priority", `{"dtr":"` + id + `","prio":5}`, `unknown field "prio"`},
		{"priority", `{"dtr":"` + id + `","priority":5} {}`, "trailing data"},
		{"cancel", `{"dtr":"` + id + `"}`, ""},
		{"cancel", `{"job":"reco-42"}`, ""},
		{"cancel", `null`, "null is not a JSON object"},
		{"cancel", `{}`, "name either a dtr or a job"},
		{"cancel", `{"dtr":"` + id + `","job":"reco-42"}`, "name either a dtr or a job"},
		{"reconfigure", `{"sharepriority":{"atlas":80,"cms":20}}`, ""},
		{"reconfigure", `"atlas=80"`, "a string is not a JSON object"},
		{"reconfigure", `{"sharepriority":null}`, "sharepriority is missing"},
		{"reconfigure", `{"sharepriority":{"atlas":0,"cms":200}}`, `share "atlas": priority 0 is outside 1–100` + "\n" + `share "cms": priority 200 is outside 1–100`},
		{"reconfigure", `{"sharepriority":{"":50}}`, "a share name is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.endpoint+" "+tt.body, func(t *testing.T) {
			err := decoders[tt.endpoint]([]byte(tt.body))
			if tt.want == "" && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}

// Found by FuzzDecodeSubmitNeverPanicsAndRefusesWithAReason: a job_id the
// generator cannot use as a key was taken (see pkg/dtr), a null body was
// refused only for what it lacked, and any ce-traceparent was carried as
// the DTR's trace parent.
func TestDecodeSubmitRefusesBadJobIDsAndDropsBadTraceParents(t *testing.T) {
	const (
		good = `{"id":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","source":"file:///a","destination":"file:///b"`
		tp   = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	)
	binary := func(body, traceparent string) *nats.Msg {
		m := nats.NewMsg(api.SubjectSubmit)
		m.Header.Set("ce-specversion", "1.0")
		m.Header.Set("ce-id", "1")
		m.Header.Set("ce-source", "test")
		m.Header.Set("ce-type", api.TypeSubmit)
		if traceparent != "" {
			m.Header.Set("ce-traceparent", traceparent)
		}
		m.Data = []byte(body)
		return m
	}
	plain := func(body string) *nats.Msg { m := nats.NewMsg(api.SubjectSubmit); m.Data = []byte(body); return m }
	tests := []struct {
		name    string
		msg     *nats.Msg
		wantErr string
		wantTP  string
	}{
		{"a job id", plain(good + `,"job_id":"reco-42"}`), "", ""},
		{"a job id with a space", plain(good + `,"job_id":"reco 42"}`), `job_id "reco 42" is not 1–64 characters`, ""},
		{"a job id with a dot", plain(good + `,"job_id":"victim.f"}`), `job_id "victim.f"`, ""},
		{"null", plain(`null`), "DTR JSON: null is not a JSON object", ""},
		{"a valid traceparent is kept", binary(good+`}`, tp), "", tp},
		{"a traceparent of zeros is dropped", binary(good+`}`, "00-00000000000000000000000000000000-0000000000000000-00"), "", ""},
		{"a traceparent that is not one is dropped", binary(good+`}`, "garbage"), "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := DecodeSubmit(context.Background(), tt.msg)
			if tt.wantErr != "" {
				if d != nil || err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, %v, want an error saying %q", d, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.TraceParent != tt.wantTP {
				t.Fatalf("trace parent %q, want %q", d.TraceParent, tt.wantTP)
			}
		})
	}
}

// Found while writing FuzzControlRequestsAreRefusedWithAReasonOrWithinBounds:
// "atlas = 80" and "atlas= 80" made a share named "atlas =" or "atlas=",
// which no DTR is in, without a word.
func TestParseSharePrioritiesTakesSluicesAndARCsForms(t *testing.T) {
	tests := []struct {
		in      string
		want    map[string]int
		wantErr string
	}{
		{"atlas=80,cms=20", map[string]int{"atlas": 80, "cms": 20}, ""},
		{"atlas:validation 80, atlas:slow-prod=20", map[string]int{"atlas:validation": 80, "atlas:slow-prod": 20}, ""},
		{"atlas = 80", map[string]int{"atlas": 80}, ""},
		{"atlas= 80", map[string]int{"atlas": 80}, ""},
		{"atlas =80", map[string]int{"atlas": 80}, ""},
		{"atlas\t80", map[string]int{"atlas": 80}, ""},
		{"/DC=org/CN=Alice Smith=50", map[string]int{"/DC=org/CN=Alice Smith": 50}, ""},
		{"", map[string]int{}, ""},
		{"=5", nil, `"=5" is not share=priority`},
		{" = 5", nil, `"= 5" is not share=priority`},
		{"atlas", nil, `"atlas" is not share=priority`},
		{"atlas=", nil, "priority must be an integer 1–100"},
		{"atlas=0", nil, "priority must be an integer 1–100"},
		{"atlas=101", nil, "priority must be an integer 1–100"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := api.ParseSharePriorities(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !maps.Equal(got, tt.want) {
				t.Fatalf("got %v, %v, want %v", got, err, tt.want)
			}
		})
	}
}
