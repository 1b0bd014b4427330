package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// TestACacheHitMakesTheChecksOfTheStepsItSkips: a file found in the cache
// goes from CACHE_CHECKED to PROCESS_CACHE, past pre-cleaning and
// post-processing; their checks still hold: an existing destination is
// kept without overwrite, and the expected checksum is verified.
func TestACacheHitMakesTheChecksOfTheStepsItSkips(t *testing.T) {
	cfg := testConfig()
	cfg.MaxTransferTries = 2
	cfg.RetryBase = 10 * time.Millisecond
	cfg.CacheDir = t.TempDir()
	s := start(t, cfg)
	remote := filepath.Join(s.dir, "remote")
	base, gets := countingStore(t, remote)
	writeFile(t, filepath.Join(remote, "f"), 30000, 1)
	content, err := os.ReadFile(filepath.Join(remote, "f"))
	if err != nil {
		t.Fatal(err)
	}
	sum, err := checksum.File(filepath.Join(remote, "f"), "adler32")
	if err != nil {
		t.Fatal(err)
	}
	// A first job puts the file in the cache.
	if ev := s.wait(s.submit(&job.Job{Inputs: []job.File{{Source: base + "/f", Destination: fileURL(filepath.Join(s.dir, "first"))}}}).JobID, time.Minute); ev.Files[0].State != dtr.Done {
		t.Fatalf("the first job: %+v", ev.Files[0])
	}
	old := []byte("an older file that stays unless overwrite is set")
	tests := []struct {
		name      string
		existing  bool
		overwrite bool
		checksum  string
		want      dtr.State
		wantData  []byte
	}{
		{"an existing destination without overwrite is kept", true, false, "", dtr.Error, old},
		{"an existing destination with overwrite is replaced", true, true, "", dtr.Done, content},
		{"the right expected checksum", false, false, sum, dtr.Done, content},
		{"a wrong expected checksum", false, false, "adler32:00000001", dtr.Error, nil},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := filepath.Join(s.dir, "out", string(rune('a'+i)))
			if tt.existing {
				if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(dst, old, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			before := gets("/f")
			ev := s.wait(s.submit(&job.Job{Inputs: []job.File{{Source: base + "/f", Destination: fileURL(dst),
				Overwrite: tt.overwrite, Checksum: tt.checksum}}}).JobID, time.Minute)
			f := ev.Files[0]
			got, _ := os.ReadFile(dst)
			if f.State != tt.want || !bytes.Equal(got, tt.wantData) {
				t.Fatalf("ended %s (%+v) with %d bytes at the destination; want %s and %d bytes", f.State, f.Error, len(got), tt.want, len(tt.wantData))
			}
			switch {
			case tt.checksum == sum && (f.Checksum != sum || gets("/f") != before):
				t.Fatalf("checksum %q after %d downloads; want %s verified on the cached file, no download", f.Checksum, gets("/f")-before, sum)
			case tt.checksum != "" && tt.checksum != sum && gets("/f") == before:
				t.Fatal("a cached file with the wrong checksum was not downloaded again")
			}
		})
	}
}
