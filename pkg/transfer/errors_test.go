package transfer_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

func TestErrorNeverShowsCredentials(t *testing.T) {
	const user, pass = "alice", "s3cr3t"
	withCreds := func(base string) string {
		return strings.Replace(base, "http://", "http://"+user+":"+pass+"@", 1)
	}
	refused := withCreds(refusedURL(t)) + "/f"
	unauthorized := withCreds(statusServer(t, 401).URL) + "/f"
	_, srv := newStore(t)
	missing := withCreds(srv.URL) + "/missing"
	dropping := withCreds(droppingServer(t, 1<<20).URL) + "/f"
	local := fileURL(filepath.Join(t.TempDir(), "f"))
	writeFile(t, strings.TrimPrefix(local, "file://"), []byte("data"))

	c := transfer.New(nil).WithGuard(loopback)
	ctx := context.Background()
	tests := []struct {
		name string
		run  func() error
	}{
		{"stat refused", func() error { _, err := c.Stat(ctx, refused); return err }},
		{"stat 401", func() error { _, err := c.Stat(ctx, unauthorized); return err }},
		{"delete refused", func() error { return c.Delete(ctx, refused) }},
		{"delete 401", func() error { return c.Delete(ctx, unauthorized) }},
		{"copy from missing", func() error { _, err := c.Copy(ctx, missing, local+"2", transfer.CopyOptions{}); return err }},
		{"copy from dropping", func() error { _, err := c.Copy(ctx, dropping, local+"3", transfer.CopyOptions{}); return err }},
		{"copy to refused", func() error { _, err := c.Copy(ctx, local, refused, transfer.CopyOptions{}); return err }},
		{"copy to 401", func() error { _, err := c.Copy(ctx, local, unauthorized, transfer.CopyOptions{}); return err }},
		{"rename http", func() error { return c.Rename(ctx, unauthorized, refused) }},
		{"unparseable URL", func() error { _, err := c.Stat(ctx, "http://"+user+":"+pass+"@host:port/x"); return err }},
		{"unparseable password with slash", func() error {
			_, err := c.Stat(ctx, "http://"+user+":"+pass+"/x@host/f")
			return err
		}},
		{"unsupported scheme", func() error { _, err := c.Stat(ctx, "davs://"+user+":"+pass+"@host/f"); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.run()
			if err == nil {
				t.Fatal("no error")
			}
			for _, secret := range []string{user, pass} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q shows %q", err, secret)
				}
			}
		})
	}
}

func TestRedact(t *testing.T) {
	tests := []struct{ in, want string }{
		{"http://alice:s3cr3t@host:8080/a/b?c=d", "http://host:8080/a/b?c=d"},
		{"https://alice@host/a", "https://host/a"},
		{"http://host/a@b", "http://host/a@b"},
		{"file:///data/f", "file:///data/f"},
		{"http://alice:s3/cr3t@host/f", "http://host/f"},
		{"not a url", "not a url"},
		{"https://host/f?access_token=s3cr3t&part=2", "https://host/f?access_token=xxxxx&part=2"},
		{"s3://host/b/k?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=abc&x-id=GetObject", "s3://host/b/k?X-Amz-Credential=xxxxx&X-Amz-Signature=xxxxx&x-id=GetObject"},
		{"davs://host/f?authz=s3cr3t", "davs://host/f?authz=xxxxx"},
		{"http://alice:s3/cr3t@host/f?token=s3cr3t", "http://host/f?token=xxxxx"},
	}
	for _, tt := range tests {
		if got := transfer.Redact(tt.in); got != tt.want {
			t.Errorf("Redact(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestKindOf(t *testing.T) {
	temp := &transfer.Error{Kind: dtr.ErrTemporaryRemote, Op: "stat", URL: "http://h/f", Err: errors.New("boom")}
	tests := []struct {
		name string
		err  error
		want dtr.ErrorKind
	}{
		{"nil is no kind", nil, dtr.ErrNone},
		{"transfer error gives its kind", temp, dtr.ErrTemporaryRemote},
		{"wrapped transfer error gives its kind", fmt.Errorf("delivery: %w", temp), dtr.ErrTemporaryRemote},
		{"unclassified error is internal process", errors.New("boom"), dtr.ErrInternalProcess},
		{"bare cancellation is internal process", context.Canceled, dtr.ErrInternalProcess},
		{"error without a kind is internal process", &transfer.Error{Op: "x", Err: errors.New("y")}, dtr.ErrInternalProcess},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := transfer.KindOf(tt.err); got != tt.want {
				t.Errorf("KindOf = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestErrorSaysOpURLAndCauseAndUnwraps(t *testing.T) {
	cause := errors.New("disk on fire")
	err := &transfer.Error{Kind: dtr.ErrLocalFile, Op: "copy", URL: "http://bob:pw@h/f", Err: cause}
	if got, want := err.Error(), "copy http://h/f: disk on fire"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(err, cause) {
		t.Error("errors.Is does not find the cause")
	}
}

func TestStatusErrorIsReachable(t *testing.T) {
	_, err := transfer.New(nil).WithGuard(loopback).Stat(context.Background(), statusServer(t, 503).URL+"/f")
	var se *transfer.StatusError
	if !errors.As(err, &se) || se.Code != 503 {
		t.Fatalf("errors.As(%v, *StatusError) = %v, %+v", err, errors.As(err, &se), se)
	}
}
