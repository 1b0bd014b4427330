package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/checksum"
)

func TestCpCopiesOneFileAndFollowsIt(t *testing.T) {
	runningSluice(t, nil)
	dir := t.TempDir()
	src := filepath.Join(dir, "in.bin")
	data := []byte(strings.Repeat("the bytes of one file ", 1000))
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)

	t.Run("local paths, progress and statistics", func(t *testing.T) {
		out, err := runAnswered(t, "cp", "in.bin", filepath.Join(dir, "out", "a.bin"))
		if err != nil {
			t.Fatalf("cp: %v\n%s", err, out)
		}
		if got, _ := os.ReadFile(filepath.Join(dir, "out", "a.bin")); string(got) != string(data) {
			t.Fatal("the copy differs from its source")
		}
		for _, want := range []string{"submitted: 1 DTRs", "1/1 done", "finished: 1 files, 1 done"} {
			if !strings.Contains(out, want) {
				t.Errorf("printed\n%s\nwant %q", out, want)
			}
		}
	})
	t.Run("--json prints the ended job alone", func(t *testing.T) {
		sum, err := checksum.File(src, "adler32")
		if err != nil {
			t.Fatal(err)
		}
		out, err := runAnswered(t, "cp", "--json", "--checksum", sum, src, "file://"+filepath.Join(dir, "out", "b.bin"))
		if err != nil {
			t.Fatalf("cp --json: %v\n%s", err, out)
		}
		var ev api.JobEvent
		if err := json.Unmarshal([]byte(out), &ev); err != nil {
			t.Fatalf("not one JSON document: %v\n%s", err, out)
		}
		if ev.State != api.JobFinished || ev.Done != 1 || len(ev.Files) != 1 || ev.Files[0].Size != int64(len(data)) || len(ev.Files[0].TraceID) != 32 {
			t.Fatalf("job %+v", ev)
		}
		// status names the DTR's trace.
		out, err = runAnswered(t, "status", ev.Job.ID)
		if err != nil || !strings.Contains(out, "TRACE") || !strings.Contains(out, ev.Files[0].TraceID) {
			t.Fatalf("status %s (%v) does not name trace %s:\n%s", ev.Job.ID, err, ev.Files[0].TraceID, out)
		}
	})
	t.Run("a file not copied is exit status 3", func(t *testing.T) {
		out, err := runAnswered(t, "cp", filepath.Join(dir, "missing"), filepath.Join(dir, "out", "c.bin"))
		if exitCode(err) != exitJobEnded || !strings.Contains(err.Error(), "0 of 1 files done") {
			t.Fatalf("cp of a missing file: %v (exit %d)\n%s", err, exitCode(err), out)
		}
	})
	t.Run("--tpc only between local paths is refused, naming the end", func(t *testing.T) {
		out, err := runAnswered(t, "cp", "--tpc", "only", src, filepath.Join(dir, "out", "e.bin"))
		if err == nil || !strings.Contains(err.Error()+out, "tpc: only, but the destination is file://, which has no third-party copy") {
			t.Fatalf("cp --tpc only: %v\n%s", err, out)
		}
	})
	t.Run("--no-wait returns the job id", func(t *testing.T) {
		out, err := runAnswered(t, "cp", "--no-wait", "--json", src, filepath.Join(dir, "out", "d.bin"))
		var r api.SubmitReply
		if err != nil || json.Unmarshal([]byte(out), &r) != nil || r.JobID == "" || len(r.DTRs) != 1 {
			t.Fatalf("cp --no-wait --json: %v\n%s", err, out)
		}
		out, err = runAnswered(t, "submit", "--wait", "--json", "-") // nothing on stdin: a clear error
		if err == nil || exitCode(err) == 0 {
			t.Fatalf("submit of an empty description: %v\n%s", err, out)
		}
	})
}

func TestFileURLTakesURLsAsTheyAreAndPathsAsAbsoluteFileURLs(t *testing.T) {
	t.Chdir(t.TempDir())
	wd, _ := os.Getwd()
	tests := []struct{ arg, want string }{
		{"https://store.example.org/a/b?x=1", "https://store.example.org/a/b?x=1"},
		{"root://eos.example.org//eos/f", "root://eos.example.org//eos/f"},
		{"file:///data/f", "file:///data/f"},
		{"/data/f", "file:///data/f"},
		{"rel/f", "file://" + filepath.Join(wd, "rel/f")},
		{"./odd://name", "file://" + filepath.Join(wd, "odd:/name")},
		{"/a b/c#d", "file:///a%20b/c%23d"},
	}
	for _, tt := range tests {
		if got, err := fileURL(tt.arg); err != nil || got != tt.want {
			t.Errorf("fileURL(%q) = %q, %v; want %q", tt.arg, got, err, tt.want)
		}
	}
	if _, err := fileURL(""); err == nil {
		t.Error("an empty argument was taken")
	}
}

func TestJobsListsTheLatestFirstByState(t *testing.T) {
	runningSluice(t, nil)
	dir := t.TempDir()
	src := filepath.Join(dir, "in")
	if err := os.WriteFile(src, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runAnswered(t, "cp", "--name", "first", src, filepath.Join(dir, "a")); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := runAnswered(t, "cp", "--name", "second", filepath.Join(dir, "missing"), filepath.Join(dir, "b")); exitCode(err) != exitJobEnded {
		t.Fatalf("the failing copy: %v", err)
	}
	tests := []struct {
		args  []string
		names []string
		more  bool
	}{
		{nil, []string{"second", "first"}, false},
		{[]string{"--state", "failed"}, []string{"second"}, false},
		{[]string{"--state", "finished"}, []string{"first"}, false},
		{[]string{"--state", "ended", "--limit", "1"}, []string{"second"}, true},
		{[]string{"--state", "running"}, nil, false},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out, err := runAnswered(t, append([]string{"jobs", "--json"}, tt.args...)...)
			var r api.JobListReply
			if err != nil || json.Unmarshal([]byte(out), &r) != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			var names []string
			for _, j := range r.Jobs {
				names = append(names, j.Job.Name)
			}
			if strings.Join(names, ",") != strings.Join(tt.names, ",") || r.More != tt.more {
				t.Fatalf("jobs %q (more %v), want %q (more %v)", names, r.More, tt.names, tt.more)
			}
		})
	}
	out, err := runAnswered(t, "jobs")
	if err != nil || !strings.Contains(out, "JOB") || !strings.Contains(out, "second") || !strings.Contains(out, "UTC") {
		t.Fatalf("jobs printed (%v)\n%s", err, out)
	}
	if _, err := runAnswered(t, "jobs", "--state", "lost"); err == nil || !strings.Contains(err.Error(), `state "lost"`) {
		t.Fatalf("an unknown state: %v", err)
	}
}

func TestACopysJobNameKeepsNoQueryOrUserInfo(t *testing.T) {
	for in, want := range map[string]string{
		"https://s3.example.org/b/f.root?X-Amz-Signature=abc&X-Amz-Credential=AKIA": "f.root",
		"https://user:secret@store.example.org/run/out.dat":                         "out.dat",
		"file:///data/a%20b.txt":    "a b.txt",
		"https://store.example.org": "file",
	} {
		if got := baseName(in); got != want {
			t.Errorf("baseName(%q) = %q, want %q", in, got, want)
		}
	}
}
