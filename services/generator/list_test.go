package generator

import (
	"strings"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/api"
)

func TestAJobListRequestIsReadStrictly(t *testing.T) {
	tests := []struct {
		in      string
		want    api.JobListRequest
		wantErr string
	}{
		{"", api.JobListRequest{Limit: api.DefaultJobList}, ""},
		{"{}", api.JobListRequest{Limit: api.DefaultJobList}, ""},
		{`{"state":"ended","limit":5}`, api.JobListRequest{State: "ended", Limit: 5}, ""},
		{`{"state":"lost"}`, api.JobListRequest{}, `state "lost"`},
		{`{"limit":5000}`, api.JobListRequest{}, "limit 5000"},
		{`{"limit":-1}`, api.JobListRequest{}, "limit -1"},
		{`{"colour":"red"}`, api.JobListRequest{}, "unknown field"},
		{`{} {}`, api.JobListRequest{}, "after the JSON object"},
	}
	for _, tt := range tests {
		got, err := decodeJobListRequest([]byte(tt.in))
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: error %v, want one saying %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
}
