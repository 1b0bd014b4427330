package processor

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// An S3 object appears whole or not at all: the cleanup of a failed
// upload with overwrite keeps what is there (the old object, or a whole
// copy that the retry replaces); without overwrite pre-cleaning found the
// key free, so what is there is the attempt's own and goes.
func TestTheCleanupOfAnS3UploadKeepsTheObjectOnlyWithOverwrite(t *testing.T) {
	backend := s3mem.New()
	if err := backend.CreateBucket("out"); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(srv.Close)
	t.Setenv("AWS_ACCESS_KEY_ID", "sluice")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "sluice-secret")
	s := New(Config{Client: transfer.New(nil).WithGuard(loopback(t))}, nil, slog.New(slog.DiscardHandler))
	for _, overwrite := range []bool{true, false} {
		if _, err := backend.PutObject("out", "f", nil, strings.NewReader("there before"), 12, nil); err != nil {
			t.Fatal(err)
		}
		d := dtr.DTR{Source: "file:///in/f", Destination: "s3://" + strings.TrimPrefix(srv.URL, "http://") + "/out/f",
			TransferGrant: "x.4", Options: dtr.Options{Overwrite: overwrite}}
		res := s.Handle(context.Background(), api.Grant{ID: "x.5", State: dtr.RegisteringReplica, Cleanup: true, DTR: &d}, nil)
		if res.Error != nil {
			t.Fatalf("overwrite %v: cleanup failed: %+v", overwrite, res.Error)
		}
		_, err := backend.HeadObject("out", "f")
		if kept := err == nil; kept != overwrite {
			t.Errorf("overwrite %v: the object kept: %v (%v)", overwrite, kept, err)
		}
	}
}

// loopback lets a test's servers, on loopback, be reached: the default
// Guard refuses loopback addresses.
func loopback(t *testing.T) *transfer.Guard {
	t.Helper()
	g, err := transfer.NewGuard("127.0.0.0/8", "::1")
	if err != nil {
		t.Fatal(err)
	}
	return g
}
