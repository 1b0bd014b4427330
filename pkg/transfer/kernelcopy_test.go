package transfer_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// A local copy that wants no checksum is made by the kernel
// (copy_file_range, 16 MiB a call): it is whole, reports its progress,
// computes nothing, and keeps the source's bounds and the grant's fence as
// a streamed copy does.
func TestALocalCopyWithoutAChecksumIsWholeAndKeepsItsBoundsAndFence(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	data := randomData(40<<20 + 3) // three calls
	writeFile(t, src, data)
	c := transfer.New(nil).WithGuard(loopback)
	tests := []struct {
		name     string
		opt      transfer.CopyOptions
		fence    int64 // steps let through, -1: no fence
		kind     dtr.ErrorKind
		text     string
		wantLeft bool // a partial destination stays (fenced)
	}{
		{name: "whole", fence: -1},
		{name: "whole, of the size queried", opt: transfer.CopyOptions{ExpectedSize: int64(len(data))}, fence: -1},
		{name: "a source that is not the size queried", opt: transfer.CopyOptions{ExpectedSize: int64(len(data)) + 1}, fence: -1,
			kind: dtr.ErrTemporaryRemote, text: "size changed"},
		{name: "a source larger than the maximum", opt: transfer.CopyOptions{MaxSize: 1 << 20}, fence: -1,
			kind: dtr.ErrLocalFile, text: "maximum file size"},
		{name: "fenced half way: the partial file stays for the cleanup", fence: 2,
			kind: dtr.ErrInternalProcess, text: "stopped before changing storage", wantLeft: true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := filepath.Join(dir, "dst", strings.Repeat("d", i+1))
			ctx := context.Background()
			if tt.fence >= 0 {
				ctx = transfer.WithFence(ctx, fenceAfter(tt.fence))
			}
			var progress []int64
			opt := tt.opt
			opt.NoChecksum = true
			opt.ProgressEvery = time.Nanosecond
			opt.Progress = func(n int64) { progress = append(progress, n) }
			res, err := c.Copy(ctx, fileURL(src), fileURL(dst), opt)
			got, readErr := os.ReadFile(dst)
			if tt.kind != "" {
				if transfer.KindOf(err) != tt.kind || !strings.Contains(err.Error(), tt.text) {
					t.Fatalf("copy: %v (%s), want %s saying %q", err, transfer.KindOf(err), tt.kind, tt.text)
				}
				if tt.wantLeft && (readErr != nil || len(got) == 0 || len(got) >= len(data)) {
					t.Fatalf("the partial file: %d bytes, %v", len(got), readErr)
				}
				if !tt.wantLeft && !errors.Is(readErr, fs.ErrNotExist) {
					t.Fatalf("the destination was left: %v", readErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) || res.Bytes != int64(len(data)) {
				t.Fatalf("the copy has %d bytes (%d reported), want the source's %d", len(got), res.Bytes, len(data))
			}
			if len(res.Checksums) != 0 {
				t.Errorf("checksums %v computed, none wanted", res.Checksums)
			}
			if len(progress) < 2 || progress[len(progress)-1] != int64(len(data)) {
				t.Errorf("progress %v, want several ending at %d", progress, len(data))
			}
		})
	}
}
