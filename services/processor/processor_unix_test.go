//go:build unix

package processor

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestPreProcessingRefusesWhatIsNoFileOrTooLargeAtTheFirstStep(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, 2000), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		state    dtr.State
		src, dst string
		kind     dtr.ErrorKind
		text     string
	}{
		{"a named pipe as source", dtr.QueryingReplica, "file://" + fifo, "file://" + filepath.Join(dir, "out1"),
			dtr.ErrLocalFile, "is a named pipe (FIFO), not a regular file"},
		{"a character device as source", dtr.QueryingReplica, "file:///dev/zero", "file://" + filepath.Join(dir, "out2"),
			dtr.ErrLocalFile, "is a character device, not a regular file"},
		{"a source larger than the maximum file size", dtr.QueryingReplica, "file://" + big, "file://" + filepath.Join(dir, "out3"),
			dtr.ErrLocalFile, "the source has 2000 bytes, more than the maximum file size of 1000 bytes"},
		{"a named pipe as destination", dtr.PreCleaning, "file://" + big, "file://" + fifo,
			dtr.ErrLocalFile, "is a named pipe (FIFO), not a regular file"},
		{"a character device as destination", dtr.PreCleaning, "file://" + big, "file:///dev/null",
			dtr.ErrLocalFile, "is a character device, not a regular file"},
	}
	s := New(Config{MaxFileSize: 1000}, nil, slog.New(slog.DiscardHandler))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			d := dtr.DTR{ID: uuid.New(), Source: tt.src, Destination: tt.dst, Options: dtr.Options{Overwrite: true}}
			res := s.Handle(ctx, api.Grant{State: tt.state, DTR: &d}, func(int64, int64) {})
			if res.Error == nil || res.Error.Kind != tt.kind || !strings.Contains(res.Error.Text, tt.text) {
				t.Fatalf("%s: %+v; want %s saying %q", tt.state, res.Error, tt.kind, tt.text)
			}
			if tt.kind.Retryable() {
				t.Errorf("%s is retried", tt.kind)
			}
			for _, p := range []string{fifo, "/dev/zero", "/dev/null"} {
				if _, err := os.Lstat(p); err != nil {
					t.Errorf("%s went: %v", p, err)
				}
			}
		})
	}
	// A source at the maximum passes, with its size.
	d := dtr.DTR{ID: uuid.New(), Source: "file://" + big, Destination: "file://" + filepath.Join(dir, "out")}
	if res := New(Config{MaxFileSize: 2000}, nil, slog.New(slog.DiscardHandler)).Handle(context.Background(),
		api.Grant{State: dtr.QueryingReplica, DTR: &d}, func(int64, int64) {}); res.Error != nil || res.Size != 2000 {
		t.Fatalf("a source of the maximum size: %+v", res)
	}
}
