package transfer_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

func TestStatFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "five"), []byte("hello"))
	writeFile(t, filepath.Join(dir, "empty"), nil)
	tests := []struct {
		name     string
		path     string
		want     transfer.Info
		wantKind dtr.ErrorKind
	}{
		{"existing file gives its size", "five", transfer.Info{Exists: true, Size: 5}, ""},
		{"empty file exists with size 0", "empty", transfer.Info{Exists: true, Size: 0}, ""},
		{"missing file is not an error", "missing", transfer.Info{Size: -1}, ""},
		{"missing parent is not an error", "no/such/dir", transfer.Info{Size: -1}, ""},
		{"directory is a local file error", ".", transfer.Info{Size: -1}, dtr.ErrLocalFile},
	}
	c := transfer.New(nil).WithGuard(loopback)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := c.Stat(context.Background(), fileURL(filepath.Join(dir, tt.path)))
			checkKind(t, err, tt.wantKind)
			if got != tt.want {
				t.Errorf("Stat = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestDeleteFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "f"), []byte("x"))
	if err := os.Symlink(filepath.Join(dir, "f"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	tests := []struct {
		name     string
		path     string
		wantKind dtr.ErrorKind
		gone     bool
	}{
		{"existing file is removed", "f", "", true},
		{"missing file is fine", "missing", "", true},
		{"symlink is removed, not its target", "link", "", true},
		{"directory is refused", "d", dtr.ErrLocalFile, false},
	}
	c := transfer.New(nil).WithGuard(loopback)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, tt.path)
			err := c.Delete(context.Background(), fileURL(p))
			checkKind(t, err, tt.wantKind)
			if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) != tt.gone {
				t.Errorf("after Delete, lstat error = %v, want gone = %v", err, tt.gone)
			}
		})
	}
}

func TestLocalPathDecodesTheURL(t *testing.T) {
	tests := map[string]string{
		"file:///data/my%20file.root":   "/data/my file.root",
		"file://localhost/data/x":       "/data/x",
		"file:///data/donn%C3%A9es.txt": "/data/données.txt",
	}
	for in, want := range tests {
		if got, err := transfer.LocalPath(in); err != nil || got != want {
			t.Errorf("LocalPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := transfer.LocalPath("http://h/x"); err == nil {
		t.Error("an http URL has no local path")
	}
}
