package processor

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// An S3 object appears whole or not at all: the cleanup of a failed
// upload with overwrite keeps what is there (the old object, or a whole
// copy that the retry replaces); without overwrite pre-cleaning found the
// key free, so what is there is the attempt's own and goes.
func TestTheCleanupOfAnS3UploadKeepsTheObjectOnlyWithOverwrite(t *testing.T) {
	backend := s3mem.New()
	if err := backend.CreateBucket("out"); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(srv.Close)
	t.Setenv("AWS_ACCESS_KEY_ID", "sluice")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "sluice-secret")
	s := New(Config{Client: transfer.New(nil).WithGuard(loopback(t))}, nil, slog.New(slog.DiscardHandler))
	for _, overwrite := range []bool{true, false} {
		if _, err := backend.PutObject("out", "f", nil, strings.NewReader("there before"), 12, nil); err != nil {
			t.Fatal(err)
		}
		d := dtr.DTR{Source: "file:///in/f", Destination: "s3://" + strings.TrimPrefix(srv.URL, "http://") + "/out/f",
			TransferGrant: "x.4", Options: dtr.Options{Overwrite: overwrite}}
		res := s.Handle(context.Background(), api.Grant{ID: "x.5", State: dtr.RegisteringReplica, Cleanup: true, DTR: &d}, nil)
		if res.Error != nil {
			t.Fatalf("overwrite %v: cleanup failed: %+v", overwrite, res.Error)
		}
		_, err := backend.HeadObject("out", "f")
		if kept := err == nil; kept != overwrite {
			t.Errorf("overwrite %v: the object kept: %v (%v)", overwrite, kept, err)
		}
	}
}

// loopback lets a test's servers, on loopback, be reached: the default
// Guard refuses loopback addresses.
func loopback(t *testing.T) *transfer.Guard {
	t.Helper()
	g, err := transfer.NewGuard("127.0.0.0/8", "::1")
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestFinaliseVerifiesAndPlacesTheFileOrFindsItPlacedBefore(t *testing.T) {
	sum := func(data string) string {
		h, _ := checksum.New("adler32")
		h.Write([]byte(data))
		return checksum.Format("adler32", h)
	}
	tests := []struct {
		name              string
		tmp, dst          string // contents; "" is no file
		delivered         string // what delivery computed
		wantErr           bool
		wantDst, wantTemp string
	}{
		{"the temporary file is verified and renamed into place", "data", "", sum("data"), false, "data", ""},
		{"a file that changed on disk is refused and removed", "datA", "", sum("data"), true, "", ""},
		{"a file an earlier try put in place is done", "", "data", sum("data"), false, "data", ""},
		{"another file in place is not taken for it", "", "other", sum("data"), true, "other", ""},
		{"no file anywhere is an error", "", "", sum("data"), true, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			d := dtr.DTR{ID: uuid.New(), Source: "file:///nowhere", Destination: "file://" + filepath.Join(dir, "f"),
				Checksum: tt.delivered, TransferGrant: "g.3"}
			tmpPath := filepath.Join(dir, filepath.Base(transfer.TempURLOf(&d)))
			if tt.tmp != "" {
				write(t, tmpPath, tt.tmp)
			}
			if tt.dst != "" {
				write(t, filepath.Join(dir, "f"), tt.dst)
			}
			s := New(Config{}, nil, slog.New(slog.DiscardHandler))
			_, err := s.finalise(context.Background(), d)
			if (err != nil) != tt.wantErr {
				t.Fatalf("finalise: %v, want an error: %v", err, tt.wantErr)
			}
			if got := read(filepath.Join(dir, "f")); got != tt.wantDst {
				t.Errorf("destination holds %q, want %q", got, tt.wantDst)
			}
			if got := read(tmpPath); got != tt.wantTemp {
				t.Errorf("temporary file holds %q, want %q", got, tt.wantTemp)
			}
		})
	}
}

func read(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func TestAConfigBuiltInCodeTakesTheTagsDefaults(t *testing.T) {
	if defaultCacheLockTimeout <= 0 {
		t.Fatalf("CacheLockTimeout's default %q", tagDefault("CacheLockTimeout"))
	}
}
