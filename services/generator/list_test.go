package generator

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/job"
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

func TestAJobListLongerThanAMessageKeepsTheLatestAndSaysThereIsMore(t *testing.T) {
	var reply api.JobListReply
	for i := range 1000 {
		reply.Jobs = append(reply.Jobs, api.JobRecord{Job: job.Job{ID: fmt.Sprintf("job-%04d", i), Name: strings.Repeat("n", 200)}})
	}
	const limit = 64 << 10
	b, err := fitJobList(reply, limit)
	if err != nil {
		t.Fatal(err)
	}
	var got api.JobListReply
	if err := json.Unmarshal(b, &got); err != nil || len(b) > limit {
		t.Fatalf("%d bytes (%v), want at most %d", len(b), err, limit)
	}
	if !got.More || len(got.Jobs) < 100 || got.Jobs[0].Job.ID != "job-0000" {
		t.Fatalf("%d jobs, more %v, first %q: want the latest that fit and more", len(got.Jobs), got.More, got.Jobs[0].Job.ID)
	}
	if b, _ := fitJobList(api.JobListReply{Jobs: reply.Jobs[:3]}, limit); !strings.Contains(string(b), `"job-0002"`) || strings.Contains(string(b), `"more"`) {
		t.Fatalf("a short list was cut: %s", b)
	}
}
