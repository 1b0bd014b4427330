//go:build unix

package transfer_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// notRegularFiles makes, in dir, a named pipe nobody writes to, a socket
// and a directory, and returns them by what the refusal calls them.
// /dev/zero, a character device that never ends, is added when no roots
// confine the client.
func notRegularFiles(t *testing.T, dir string, withDevice bool) map[string]string {
	t.Helper()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	// A socket's path must be short (108 bytes); it is linked into dir.
	sdir, err := os.MkdirTemp("", "sock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sdir) })
	l, err := net.Listen("unix", filepath.Join(sdir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	sock := filepath.Join(dir, "sock")
	if err := os.Rename(filepath.Join(sdir, "s"), sock); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	m := map[string]string{"a named pipe (FIFO)": fifo, "a socket": sock, "a directory": sub}
	if withDevice {
		m["a character device"] = "/dev/zero"
	}
	return m
}

// copyWithin runs Copy and fails the test unless it returns within 2 s.
// Copy's context ends after 3 s, so that a copy that ignored the refusal
// but heeds its context stops too.
func copyWithin(t *testing.T, c *transfer.Client, src, dst string, opt transfer.CopyOptions) (transfer.CopyResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	t.Cleanup(cancel)
	type result struct {
		res transfer.CopyResult
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		res, err := c.Copy(ctx, src, dst, opt)
		done <- result{res, err}
	}()
	select {
	case r := <-done:
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("Copy took %v (%v)", took, r.err)
		}
		return r.res, r.err
	case <-time.After(2 * time.Second):
		t.Fatalf("Copy of %s to %s did not return within 2 s", src, dst)
	}
	panic("unreachable")
}

func TestALocalSourceThatIsNotARegularFileIsRefusedAtOnceAndForGood(t *testing.T) {
	for _, roots := range []bool{false, true} {
		t.Run(map[bool]string{false: "no file roots", true: "within file roots"}[roots], func(t *testing.T) {
			dir := t.TempDir()
			c := transfer.New(nil).WithGuard(loopback)
			if roots {
				files, err := transfer.OpenFiles(dir)
				if err != nil {
					t.Fatal(err)
				}
				c = c.WithFiles(files)
			}
			for what, p := range notRegularFiles(t, dir, !roots) {
				t.Run(what, func(t *testing.T) {
					dst := filepath.Join(dir, "out-"+filepath.Base(p))
					res, err := copyWithin(t, c, fileURL(p), fileURL(dst), transfer.CopyOptions{})
					checkKind(t, err, dtr.ErrLocalFile) // not retried
					if want := "source is " + what + ", not a regular file"; !strings.Contains(err.Error(), want) {
						t.Errorf("copy: %v; want it to say %q", err, want)
					}
					if res.Bytes != 0 {
						t.Errorf("%d bytes moved", res.Bytes)
					}
					checkAbsent(t, dst)
					// QUERY_REPLICA's stat refuses it too, so that the DTR
					// fails at its first step.
					info, err := c.Stat(context.Background(), fileURL(p))
					checkKind(t, err, dtr.ErrLocalFile)
					if want := "is " + what + ", not a regular file"; !strings.Contains(err.Error(), want) || info.Exists {
						t.Errorf("stat: %+v, %v; want it refused saying %q", info, err, want)
					}
					if !errors.Is(err, transfer.ErrNotRegular) {
						t.Errorf("stat: %v does not wrap ErrNotRegular", err)
					}
				})
			}
		})
	}
}

func TestAChecksumOfANamedPipeIsRefusedAtOnce(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := transfer.New(nil).WithGuard(loopback).Checksum(context.Background(), fileURL(fifo), "adler32")
		done <- err
	}()
	select {
	case err := <-done:
		checkKind(t, err, dtr.ErrLocalFile)
		if !errors.Is(err, transfer.ErrNotRegular) {
			t.Errorf("checksum: %v; want it refused as not a regular file", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Checksum of a named pipe did not return within 2 s")
	}
}

func TestALocalDestinationThatIsNotARegularFileIsNotWrittenThrough(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	writeFile(t, src, randomData(100_000))
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	readFifo := filepath.Join(dir, "read-fifo")
	if err := syscall.Mkfifo(readFifo, 0o644); err != nil {
		t.Fatal(err)
	}
	// Someone reads this one: without the refusal the copy would pour the
	// source into it.
	r, err := os.OpenFile(readFifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, dst, what string
	}{
		{"a named pipe nobody reads", fifo, "a named pipe (FIFO)"},
		{"a named pipe somebody reads", readFifo, "a named pipe (FIFO)"},
		{"a character device", "/dev/null", "a character device"},
		{"a directory", sub, "a directory"},
	}
	c := transfer.New(nil).WithGuard(loopback)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, err := os.Lstat(tt.dst)
			if err != nil {
				t.Fatal(err)
			}
			res, err := copyWithin(t, c, fileURL(src), fileURL(tt.dst), transfer.CopyOptions{})
			checkKind(t, err, dtr.ErrLocalFile)
			if want := "destination is " + tt.what + ", not a regular file"; !strings.Contains(err.Error(), want) {
				t.Errorf("copy: %v; want it to say %q", err, want)
			}
			if res.Bytes != 0 {
				t.Errorf("%d bytes written", res.Bytes)
			}
			// PRE_CLEAN's stat says so as well.
			if _, err := c.Stat(context.Background(), fileURL(tt.dst)); !errors.Is(err, transfer.ErrNotRegular) || transfer.KindOf(err) != dtr.ErrLocalFile {
				t.Errorf("stat: %v; want LOCAL_FILE, not a regular file", err)
			}
			// It is not ours: it stays.
			if after, err := os.Lstat(tt.dst); err != nil || after.Mode() != before.Mode() {
				t.Errorf("the destination went or changed: %v", err)
			}
		})
	}
	if n, _ := r.Read(make([]byte, 1)); n != 0 {
		t.Error("bytes were written into the named pipe")
	}
}
