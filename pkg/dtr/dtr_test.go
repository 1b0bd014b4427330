package dtr

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// ValidateURL refuses at submission what the transfer client would refuse
// later as INTERNAL_LOGIC (failing the DTR after one attempt), and URLs
// that are not UTF-8, which would change on their way through JSON. The
// fuzz targets FuzzValidateURLRefusesPasswordsWithoutQuotingThem and
// pkg/transfer's FuzzURLsAreCheckedAsAtSubmissionAndFilesStayInsideTheirRoots
// found these rows.
func TestValidateURLRefusesWhatNoProtocolCanMove(t *testing.T) {
	tests := []struct {
		url  string
		want string // "" means accepted
	}{
		{"s3://h:9000/bucket/key", ""},
		{"s3s://h/bucket/a/b", ""},
		{"s3://h/bucket", "an S3 URL is s3://host[:port]/bucket/key"},
		{"s3://h/bucket/", "an S3 URL is s3://host[:port]/bucket/key"},
		{"s3s://h/", "an S3 URL is s3://host[:port]/bucket/key"},
		{"s3://h", "an S3 URL is s3://host[:port]/bucket/key"},
		{"root://h:1094//data/f", ""},
		{"root://h/data/f", "an xrootd URL is root://host[:port]//absolute/path"},
		{"root://h", "an xrootd URL is root://host[:port]//absolute/path"},
		{"https://h/caf%C3%A9", ""},
		{"https://h/café", ""},
		{"https://h/caf\xe9", "URL is not valid UTF-8"},
		{"file:///data/\xff", "URL is not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			err := ValidateURL(tt.url)
			if tt.want == "" && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}

func TestValidateURLNeverQuotesAPassword(t *testing.T) {
	for _, u := range []string{
		"https://alice:s3cr3t@h/x",
		"https://alice:s3cr3t@h/\xff",
		"ftp://alice:s3cr3t@h/x",
		"https://alice:s3cr3t@h:port/x",
		"s3://alice:s3cr3t@h/bucket",
	} {
		err := ValidateURL(u)
		if err == nil || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("ValidateURL(%q) = %v, want a refusal that does not quote the password", u, err)
		}
	}
}

// A DTR's job_id must make a key the generator can use: it keeps a job's
// final DTRs under "<job id>.f.<dtr id>", so a job_id with a space or a
// "*" would make a key the key-value store refuses (the final event
// redelivered every second for ever), and one with a dot would reach into
// the keys of another job.
func TestValidateRefusesAJobIDTheGeneratorCannotUse(t *testing.T) {
	tests := []struct {
		jobID string
		ok    bool
	}{
		{"", true},
		{"reco-2024_03", true},
		{strings.Repeat("a", 64), true},
		{strings.Repeat("a", 65), false},
		{"a job", false},
		{"a*", false},
		{"victim.f", false},
		{"réco", false},
		{"a\n", false},
		{"a/b", false},
		{"-_Z9", true},
		{"a:b", false},
	}
	for _, tt := range tests {
		t.Run(tt.jobID, func(t *testing.T) {
			d := &DTR{ID: uuid.New(), JobID: tt.jobID, Source: "https://h/a", Destination: "file:///a"}
			err := d.Validate()
			if tt.ok != (err == nil) {
				t.Fatalf("Validate = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "job_id") {
				t.Fatalf("error %q does not name job_id", err)
			}
			if ValidJobID(tt.jobID) != (tt.ok && tt.jobID != "") {
				t.Fatalf("ValidJobID(%q) = %v", tt.jobID, !tt.ok)
			}
		})
	}
}

func TestValidateRefusesTPCOnlyForADTRThatCanNeverBeAThirdPartyCopy(t *testing.T) {
	tests := []struct {
		name     string
		src, dst string
		replicas []string
		stage    bool
		err      string
	}{
		{"https to davs", "https://a/f", "davs://b/f", nil, false, ""},
		{"a local destination", "https://a/f", "file:///data/f", nil, false, "tpc: only, but the destination is file://"},
		{"an xrootd source", "root://a//f", "https://b/f", nil, false, "tpc: only, but the source is root://"},
		{"an S3 replica", "https://a/f", "https://b/f", []string{"https://a/f", "s3://c/bucket/f"}, false, "tpc: only, but the replica 2 is s3://"},
		{"a staged source", "https://a/f", "https://b/f", nil, true, "tpc: only, but stage copies the source to local disk first"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &DTR{ID: uuid.New(), Source: tt.src, Destination: tt.dst, Replicas: tt.replicas,
				Options: Options{TPC: TPCOnly, Stage: tt.stage}}
			err := d.Validate()
			if tt.err == "" && err != nil || tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
				t.Fatalf("Validate = %v, want %q", err, tt.err)
			}
			d.Options.TPC = TPCAuto
			if err := d.Validate(); err != nil {
				t.Fatalf("with tpc auto: %v", err)
			}
		})
	}
}

func TestOptionsCheckNamesTheFieldOfEachProblem(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  Options
		want string // "" for none
	}{
		{"empty", Options{}, ""},
		{"activity and tpc", Options{Activity: "Production Input", TPC: TPCOnly}, ""},
		{"every tpc mode", Options{TPC: TPCNever}, ""},
		{"long activity", Options{Activity: strings.Repeat("a", MaxActivity+1)}, "activity: 65 bytes"},
		{"activity with a newline", Options{Activity: "a\nb"}, "not printable"},
		{"activity with trailing space", Options{Activity: "User "}, "trailing space"},
		{"activity with the share separator", Options{Activity: "g0#P"}, `holds "#"`},
		{"unknown tpc", Options{TPC: "sometimes"}, `tpc: "sometimes" is none of auto, only, never`},
		{"bad checksum", Options{Checksum: "adler32:xyz"}, "checksum: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := errors.Join(tc.opt.Check()...)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check: %v, want no problem", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Check: %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// A transition records when the DTR entered its state; a record written
// before StateEntered was kept reads as having entered it at its last
// update.
func TestEnteredStateIsWhenTheDTRLastChangedStateOrItsRecordsUpdate(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	d := &DTR{ID: uuid.New(), State: New}
	if err := d.Transition(CacheWait, t0); err != nil {
		t.Fatal(err)
	}
	d.Updated = t0.Add(time.Hour) // a priority change, say
	if got := d.EnteredState(); !got.Equal(t0) {
		t.Fatalf("entered its state at %s, want %s", got, t0)
	}
	var old DTR
	if err := json.Unmarshal([]byte(`{"id":"c3e12bfa-ba9a-4a45-be73-0b3b2a206e1c","source":"http://a/f","destination":"file:///f",`+
		`"state":"CACHE_WAIT","created":"2026-11-26T09:00:00Z","updated":"2026-11-26T10:00:00Z"}`), &old); err != nil {
		t.Fatal(err)
	}
	if got := old.EnteredState(); !got.Equal(t0) || !old.StateEntered.IsZero() {
		t.Fatalf("a record without state_entered entered its state at %s (state_entered %s), want its updated, %s", got, old.StateEntered, t0)
	}
}
