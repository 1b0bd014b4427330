package transfer_test

import (
	"context"
	"crypto/md5"
	"encoding/base64"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

func TestCopyFailuresAreClassifiedAndLeaveNoDestination(t *testing.T) {
	st, srv := newStore(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "src"), randomData(1<<20))
	writeFile(t, filepath.Join(st.dir, "src"), randomData(1<<20))
	os.Mkdir(filepath.Join(dir, "isdir"), 0o755)
	fileSrc := fileURL(filepath.Join(dir, "src"))
	httpSrc := srv.URL + "/src"

	tests := []struct {
		name     string
		src, dst string
		types    []string
		wantKind dtr.ErrorKind
		wantText string
		absent   string // a local path that must not exist afterwards
	}{
		{"source 503 is temporary", statusServer(t, 503).URL + "/f", fileURL(filepath.Join(dir, "d1")), nil,
			dtr.ErrTemporaryRemote, "HTTP 503", filepath.Join(dir, "d1")},
		{"source 500 is temporary", statusServer(t, 500).URL + "/f", fileURL(filepath.Join(dir, "d2")), nil,
			dtr.ErrTemporaryRemote, "HTTP 500", filepath.Join(dir, "d2")},
		{"source 429 is temporary", statusServer(t, 429).URL + "/f", fileURL(filepath.Join(dir, "d3")), nil,
			dtr.ErrTemporaryRemote, "HTTP 429", filepath.Join(dir, "d3")},
		{"source 408 is temporary", statusServer(t, 408).URL + "/f", fileURL(filepath.Join(dir, "d4")), nil,
			dtr.ErrTemporaryRemote, "HTTP 408", filepath.Join(dir, "d4")},
		{"source 404 is permanent", srv.URL + "/missing", fileURL(filepath.Join(dir, "d5")), nil,
			dtr.ErrPermanentRemote, "source not found: HTTP 404", filepath.Join(dir, "d5")},
		{"source 403 is permanent", statusServer(t, 403).URL + "/f", fileURL(filepath.Join(dir, "d6")), nil,
			dtr.ErrPermanentRemote, "HTTP 403", filepath.Join(dir, "d6")},
		{"refused source is temporary", refusedURL(t) + "/f", fileURL(filepath.Join(dir, "d7")), nil,
			dtr.ErrTemporaryRemote, "refused", filepath.Join(dir, "d7")},
		{"missing file source is a local file error", fileURL(filepath.Join(dir, "missing")), fileURL(filepath.Join(dir, "d8")), nil,
			dtr.ErrLocalFile, "source not found", filepath.Join(dir, "d8")},
		{"directory source is a local file error", fileURL(filepath.Join(dir, "isdir")), fileURL(filepath.Join(dir, "d9")), nil,
			dtr.ErrLocalFile, "directory", filepath.Join(dir, "d9")},
		{"connection dropped mid-body is temporary", droppingServer(t, 1<<20).URL + "/f", fileURL(filepath.Join(dir, "d10")), nil,
			dtr.ErrTemporaryRemote, "short body", filepath.Join(dir, "d10")},
		{"connection dropped mid-body into a PUT is temporary", droppingServer(t, 1<<20).URL + "/f", srv.URL + "/d11", nil,
			dtr.ErrTemporaryRemote, "short body", filepath.Join(st.dir, "d11")},
		{"destination 503 is temporary", fileSrc, statusServer(t, 503).URL + "/f", nil,
			dtr.ErrTemporaryRemote, "HTTP 503", ""},
		{"destination 403 is permanent", httpSrc, statusServer(t, 403).URL + "/f", nil,
			dtr.ErrPermanentRemote, "HTTP 403", ""},
		{"destination 423, a file still being written, is temporary", fileSrc, statusServer(t, 423).URL + "/f", nil,
			dtr.ErrTemporaryRemote, "HTTP 423", ""},
		{"destination redirecting PUT with 302 is permanent, not turned into a GET", fileSrc, redirectingServer(t, 302).URL + "/f", nil,
			dtr.ErrPermanentRemote, "HTTP 302", ""},
		{"destination redirecting PUT with 307 is permanent, not followed", fileSrc, redirectingServer(t, 307).URL + "/f", nil,
			dtr.ErrPermanentRemote, "HTTP 307", ""},
		{"refused destination is temporary", fileSrc, refusedURL(t) + "/f", nil,
			dtr.ErrTemporaryRemote, "refused", ""},
		{"destination that is a directory is a local file error", fileSrc, fileURL(filepath.Join(dir, "isdir")), nil,
			dtr.ErrLocalFile, "directory", ""},
		{"unsupported source scheme is internal logic", "gsiftp://example.org/f", fileURL(filepath.Join(dir, "d12")), nil,
			dtr.ErrInternalLogic, `"gsiftp"`, filepath.Join(dir, "d12")},
		{"unsupported destination scheme is internal logic", fileSrc, "srm://example.org/f", nil,
			dtr.ErrInternalLogic, `"srm"`, ""},
		{"unknown checksum type is internal logic", fileSrc, fileURL(filepath.Join(dir, "d13")), []string{"crc32"},
			dtr.ErrInternalLogic, "crc32", filepath.Join(dir, "d13")},
	}
	c := transfer.New(nil).WithGuard(loopback)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := c.Copy(context.Background(), tt.src, tt.dst, transfer.CopyOptions{ChecksumTypes: tt.types})
			checkKind(t, err, tt.wantKind)
			if !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("error %q does not mention %q", err, tt.wantText)
			}
			if res.Checksums != nil {
				t.Errorf("failed copy has checksums %v", res.Checksums)
			}
			if tt.absent != "" {
				checkAbsent(t, tt.absent)
			}
		})
	}
}

func TestCopyCancelReturnsPromptlyAndRemovesPartialDestination(t *testing.T) {
	errSlow := errors.New("transfer too slow")
	dir := t.TempDir()
	bigFile := filepath.Join(dir, "big")
	writeFile(t, bigFile, randomData(32<<20))

	// A PUT target that takes 64 KiB and then stops reading. A server that
	// is not reading does not notice the client leave, so the handler also
	// ends when the test does.
	release := make(chan struct{})
	stallingPut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		r.Body.Read(make([]byte, 64<<10))
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(stallingPut.Close)
	t.Cleanup(func() { close(release) })

	tests := []struct {
		name string
		src  func(t *testing.T) (url string, started <-chan struct{})
		dst  string
		// cause, if set, is given to the cancel function.
		cause error
	}{
		{"stalling http source into a file", func(t *testing.T) (string, <-chan struct{}) {
			srv, sent := stallingServer(t)
			return srv.URL + "/f", sent
		}, fileURL(filepath.Join(dir, "out1")), nil},
		{"stalling http source with a cause", func(t *testing.T) (string, <-chan struct{}) {
			srv, sent := stallingServer(t)
			return srv.URL + "/f", sent
		}, fileURL(filepath.Join(dir, "out2")), errSlow},
		{"file source into a stalling PUT", func(t *testing.T) (string, <-chan struct{}) {
			ch := make(chan struct{})
			time.AfterFunc(200*time.Millisecond, func() { close(ch) })
			return fileURL(bigFile), ch
		}, stallingPut.URL + "/out3", nil},
	}
	c := transfer.New(nil).WithGuard(loopback)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, started := tt.src(t)
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			type result struct {
				res transfer.CopyResult
				err error
			}
			done := make(chan result, 1)
			go func() {
				res, err := c.Copy(ctx, src, tt.dst, transfer.CopyOptions{})
				done <- result{res, err}
			}()
			<-started
			if strings.HasPrefix(tt.dst, "file:") {
				waitFor(t, func() bool { _, err := os.Stat(strings.TrimPrefix(tt.dst, "file://")); return err == nil })
			}
			cancelled := time.Now()
			cancel(tt.cause)
			var r result
			select {
			case r = <-done:
			case <-time.After(2 * time.Second):
				t.Fatal("Copy did not return within 2 s of cancellation")
			}
			t.Logf("returned %v after cancel, %d bytes moved: %v", time.Since(cancelled), r.res.Bytes, r.err)
			if !errors.Is(r.err, context.Canceled) {
				t.Errorf("error %v does not wrap context.Canceled", r.err)
			}
			if tt.cause != nil && !errors.Is(r.err, tt.cause) {
				t.Errorf("error %v does not wrap the cause %v", r.err, tt.cause)
			}
			checkKind(t, r.err, dtr.ErrInternalProcess)
			if strings.HasPrefix(tt.dst, "file:") {
				checkAbsent(t, strings.TrimPrefix(tt.dst, "file://"))
			}
		})
	}
}

func TestCopyWithCancelledContextDoesNothing(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "src"), []byte("data"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := transfer.New(nil).WithGuard(loopback).Copy(ctx, fileURL(filepath.Join(dir, "src")), fileURL(filepath.Join(dir, "dst")), transfer.CopyOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v does not wrap context.Canceled", err)
	}
	checkKind(t, err, dtr.ErrInternalProcess)
	checkAbsent(t, filepath.Join(dir, "dst"))
}

// waitFor polls cond for up to 2 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 2 s")
}

func TestCopyReportsProgress(t *testing.T) {
	dir := t.TempDir()
	const size = 3<<20 + 5
	writeFile(t, filepath.Join(dir, "src"), randomData(size))
	var calls []int64
	_, err := transfer.New(nil).WithGuard(loopback).Copy(context.Background(), fileURL(filepath.Join(dir, "src")), fileURL(filepath.Join(dir, "dst")),
		transfer.CopyOptions{
			BufferSize:    64 << 10,
			ProgressEvery: time.Nanosecond,
			Progress:      func(n int64) { calls = append(calls, n) },
		})
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) < 2 {
		t.Fatalf("Progress called %d times, want several", len(calls))
	}
	for i := 1; i < len(calls); i++ {
		if calls[i] < calls[i-1] {
			t.Errorf("progress went backwards: %v", calls)
		}
	}
	if last := calls[len(calls)-1]; last != size {
		t.Errorf("last progress = %d, want %d", last, size)
	}
}

func TestCopyChecksumTypes(t *testing.T) {
	dir := t.TempDir()
	data := []byte("Wikipedia")
	writeFile(t, filepath.Join(dir, "src"), data)
	tests := []struct {
		name  string
		types []string
		want  map[string]string
	}{
		{"default is adler32", nil, map[string]string{"adler32": "adler32:11e60398"}},
		{"duplicates and case are folded", []string{"MD5", "md5", "Adler32"}, sums(t, data, "md5", "adler32")},
		{"all three", []string{"sha256", "md5", "adler32"}, sums(t, data, "sha256", "md5", "adler32")},
	}
	c := transfer.New(nil).WithGuard(loopback)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := c.Copy(context.Background(), fileURL(filepath.Join(dir, "src")), fileURL(filepath.Join(dir, "dst")),
				transfer.CopyOptions{ChecksumTypes: tt.types})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Checksums) != len(tt.want) {
				t.Errorf("Checksums = %v, want %v", res.Checksums, tt.want)
			}
			for typ, v := range tt.want {
				if res.Checksums[typ] != v {
					t.Errorf("Checksums[%s] = %q, want %q", typ, res.Checksums[typ], v)
				}
			}
		})
	}
}

func TestCopyReportsSourceDigest(t *testing.T) {
	st, srv := newStore(t)
	st.digest = true
	data := randomData(100_000)
	writeFile(t, filepath.Join(st.dir, "f"), data)
	dst := filepath.Join(t.TempDir(), "f")
	res, err := transfer.New(nil).WithGuard(loopback).Copy(context.Background(), srv.URL+"/f", fileURL(dst), transfer.CopyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := sums(t, data, "adler32")["adler32"]
	if res.SourceChecksum != want || res.Checksums["adler32"] != want {
		t.Errorf("SourceChecksum = %q, computed %q, want both %q", res.SourceChecksum, res.Checksums["adler32"], want)
	}
}

func TestACopyWhoseBytesDisagreeWithTheSourcesDigestFailsAndLeavesNothing(t *testing.T) {
	data := []byte("hello world")
	md5Of := func(b []byte) string { h := md5.Sum(b); return base64.StdEncoding.EncodeToString(h[:]) }
	tests := []struct {
		name   string
		digest string // the source's Digest header
		types  []string
		none   bool // NoChecksum
		ok     bool
	}{
		{"adler32 right", "adler32=1a0b045d", nil, false, true},
		{"adler32 wrong", "adler32=1a0b045e", nil, false, false},
		{"md5 right while adler32 is computed", "md5=" + md5Of(data), nil, false, true},
		{"md5 wrong while adler32 is computed", "md5=" + md5Of([]byte("hello wOrld")), nil, false, false},
		{"md5 wrong while md5 is computed", "md5=" + md5Of([]byte("hello wOrld")), []string{"md5"}, false, false},
		{"no usable digest", "unixsum=1", nil, false, true},
		{"md5 wrong while no checksum is wanted", "md5=" + md5Of([]byte("hello wOrld")), nil, true, false},
		{"adler32 right while no checksum is wanted", "adler32=1a0b045d", nil, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Digest", tt.digest)
				w.Write(data)
			}))
			defer srv.Close()
			dst := filepath.Join(t.TempDir(), "f")
			res, err := transfer.New(nil).WithGuard(loopback).Copy(context.Background(), srv.URL+"/f", fileURL(dst), transfer.CopyOptions{ChecksumTypes: tt.types, NoChecksum: tt.none})
			_, statErr := os.Stat(dst)
			if tt.ok {
				if err != nil || statErr != nil {
					t.Fatalf("copy: %v, destination: %v; want it done", err, statErr)
				}
				return
			}
			var te *transfer.Error
			if !errors.As(err, &te) || te.Kind != dtr.ErrTemporaryRemote || te.URL != srv.URL+"/f" || !strings.Contains(err.Error(), "Digest says") {
				t.Fatalf("copy: %v; want a TEMPORARY_REMOTE error of the source naming its Digest", err)
			}
			if !errors.Is(statErr, fs.ErrNotExist) || res.Checksums != nil {
				t.Fatalf("destination %v, checksums %v; want nothing left", statErr, res.Checksums)
			}
		})
	}
}

func TestCopyOfUnknownLengthSourceIsSentChunked(t *testing.T) {
	st, dstSrv := newStore(t)
	data := randomData(2<<20 + 3)
	// A source that streams without Content-Length.
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for b := data; len(b) > 0; {
			n := min(len(b), 100_000)
			w.Write(b[:n])
			http.NewResponseController(w).Flush()
			b = b[n:]
		}
	}))
	defer src.Close()
	res, err := transfer.New(nil).WithGuard(loopback).Copy(context.Background(), src.URL+"/f", dstSrv.URL+"/out", transfer.CopyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(st.dir, "out"))
	if string(got) != string(data) || res.Bytes != int64(len(data)) {
		t.Errorf("copied %d bytes (file %d), want %d identical", res.Bytes, len(got), len(data))
	}
	if n, _ := st.putLength("/out"); n != -1 {
		t.Errorf("PUT Content-Length = %d, want -1 (chunked)", n)
	}
}

func TestAChecksumOfALocalFileStopsWhenItsContextEnds(t *testing.T) {
	f := filepath.Join(t.TempDir(), "f")
	data := randomData(1 << 20)
	writeFile(t, f, data)
	c := transfer.New(nil).WithGuard(loopback)
	want := sums(t, data, "adler32")["adler32"]
	if got, err := c.Checksum(context.Background(), fileURL(f), "adler32"); err != nil || got != want {
		t.Fatalf("Checksum = %q, %v; want %q", got, err, want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Checksum(ctx, fileURL(f), "adler32"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Checksum with an ended context: %v; want it stopped", err)
	}
}
