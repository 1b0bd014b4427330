package transfer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/httpstore"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// fenceAfter is a fence that lets n steps through and refuses the rest.
func fenceAfter(n int64) transfer.Fence {
	var calls atomic.Int64
	return func() error {
		if calls.Add(1) > n {
			return fmt.Errorf("%w: test", transfer.ErrLeaseLost)
		}
		return nil
	}
}

func TestAFencedCopyWritesAndDeletesNothingMore(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	data := bytes.Repeat([]byte("fenced "), 600_000) // 4.2 MB: five 1 MiB chunks
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var methods []string
	store := httpstore.Handler(t.TempDir())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		methods = append(methods, r.Method)
		mu.Unlock()
		store.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	c := transfer.New(nil).WithGuard(loopback)
	cases := []struct {
		name, dst string
		steps     int64 // let through before the fence refuses
		left      string
	}{
		{"to a file, refused before it is created", fileURL(filepath.Join(dir, "a")), 0, ""},
		{"to a file, refused half way: its partial file stays for the cleanup", fileURL(filepath.Join(dir, "b")), 3, filepath.Join(dir, "b")},
		{"to an HTTP server, refused half way: no DELETE", srv.URL + "/c", 3, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			methods = nil
			mu.Unlock()
			ctx := transfer.WithFence(context.Background(), fenceAfter(tc.steps))
			_, err := c.Copy(ctx, fileURL(src), tc.dst, transfer.CopyOptions{})
			if !transfer.IsLeaseLost(err) || transfer.KindOf(err) != dtr.ErrInternalProcess {
				t.Fatalf("copy: %v (%s), want the lease lost, INTERNAL_PROCESS", err, transfer.KindOf(err))
			}
			if tc.left != "" {
				if fi, err := os.Stat(tc.left); err != nil || fi.Size() >= int64(len(data)) {
					t.Errorf("the partial file: %v, %v", fi, err)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for _, m := range methods {
				if m == http.MethodDelete {
					t.Errorf("a fenced copy sent DELETE: %v", methods)
				}
			}
		})
	}
	// Every other step on storage is refused whole.
	keep := filepath.Join(dir, "keep")
	if err := os.WriteFile(keep, data[:10], 0o644); err != nil {
		t.Fatal(err)
	}
	refused := transfer.WithFence(context.Background(), fenceAfter(0))
	steps := map[string]error{
		"delete":       c.Delete(refused, fileURL(keep)),
		"rename":       c.Rename(refused, fileURL(keep), fileURL(filepath.Join(dir, "moved"))),
		"make parents": c.MakeParents(refused, fileURL(filepath.Join(dir, "new", "dir", "f"))),
		"http delete":  c.Delete(refused, srv.URL+"/c"),
	}
	for name, err := range steps {
		if !transfer.IsLeaseLost(err) {
			t.Errorf("%s under a refusing fence: %v", name, err)
		}
	}
	if b, err := os.ReadFile(keep); err != nil || !bytes.Equal(b, data[:10]) {
		t.Errorf("the file a refused delete and rename named: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused make parents made %v", err)
	}
}
