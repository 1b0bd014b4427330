package scheduler

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestStateLinesFollowARCsFormat(t *testing.T) {
	a, b := uuid.MustParse("c3e12bfa-ba9a-4a45-be73-0b3b2a206e1c"), uuid.MustParse("ff2d5329-5440-49aa-83cb-72daeb5e3e59")
	got := string(StateLines([]dtr.DTR{
		{ID: a, State: dtr.QueryReplica, Priority: 25, Share: "_default-download"},
		{ID: b, State: dtr.Transferring, Priority: 64, Share: "/DC=org/CN=Alice Smith-upload", Destination: "file:///data/out"},
	}))
	want := "c3e12bfa-ba9a-4a45-be73-0b3b2a206e1c QUERY_REPLICA 25 _default-download\n" +
		"ff2d5329-5440-49aa-83cb-72daeb5e3e59 TRANSFERRING 64 /DC=org/CN=Alice%20Smith-upload file:///data/out \n"
	if got != want {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}
	for i, line := range strings.Split(strings.TrimSuffix(got, "\n"), "\n") {
		// gm-jobs splits on single spaces: 4 tokens, or 5 with the empty host.
		if n := len(strings.Split(line, " ")); n != []int{4, 6}[i] && n != 5 {
			t.Fatalf("line %d has %d tokens", i, n)
		}
	}
}

func TestParsePriorityFileTakesGoodLinesAndNamesBadOnes(t *testing.T) {
	id := "c3e12bfa-ba9a-4a45-be73-0b3b2a206e1c"
	tests := []struct {
		name    string
		in      string
		want    int
		wantErr string
	}{
		{"ARC's example", id + " 90\nff2d5329-5440-49aa-83cb-72daeb5e3e59 95\n", 2, ""},
		{"blank lines and comments are skipped", "\n# raise one\n" + id + " 90\n", 1, ""},
		{"a priority above 100", id + " 101", 0, "line 1: priority \"101\""},
		{"a priority that is not a number", id + " high", 0, "not an integer"},
		{"an id that is not a UUID", "job-7 50", 0, "line 1: DTR id \"job-7\""},
		{"too many fields", id + " 50 extra", 0, "want \"<dtr id> <priority>\""},
		{"a bad line does not stop the good ones", "x 1\n" + id + " 70\n", 1, "line 1"},
		// Found by FuzzParsePriorityFileReportsBadLinesByNumberAndTakesTheRest:
		// a line over bufio.Scanner's 64 KiB stopped the parse, unnumbered.
		{"a line longer than 64 KiB is reported, quoted in part, and the rest apply", strings.Repeat("x", 70000) + "\n" + id + " 70\n", 1, "line 1 \"" + strings.Repeat("x", 80) + "\"…: want"},
		{"a comment longer than 64 KiB is skipped", "#" + strings.Repeat("x", 70000) + "\n" + id + " 70\n", 1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePriorityFile([]byte(tt.in))
			if len(got) != tt.want {
				t.Fatalf("%d changes, want %d", len(got), tt.want)
			}
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func TestPriorityFileIsRenamedAfterReading(t *testing.T) {
	state := filepath.Join(t.TempDir(), "dtr.state")
	if err := os.WriteFile(state+".prio", []byte("c3e12bfa-ba9a-4a45-be73-0b3b2a206e1c 90\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	changes, err := readPriorityFile(state)
	if err != nil || len(changes) != 1 || changes[0].Priority != 90 {
		t.Fatalf("changes %v, err %v", changes, err)
	}
	if _, err := os.Stat(state + ".prio"); !os.IsNotExist(err) {
		t.Fatal(".prio is still there")
	}
	if _, err := os.Stat(state + ".prio.read"); err != nil {
		t.Fatal(".prio.read is missing")
	}
	if changes, err := readPriorityFile(state); changes != nil || err != nil {
		t.Fatalf("a missing .prio gave %v, %v", changes, err)
	}
}

func TestWriteFileAtomicReplacesTheFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "dtr.state")
	for _, content := range []string{"first\n", "second\n"} {
		if err := WriteFileAtomic(p, []byte(content)); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(p); string(b) != content {
			t.Fatalf("file holds %q", b)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(p), ".dtr.state.*")); len(left) > 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}
