package generator

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// event is a job event with done DONE files, failed FAILED ones (each
// with a failure line) and pending files not yet final.
func event(done, failed, pending int) api.JobEvent {
	ev := api.JobEvent{JobRecord: api.JobRecord{Total: done + failed + pending, Done: done, Failed: failed}}
	ev.Job.ID = "job-1"
	for i := range done + failed {
		f := api.FileStat{FileRef: api.FileRef{Source: fmt.Sprintf("file:///in/%06d", i), Destination: fmt.Sprintf("file:///out/%06d", i)},
			State: dtr.Done, Size: 1024, Checksum: "adler32:00000001", Attempts: 1}
		if i >= done {
			f.State = dtr.Error
			ev.Failures = append(ev.Failures, "Failed in data staging: "+f.Source+": source does not exist")
		}
		ev.Files = append(ev.Files, f)
	}
	for i := range pending {
		ev.Pending = append(ev.Pending, api.FileRef{Source: fmt.Sprintf("file:///in/p%06d", i)})
	}
	return ev
}

func TestAJobEventTooLargeForAMessageLeavesOutLinesButNoCounts(t *testing.T) {
	for _, tt := range []struct {
		name                              string
		ev                                api.JobEvent
		limit                             int
		files, omitted, pending, failures int
		failuresOmitted, pendingOmitted   int
	}{
		{name: "an event that fits is whole", ev: event(10, 2, 3), limit: 1 << 20, files: 12, pending: 3, failures: 2},
		{name: "the lines of DONE files go first", ev: event(1000, 5, 0), limit: 8 << 10, files: 5, omitted: 1000, failures: 5},
		{name: "then every file line and the pending list", ev: event(1000, 200, 300), limit: 24 << 10,
			files: 0, omitted: 1200, failures: 200, pendingOmitted: 300},
		{name: "then the failure lines past the first hundred", ev: event(0, 3000, 0), limit: 16 << 10,
			files: 0, omitted: 3000, failures: keptFailures, failuresOmitted: 2900},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ev := tt.ev
			b, err := encodeToFit(&ev, tt.limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) > tt.limit {
				t.Fatalf("%d bytes, more than %d", len(b), tt.limit)
			}
			var got api.JobEvent
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if len(got.Files) != tt.files || got.FilesOmitted != tt.omitted || len(got.Pending) != tt.pending ||
				got.PendingOmitted != tt.pendingOmitted || len(got.Failures) != tt.failures || got.FailuresOmitted != tt.failuresOmitted {
				t.Errorf("files %d (omitted %d), pending %d (omitted %d), failures %d (omitted %d)",
					len(got.Files), got.FilesOmitted, len(got.Pending), got.PendingOmitted, len(got.Failures), got.FailuresOmitted)
			}
			if got.Done != tt.ev.Done || got.Failed != tt.ev.Failed || got.Total != tt.ev.Total {
				t.Errorf("counts %d/%d of %d, want %d/%d of %d", got.Done, got.Failed, got.Total, tt.ev.Done, tt.ev.Failed, tt.ev.Total)
			}
			for _, f := range got.Files {
				if f.State == dtr.Done && got.FilesOmitted > 0 {
					t.Errorf("a DONE line kept while lines were left out: %+v", f)
				}
			}
		})
	}
	t.Run("a record too large even alone is an error", func(t *testing.T) {
		ev := event(0, 3000, 0)
		ev.Job.ID = string(make([]byte, 4000))
		if _, err := encodeToFit(&ev, 1000); err == nil {
			t.Fatal("no error")
		}
	})
}

func TestAConfigBuiltInCodeTakesTheTagsDefaults(t *testing.T) {
	if n, err := strconv.Atoi(tagDefault("MaxFiles")); err != nil || n <= 0 {
		t.Fatalf("MaxFiles's default %q: %v", tagDefault("MaxFiles"), err)
	}
}
