package scheduler

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus/bustest"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/worker"
)

func TestStateLinesFollowARCsFormat(t *testing.T) {
	a, b := uuid.MustParse("c3e12bfa-ba9a-4a45-be73-0b3b2a206e1c"), uuid.MustParse("ff2d5329-5440-49aa-83cb-72daeb5e3e59")
	c, e := uuid.MustParse("0a7c0f5e-5d0e-4b43-9a57-1d1d2b0a4c11"), uuid.MustParse("5b1e7c2a-1f3d-4e6a-8c9b-2a3b4c5d6e7f")
	hosts := map[string]string{"g-b": "dt1.example.org"}
	got := string(StateLines([]dtr.DTR{
		{ID: a, State: dtr.QueryReplica, Priority: 25, Share: "_default-download"},
		{ID: b, State: dtr.Transferring, Priority: 64, Share: "/DC=org/CN=Alice Smith-upload", Destination: "file:///data/out", Grant: "g-b"},
		{ID: c, State: dtr.Transfer, Priority: 30, Share: "atlas-download", Destination: "file:///data/in"},
		{ID: e, State: dtr.Transferring, Priority: 30, Share: "atlas-download", Destination: "file:///data/in2", Grant: "g-unheard"},
	}, func(g string) string { return hosts[g] }))
	want := "c3e12bfa-ba9a-4a45-be73-0b3b2a206e1c QUERY_REPLICA 25 _default-download\n" +
		"ff2d5329-5440-49aa-83cb-72daeb5e3e59 TRANSFERRING 64 /DC=org/CN=Alice%20Smith-upload file:///data/out dt1.example.org\n" +
		"0a7c0f5e-5d0e-4b43-9a57-1d1d2b0a4c11 TRANSFER 30 atlas-download file:///data/in \n" +
		"5b1e7c2a-1f3d-4e6a-8c9b-2a3b4c5d6e7f TRANSFERRING 30 atlas-download file:///data/in2 \n"
	if got != want {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}
	for i, line := range strings.Split(strings.TrimSuffix(got, "\n"), "\n") {
		// gm-jobs splits on single spaces: 4 tokens, or 6 with the
		// destination and the host (empty when it is not known).
		if n := len(strings.Split(line, " ")); n != []int{4, 6, 6, 6}[i] {
			t.Fatalf("line %d has %d tokens", i, n)
		}
	}
}

// No share, destination or host can break a dtr.state line: whitespace
// and control characters of every kind are percent-encoded, as is '%',
// so each line keeps its token count and each value reads back.
func TestStateLinesEscapeWhitespaceAndControlCharactersInEveryField(t *testing.T) {
	id := uuid.MustParse("c3e12bfa-ba9a-4a45-be73-0b3b2a206e1c")
	forged := "\nff2d5329-5440-49aa-83cb-72daeb5e3e59 TRANSFER 100 x"
	for _, v := range []string{
		"a b", "a\nb", "a\rb", "a\tb", "a\vb", "a\fb", "a\x00b", "a\x1bb", "a\x7fb",
		"a\u0085b", "a\u00a0b", "a\u2028b", "a\u2029b", "a\u3000b", "a\xffb", "100%", forged,
	} {
		t.Run(fmt.Sprintf("%q", v), func(t *testing.T) {
			got := string(StateLines([]dtr.DTR{
				{ID: id, State: dtr.Transferring, Priority: 50, Share: "s" + v, Destination: "file:///d/" + v, Grant: "g"},
				{ID: id, State: dtr.QueryReplica, Priority: 50, Share: v},
			}, func(string) string { return "h" + v }))
			lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
			if len(lines) != 2 {
				t.Fatalf("%d lines, want 2:\n%q", len(lines), got)
			}
			for i, want := range [][]string{{"s" + v, "file:///d/" + v, "h" + v}, {v}} {
				f := strings.Split(lines[i], " ")
				if len(f) != 3+len(want) {
					t.Fatalf("line %d has %d tokens, want %d: %q", i, len(f), 3+len(want), lines[i])
				}
				for j, w := range want {
					field := f[3+j]
					if strings.ContainsFunc(field, func(r rune) bool { return needsEscape(r) && r != '%' }) {
						t.Errorf("line %d token %d %q holds whitespace or a control character", i, 3+j, field)
					}
					if back, err := url.PathUnescape(field); err != nil || back != w {
						t.Errorf("line %d token %d %q reads back as %q (%v), want %q", i, 3+j, field, back, err, w)
					}
				}
			}
		})
	}
}

// The state file names, on each transfer's line, the host of the worker
// process delivering it: here a deliverer whose transfers never end, on
// this machine.
func TestTheStateFileNamesTheHostOfEachTransfersDeliverer(t *testing.T) {
	nc, js := bustest.Server(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	const beat = 100 * time.Millisecond
	state := filepath.Join(t.TempDir(), "dtr.state")
	s, err := New(Config{MaxProcessor: 10, MaxDelivery: 2, MaxEmergency: 1, MaxTransferTries: 3, RetryBase: time.Second,
		Lease: time.Minute, Tick: 20 * time.Millisecond, CheckpointEvery: 50 * time.Millisecond, Heartbeat: beat,
		StateFile: state}, nc, quiet())
	if err != nil {
		t.Fatal(err)
	}
	schedDone := make(chan struct{})
	go func() { defer close(schedDone); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-schedDone })
	pool := func(stage dtr.Stage, h worker.Handler) {
		p, err := worker.NewPool(nc, stage, 5, h, quiet(), nil)
		if err != nil {
			t.Fatal(err)
		}
		p.Heartbeat, p.Renew = beat, 200*time.Millisecond
		go func() { _ = p.Run(ctx) }()
	}
	pool(dtr.StagePre, func(context.Context, api.Grant, func(int64, int64)) api.Result { return api.Result{} })
	pool(dtr.StageDelivery, func(ctx context.Context, _ api.Grant, _ func(int64, int64)) api.Result {
		<-ctx.Done()
		return api.Result{Error: &dtr.Failure{Kind: dtr.ErrInternalProcess, Text: "stopped"}}
	})
	// Three DTRs for two delivery slots and one emergency slot that the
	// one share cannot take: two transfer, one waits in TRANSFER.
	for i := 0; i < 3; i++ {
		id := uuid.New()
		d := fmt.Sprintf(`{"id":%q,"source":"http://src.example/%s","destination":"file:///data/out/%d"}`, id, id, i)
		if _, err := js.Publish(ctx, api.SubjectSubmit, []byte(d)); err != nil {
			t.Fatal(err)
		}
	}
	host, _ := os.Hostname()
	eventually(t, func() string {
		data, err := os.ReadFile(state)
		if err != nil {
			return err.Error()
		}
		transferring, queued := 0, 0
		for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
			f := strings.Split(line, " ")
			switch {
			case len(f) == 6 && f[1] == "TRANSFERRING" && f[5] == host && strings.HasPrefix(f[4], "file:///data/out/"):
				transferring++
			case len(f) == 6 && f[1] == "TRANSFER" && f[5] == "":
				queued++
			}
		}
		if transferring != 2 || queued != 1 {
			return fmt.Sprintf("state file\n%s\nwant 2 TRANSFERRING lines ending in the deliverer's host %q and one TRANSFER line with none", data, host)
		}
		return ""
	})
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
