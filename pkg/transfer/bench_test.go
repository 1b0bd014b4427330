package transfer

import (
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/transfer/xrootdtest"
)

const benchSize = 64 << 20

// benchFile writes a 64 MiB file of random bytes and returns its path.
func benchFile(b *testing.B) string {
	b.Helper()
	p := filepath.Join(b.TempDir(), "src")
	data := make([]byte, benchSize)
	rand.Read(data)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		b.Fatal(err)
	}
	return p
}

func benchURL(p string) string { return (&url.URL{Scheme: "file", Path: p}).String() }

// BenchmarkCopyFileToFile measures Copy between local files with various
// checksums; "none" (CopyOptions.NoChecksum) is the kernel's copy.
func BenchmarkCopyFileToFile(b *testing.B) {
	src := benchFile(b)
	dst := filepath.Join(filepath.Dir(src), "dst")
	su, _ := url.Parse(benchURL(src))
	du, _ := url.Parse(benchURL(dst))
	c := New(nil).WithGuard(loopback)
	for _, tc := range []struct {
		name  string
		types []string
	}{
		{"none", nil},
		{"adler32", []string{"adler32"}},
		{"md5", []string{"md5"}},
		{"sha256", []string{"sha256"}},
		{"adler32+md5+sha256", []string{"adler32", "md5", "sha256"}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(benchSize)
			buf := make([]byte, 2*defaultBufferSize)
			for b.Loop() {
				sums, err := newHashSet(tc.types)
				if err != nil {
					b.Fatal(err)
				}
				var res CopyResult
				err = c.copy(context.Background(), endpoint{su.String(), su}, endpoint{du.String(), du}, CopyOptions{}, sums, buf, &res)
				if err != nil || res.Bytes != benchSize {
					b.Fatal(res.Bytes, err)
				}
			}
		})
	}
}

// BenchmarkCopySmallFile measures Copy of a 1 KiB file, as the
// small-file throughput runs move, to a new temporary name each time.
func BenchmarkCopySmallFile(b *testing.B) {
	dir := b.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, make([]byte, 1024), 0o644); err != nil {
		b.Fatal(err)
	}
	c := New(nil).WithGuard(loopback)
	for _, tc := range []struct {
		name string
		opt  CopyOptions
	}{
		{"adler32", CopyOptions{ExpectedSize: 1024}},
		{"none", CopyOptions{ExpectedSize: 1024, NoChecksum: true}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				dst := benchURL(filepath.Join(dir, "out", strconv.Itoa(i%1000)))
				if _, err := c.Copy(context.Background(), benchURL(src), dst, tc.opt); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkIOCopyBaseline is the floor to compare Copy with: io.Copy
// between the same files, in the kernel (copy_file_range, as cp does) and
// through a 1 MiB user-space buffer as Copy must to see the bytes.
func BenchmarkIOCopyBaseline(b *testing.B) {
	src := benchFile(b)
	dst := filepath.Join(filepath.Dir(src), "dst")
	for _, tc := range []struct {
		name string
		copy func(w *os.File, r *os.File) (int64, error)
	}{
		{"kernel", func(w, r *os.File) (int64, error) { return io.Copy(w, r) }},
		{"userspace", func(w, r *os.File) (int64, error) {
			// The wrappers hide ReadFrom and WriteTo, forcing a plain copy loop.
			return io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{r}, make([]byte, defaultBufferSize))
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(benchSize)
			for b.Loop() {
				r, err := os.Open(src)
				if err != nil {
					b.Fatal(err)
				}
				w, err := os.Create(dst)
				if err != nil {
					b.Fatal(err)
				}
				if n, err := tc.copy(w, r); err != nil || n != benchSize {
					b.Fatal(n, err)
				}
				r.Close()
				if err := w.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCopyHTTP measures Copy with adler32 over loopback HTTP: GET into
// a file and a file PUT to a server that discards the body.
func BenchmarkCopyHTTP(b *testing.B) {
	src := benchFile(b)
	dir := filepath.Dir(src)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusCreated)
			return
		}
		http.ServeFile(w, r, src)
	}))
	defer srv.Close()
	c := New(nil).WithGuard(loopback)
	for _, tc := range []struct{ name, src, dst string }{
		{"get-to-file", srv.URL + "/src", benchURL(filepath.Join(dir, "dst"))},
		{"file-to-put", benchURL(src), srv.URL + "/dst"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(benchSize)
			for b.Loop() {
				res, err := c.Copy(context.Background(), tc.src, tc.dst, CopyOptions{})
				if err != nil || res.Bytes != benchSize {
					b.Fatal(res.Bytes, err)
				}
			}
		})
	}
}

// BenchmarkCopyFromTheRealXrootd measures a download of 64 MiB with
// adler32 from the real xrootd on loopback into a local file: over
// root:// (go-hep's client), and over HTTPS without and with
// xrootd.chksum (then the storage computes the file's adler32 for its
// Digest before it answers, and the stream is checked against it).
func BenchmarkCopyFromTheRealXrootd(b *testing.B) {
	data, err := os.ReadFile(benchFile(b))
	if err != nil {
		b.Fatal(err)
	}
	plain := xrootdtest.Start(b, xrootdtest.Options{HTTP: true})
	summing := xrootdtest.Start(b, xrootdtest.Options{HTTP: true, Checksum: "adler32", CA: plain.CA})
	plain.WriteFile(b, "/f", data)
	summing.WriteFile(b, "/f", data)
	c := New(plain.Client()).WithGuard(loopback)
	dst := benchURL(filepath.Join(b.TempDir(), "dst"))
	for _, tc := range []struct{ name, src string }{
		{"root", plain.Root + "/f"},
		{"https", plain.HTTPS + "/f"},
		{"https with xrootd.chksum", summing.HTTPS + "/f"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(benchSize)
			for b.Loop() {
				if _, err := c.Copy(context.Background(), tc.src, dst, CopyOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
