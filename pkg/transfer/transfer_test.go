package transfer_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// fileURL turns a local path into a file:// URL.
func fileURL(p string) string {
	return (&url.URL{Scheme: "file", Path: filepath.ToSlash(p)}).String()
}

// randomData returns n reproducible pseudo-random bytes.
func randomData(n int) []byte {
	r := rand.NewChaCha8([32]byte{1, 2, 3})
	b := make([]byte, n)
	r.Read(b)
	return b
}

func writeFile(t *testing.T, p string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func sums(t *testing.T, data []byte, types ...string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, typ := range types {
		h, err := checksum.New(typ)
		if err != nil {
			t.Fatal(err)
		}
		h.Write(data)
		m[typ] = checksum.Format(typ, h)
	}
	return m
}

// checkKind fails t unless err is of kind want ("" meaning no error).
func checkKind(t *testing.T, err error, want dtr.ErrorKind) {
	t.Helper()
	if got := transfer.KindOf(err); got != want {
		t.Fatalf("error kind = %q, want %q (error: %v)", got, want, err)
	}
}

func checkAbsent(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s should not exist (stat error: %v)", p, err)
	}
}

func TestRename(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "from"), []byte("content"))
	tests := []struct {
		name     string
		from, to string
		wantKind dtr.ErrorKind
	}{
		{"file is renamed", fileURL(filepath.Join(dir, "from")), fileURL(filepath.Join(dir, "to")), ""},
		{"missing file is a local file error", fileURL(filepath.Join(dir, "missing")), fileURL(filepath.Join(dir, "x")), dtr.ErrLocalFile},
		{"http source is internal logic", "http://example.org/a", fileURL(filepath.Join(dir, "y")), dtr.ErrInternalLogic},
		{"http destination is internal logic", fileURL(filepath.Join(dir, "to")), "https://example.org/b", dtr.ErrInternalLogic},
	}
	c := transfer.New(nil).WithGuard(loopback)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkKind(t, c.Rename(context.Background(), tt.from, tt.to), tt.wantKind)
		})
	}
	if got, err := os.ReadFile(filepath.Join(dir, "to")); err != nil || string(got) != "content" {
		t.Errorf("renamed file holds %q, %v", got, err)
	}
}

func TestMakeParents(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "file"), nil)
	tests := []struct {
		name     string
		url      string
		wantDir  string
		wantKind dtr.ErrorKind
	}{
		{"file creates missing parents", fileURL(filepath.Join(dir, "a/b/c/name")), filepath.Join(dir, "a/b/c"), ""},
		{"file with existing parent is fine", fileURL(filepath.Join(dir, "name")), dir, ""},
		{"parent that is a file is a local file error", fileURL(filepath.Join(dir, "file/name")), "", dtr.ErrLocalFile},
		{"http at the server root needs nothing", "http://example.org/name", "", ""},
		{"unsupported scheme is internal logic", "gsiftp://example.org/a", "", dtr.ErrInternalLogic},
	}
	c := transfer.New(nil).WithGuard(loopback)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkKind(t, c.MakeParents(context.Background(), tt.url), tt.wantKind)
			if tt.wantDir != "" {
				if fi, err := os.Stat(tt.wantDir); err != nil || !fi.IsDir() {
					t.Errorf("%s is not a directory: %v", tt.wantDir, err)
				}
			}
		})
	}
}

func TestTempURL(t *testing.T) {
	tests := []struct {
		name, dst, tag, want string
	}{
		{"file gets a hidden part name beside it", "file:///a/b/name", "1234", "file:///a/b/.name.sluice-1234.part"},
		{"file in root", "file:///name.root", "x", "file:///.name.root.sluice-x.part"},
		{"localhost file keeps its host", "file://localhost/data/f", "t", "file://localhost/data/.f.sluice-t.part"},
		{"slash in tag cannot escape the directory", "file:///a/f", "x/y", "file:///a/.f.sluice-x_y.part"},
		{"http is unchanged", "http://host/a/b/name", "1234", "http://host/a/b/name"},
		{"https is unchanged", "https://u:p@host:8443/x?y=1", "1", "https://u:p@host:8443/x?y=1"},
		{"directory URL is unchanged", "file:///a/b/", "1", "file:///a/b/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := transfer.TempURL(tt.dst, tt.tag); got != tt.want {
				t.Errorf("TempURL(%q, %q) = %q, want %q", tt.dst, tt.tag, got, tt.want)
			}
		})
	}
}

func TestCopyBetweenSchemes(t *testing.T) {
	st, srv := newStore(t)
	dir := t.TempDir()
	types := []string{"adler32", "md5", "sha256"}
	sizes := []int{0, 11, 3<<20 + 7}
	endpoints := map[string]func(name string) (url string, read func() ([]byte, error)){
		"file": func(name string) (string, func() ([]byte, error)) {
			p := filepath.Join(dir, name)
			return fileURL(p), func() ([]byte, error) { return os.ReadFile(p) }
		},
		"http": func(name string) (string, func() ([]byte, error)) {
			p := filepath.Join(st.dir, name)
			return srv.URL + "/" + name, func() ([]byte, error) { return os.ReadFile(p) }
		},
	}
	c := transfer.New(nil).WithGuard(loopback)
	for _, from := range []string{"file", "http"} {
		for _, to := range []string{"file", "http"} {
			for _, size := range sizes {
				for _, bufSize := range []int{0, 4096} {
					name := from + "-to-" + to + "-" + strconv.Itoa(size) + "-buf" + strconv.Itoa(bufSize)
					t.Run(name, func(t *testing.T) {
						data := randomData(size)
						// Sources live in the other tree's "src" dir.
						var srcURL string
						if from == "file" {
							writeFile(t, filepath.Join(dir, "src", name), data)
							srcURL = fileURL(filepath.Join(dir, "src", name))
						} else {
							writeFile(t, filepath.Join(st.dir, "src", name), data)
							srcURL = srv.URL + "/src/" + name
						}
						dstURL, read := endpoints[to]("dst/sub/" + name)

						res, err := c.Copy(context.Background(), srcURL, dstURL,
							transfer.CopyOptions{ChecksumTypes: types, BufferSize: bufSize})
						if err != nil {
							t.Fatal(err)
						}
						got, err := read()
						if err != nil {
							t.Fatal(err)
						}
						if !bytes.Equal(got, data) {
							t.Fatalf("destination holds %d bytes differing from the %d source bytes", len(got), len(data))
						}
						if res.Bytes != int64(size) {
							t.Errorf("Bytes = %d, want %d", res.Bytes, size)
						}
						want := sums(t, data, types...)
						for _, typ := range types {
							if res.Checksums[typ] != want[typ] {
								t.Errorf("%s = %q, want %q", typ, res.Checksums[typ], want[typ])
							}
						}
						if res.Started.IsZero() || res.Ended.Before(res.Started) {
							t.Errorf("Started %v, Ended %v", res.Started, res.Ended)
						}
						if to == "http" {
							if n, _ := st.putLength("/dst/sub/" + name); n != int64(size) {
								t.Errorf("PUT Content-Length = %d, want %d", n, size)
							}
						}
					})
				}
			}
		}
	}
}

func TestTempURLKeepsLongNamesWithinTheLimit(t *testing.T) {
	long := strings.Repeat("é", 120) // 240 bytes
	got := transfer.TempURL("file:///data/"+long, "6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42.3")
	p, err := transfer.LocalPath(got)
	if err != nil {
		t.Fatal(err)
	}
	name := p[strings.LastIndex(p, "/")+1:]
	if len(name) > 255 || !utf8.ValidString(name) || !strings.HasSuffix(name, ".sluice-6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42.3.part") {
		t.Fatalf("temporary name %q (%d bytes)", name, len(name))
	}
}
