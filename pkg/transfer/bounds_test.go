package transfer_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// closeDelimitedServer answers every request with 200, no Content-Length
// and a body that ends when the server closes the connection: body writes
// it. It returns the server's URL and the number of connections whose body
// writing ended, and with it the error body returned.
func closeDelimitedServer(t *testing.T, body func(w io.Writer) error) (string, <-chan error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ended := make(chan error, 16)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				req, err := http.ReadRequest(bufio.NewReader(conn))
				if err != nil {
					return
				}
				io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n")
				if req.Method == http.MethodHead {
					return
				}
				ended <- body(conn)
			}()
		}
	}()
	return "http://" + l.Addr().String(), ended
}

// sized returns a body writer of n bytes.
func sized(n int) func(w io.Writer) error {
	return func(w io.Writer) error { _, err := w.Write(randomData(n)); return err }
}

// endless writes until the client goes away.
func endless(w io.Writer) error {
	buf := randomData(64 << 10)
	for {
		if _, err := w.Write(buf); err != nil {
			return err
		}
	}
}

// sizeErr checks err is a source error of kind, naming the source and
// saying want.
func sizeErr(t *testing.T, err error, src string, kind dtr.ErrorKind, want string) {
	t.Helper()
	checkKind(t, err, kind)
	var te *transfer.Error
	if !errors.As(err, &te) || te.URL != src {
		t.Errorf("error %v is not the source's (%s)", err, src)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
}

func TestACloseDelimitedBodyOfAnotherSizeThanQueriedFailsAndLeavesNothing(t *testing.T) {
	const queried = 100_000
	tests := []struct {
		name  string
		sends int
		want  string // "" is success
	}{
		{"the size queried", queried, ""},
		{"shorter", queried - 10, "size changed: the source had 100000 bytes when queried, 99990 were read"},
		{"longer", queried + 10, "size changed: the source had 100000 bytes when queried, more were read (the copy stopped at byte 100001)"},
		{"empty", 0, "size changed: the source had 100000 bytes when queried, 0 were read"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, _ := closeDelimitedServer(t, sized(tt.sends))
			src += "/f"
			dst := filepath.Join(t.TempDir(), "f")
			res, err := transfer.New(nil).WithGuard(loopback).Copy(context.Background(), src, fileURL(dst), transfer.CopyOptions{ExpectedSize: queried})
			if tt.want == "" {
				if err != nil || res.Bytes != queried {
					t.Fatalf("copy: %d bytes, %v; want %d", res.Bytes, err, queried)
				}
				return
			}
			// Retried: the file may have been in the middle of being
			// written, and the next attempt queries its size again.
			sizeErr(t, err, src, dtr.ErrTemporaryRemote, tt.want)
			if res.Bytes > queried {
				t.Errorf("%d bytes written, more than the %d queried", res.Bytes, queried)
			}
			checkAbsent(t, dst)
		})
	}
}

func TestASourceThatSaysItHasAnotherSizeThanQueriedIsRefusedBeforeAnyByte(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "120")
		w.Write(make([]byte, 120))
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	local := filepath.Join(dir, "local")
	writeFile(t, local, make([]byte, 120))
	tests := []struct {
		name, src string
	}{
		{"http", srv.URL + "/f"},
		{"file", fileURL(local)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := filepath.Join(dir, "out-"+tt.name)
			res, err := transfer.New(nil).WithGuard(loopback).Copy(context.Background(), tt.src, fileURL(dst), transfer.CopyOptions{ExpectedSize: 100})
			sizeErr(t, err, tt.src, dtr.ErrTemporaryRemote, "size changed: the source had 100 bytes when queried, it has 120 now")
			if res.Bytes != 0 {
				t.Errorf("%d bytes moved", res.Bytes)
			}
			checkAbsent(t, dst)
		})
	}
}

func TestALocalFileThatChangesSizeWhileReadFailsAndIsRetried(t *testing.T) {
	const size = 1 << 20
	tests := []struct {
		name     string
		expected int64 // CopyOptions.ExpectedSize
		change   func(f *os.File) error
		want     string
	}{
		{"growing, with the size queried", size, func(f *os.File) error { _, err := f.Write([]byte("more")); return err },
			"size changed: the source had 1048576 bytes when queried, more were read (the copy stopped at byte 1048577)"},
		{"growing, size unknown", 0, func(f *os.File) error { _, err := f.Write([]byte("more")); return err },
			"size changed: the source had 1048576 bytes when opened, more were read"},
		{"shrinking, with the size queried", size, func(f *os.File) error { return f.Truncate(size / 2) },
			"size changed: the source had 1048576 bytes when queried, 524288 were read"},
		{"shrinking, size unknown", 0, func(f *os.File) error { return f.Truncate(size / 2) },
			"size changed: the source had 1048576 bytes when opened, 524288 were read"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
			writeFile(t, src, randomData(size))
			f, err := os.OpenFile(src, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			changed := false
			_, err = transfer.New(nil).WithGuard(loopback).Copy(context.Background(), fileURL(src), fileURL(dst), transfer.CopyOptions{
				ExpectedSize: tt.expected, BufferSize: 64 << 10, ProgressEvery: time.Nanosecond,
				Progress: func(int64) {
					if !changed {
						changed = true
						if err := tt.change(f); err != nil {
							t.Error(err)
						}
					}
				},
			})
			sizeErr(t, err, fileURL(src), dtr.ErrTemporaryRemote, tt.want)
			checkAbsent(t, dst)
		})
	}
}

func TestAnEndlessSourceIsCutOffPastTheMaximumSize(t *testing.T) {
	const max = 1 << 20
	src, ended := closeDelimitedServer(t, endless)
	src += "/f"
	dst := filepath.Join(t.TempDir(), "f")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := transfer.New(nil).WithGuard(loopback).Copy(ctx, src, fileURL(dst), transfer.CopyOptions{MaxSize: max})
	// Not retried: the next attempt would stream as long.
	sizeErr(t, err, src, dtr.ErrPermanentRemote, fmt.Sprintf("the source is larger than the maximum file size of %d bytes (the copy stopped at byte %d)", max, max+1))
	if res.Bytes != max {
		t.Errorf("%d bytes written, want the %d allowed", res.Bytes, max)
	}
	checkAbsent(t, dst)
	// The connection was closed, not read to its end: the server's
	// writing fails.
	select {
	case err := <-ended:
		if err == nil {
			t.Error("the server finished its endless body")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the server is still sending 5 s after the copy stopped")
	}
}

func TestASourceKnownToBeLargerThanTheMaximumIsRefusedBeforeAnyByte(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(2000))
		w.Write(make([]byte, 2000))
	}))
	t.Cleanup(srv.Close)
	unknown, _ := closeDelimitedServer(t, sized(2000))
	dir := t.TempDir()
	local := filepath.Join(dir, "local")
	writeFile(t, local, make([]byte, 2000))
	tests := []struct {
		name, src string
		opt       transfer.CopyOptions
		kind      dtr.ErrorKind
		want      string
	}{
		{"an HTTP Content-Length", srv.URL + "/f", transfer.CopyOptions{MaxSize: 1000},
			dtr.ErrPermanentRemote, "the source has 2000 bytes, more than the maximum file size of 1000 bytes"},
		{"a local file", fileURL(local), transfer.CopyOptions{MaxSize: 1000},
			dtr.ErrLocalFile, "the source has 2000 bytes, more than the maximum file size of 1000 bytes"},
		{"the size queried, the source giving none", unknown + "/f", transfer.CopyOptions{MaxSize: 1000, ExpectedSize: 2000},
			dtr.ErrPermanentRemote, "the source has 2000 bytes, more than the maximum file size of 1000 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := filepath.Join(dir, "out")
			res, err := transfer.New(nil).WithGuard(loopback).Copy(context.Background(), tt.src, fileURL(dst), tt.opt)
			sizeErr(t, err, tt.src, tt.kind, tt.want)
			if res.Bytes != 0 {
				t.Errorf("%d bytes moved", res.Bytes)
			}
			checkAbsent(t, dst)
		})
	}
	// QUERY_REPLICA refuses the same way, with the same words.
	for _, tt := range tests[:2] {
		err := transfer.CheckMaxSize("query replica", tt.src, 2000, 1000)
		sizeErr(t, err, tt.src, tt.kind, tt.want)
	}
	if err := transfer.CheckMaxSize("query replica", srv.URL+"/f", 1000, 1000); err != nil {
		t.Errorf("a source of the maximum size: %v", err)
	}
	if err := transfer.CheckMaxSize("query replica", srv.URL+"/f", -1, 1000); err != nil {
		t.Errorf("a source of unknown size: %v", err)
	}
	if err := transfer.CheckMaxSize("query replica", srv.URL+"/f", 1<<40, 0); err != nil {
		t.Errorf("no limit: %v", err)
	}
	// A source at the maximum is copied.
	if _, err := transfer.New(nil).WithGuard(loopback).Copy(context.Background(), srv.URL+"/f", fileURL(filepath.Join(dir, "ok")), transfer.CopyOptions{MaxSize: 2000, ExpectedSize: 2000}); err != nil {
		t.Errorf("a source of the maximum size: %v", err)
	}
}
