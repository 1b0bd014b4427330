package scheduler

import (
	"maps"
	"strings"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/api"
)

// A control request whose body is JSON null (or any value that is not an
// object), or whose values are out of bounds, is refused with a reason at
// the edge, not taken as an empty request or left to the core.
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

// Share priorities (SLUICE_SHAREPRIORITY, sluice reconfigure) take
// Sluice's share=prio and ARC's "share prio" forms, spaces around "=" too:
// "atlas = 80" is the share atlas, not a share "atlas =" that no DTR is in.
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

func TestReconfigureWarnsOfSharesWithoutDTRs(t *testing.T) {
	now := api.SharesReply{
		Shares:   []api.ShareStats{{Share: "atlas-download"}, {Share: "cms"}, {Share: "belle#Express-download"}},
		Retrying: map[string]int{"lhcb": 1},
	}
	tests := []struct {
		name   string
		prios  map[string]int
		policy string
		want   []string // a word of each warning, in order
	}{
		{"shares that have DTRs", map[string]int{"atlas": 80, "cms": 20, "lhcb": 5}, "voms:vo", nil},
		{"a share with none yet", map[string]int{"atlas": 80, "alice": 20}, "voms:vo", []string{`"alice" has no DTRs queued`}},
		{"no share policy", map[string]int{"alice": 20, "belle": 5}, "", []string{`"alice" has no DTRs and will get none`, `"belle"`}},
		{"a VO of activity shares", map[string]int{"belle": 80, "belle#Express": 90, "alice": 20}, "voms:vo+activity", []string{`"alice" has no DTRs queued`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := unknownShares(tt.prios, now, tt.policy)
			if len(got) != len(tt.want) {
				t.Fatalf("warnings %q, want %d", got, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %q, want it to say %q", got[i], w)
				}
			}
		})
	}
}
