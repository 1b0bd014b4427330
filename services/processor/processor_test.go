package processor

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"golang.org/x/net/webdav"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/checksum"
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

func TestFinaliseVerifiesAndPlacesTheFileOrFindsItPlacedBefore(t *testing.T) {
	sum := func(data string) string {
		h, _ := checksum.New("adler32")
		h.Write([]byte(data))
		return checksum.Format("adler32", h)
	}
	tests := []struct {
		name              string
		tmp, dst          string // contents; "" is no file
		delivered         string // what delivery computed
		expected          string // the job's checksum
		verifyOnDisk      bool   // SLUICE_PROCESSOR_VERIFY_ON_DISK
		bytes             int64  // what delivery wrote
		wantErr           bool
		wantDst, wantTemp string
	}{
		{name: "the temporary file is renamed into place", tmp: "data", delivered: sum("data"), wantDst: "data"},
		{name: "the temporary file is checked against the expected checksum and renamed into place",
			tmp: "data", delivered: sum("data"), expected: sum("data"), wantDst: "data"},
		{name: "a stream whose checksum is not the expected one is refused and removed, without reading the file",
			tmp: "data", delivered: sum("datA"), expected: sum("data"), wantErr: true},
		{name: "a file that changed on disk after delivery hashed it is not read again by default",
			tmp: "datA", delivered: sum("data"), expected: sum("data"), wantDst: "datA"},
		{name: "a file that changed on disk is refused and removed when asked to verify on disk",
			tmp: "datA", delivered: sum("data"), verifyOnDisk: true, wantErr: true},
		{name: "an expected checksum of another type than the stream's is checked on disk",
			tmp: "datA", delivered: sum("datA"), expected: mustSum(t, "data", "md5"), wantErr: true},
		{name: "a file an earlier try put in place is done", dst: "data", delivered: sum("data"), wantDst: "data"},
		{name: "a file an earlier try put in place is done, verifying on disk", dst: "data", delivered: sum("data"),
			verifyOnDisk: true, wantDst: "data"},
		{name: "a file an earlier try put in place is done when delivery computed no checksum, by its size",
			dst: "data", bytes: 4, wantDst: "data"},
		{name: "a file of another size in place is not taken for it when delivery computed no checksum",
			dst: "other", bytes: 4, wantErr: true, wantDst: "other"},
		{name: "another file in place is not taken for it", dst: "other", delivered: sum("data"), wantErr: true, wantDst: "other"},
		{name: "no file anywhere is an error", delivered: sum("data"), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			d := dtr.DTR{ID: uuid.New(), Source: "file:///nowhere", Destination: "file://" + filepath.Join(dir, "f"),
				Checksum: tt.delivered, Bytes: tt.bytes, TransferGrant: "g.3", Options: dtr.Options{Checksum: tt.expected}}
			tmpPath := filepath.Join(dir, filepath.Base(transfer.TempURLOf(&d)))
			if tt.tmp != "" {
				write(t, tmpPath, tt.tmp)
			}
			if tt.dst != "" {
				write(t, filepath.Join(dir, "f"), tt.dst)
			}
			s := New(Config{VerifyOnDisk: tt.verifyOnDisk}, nil, slog.New(slog.DiscardHandler))
			res, err := s.finalise(context.Background(), d)
			if (err != nil) != tt.wantErr {
				t.Fatalf("finalise: %v, want an error: %v", err, tt.wantErr)
			}
			if err != nil && transfer.KindOf(err) == dtr.ErrTransferSpeed && tt.wantTemp == "" && read(tmpPath) != "" {
				t.Error("a copy with the wrong checksum was left")
			}
			if err == nil && res.Checksum != tt.delivered {
				t.Errorf("the result's checksum is %q, want delivery's %q", res.Checksum, tt.delivered)
			}
			if got := read(filepath.Join(dir, "f")); got != tt.wantDst {
				t.Errorf("destination holds %q, want %q", got, tt.wantDst)
			}
			if got := read(tmpPath); got != tt.wantTemp {
				t.Errorf("temporary file holds %q, want %q", got, tt.wantTemp)
			}
		})
	}
}

// mustSum is the checksum of typ of data.
func mustSum(t *testing.T, data, typ string) string {
	t.Helper()
	h, err := checksum.New(typ)
	if err != nil {
		t.Fatal(err)
	}
	h.Write([]byte(data))
	return checksum.Format(typ, h)
}

func read(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func TestAConfigBuiltInCodeTakesTheTagsDefaults(t *testing.T) {
	if defaultCacheLockTimeout <= 0 {
		t.Fatalf("CacheLockTimeout's default %q", tagDefault("CacheLockTimeout"))
	}
}

// A chained QUERY_REPLICA grant (its Then) pre-cleans the destination
// once the source is found, and returns both outcomes in one result; a
// failed query does not pre-clean, and a grant without Then only queries.
func TestAChainedQueryGrantPreCleansOnlyAfterTheQuerySucceeded(t *testing.T) {
	tests := []struct {
		name              string
		source, dest      bool // whether each exists
		overwrite, chain  bool
		wantErr, wantThen bool
		wantThenErr       dtr.ErrorKind
	}{
		{name: "the source is there and the destination free", source: true, chain: true, wantThen: true},
		{name: "the destination exists and overwrite is not set", source: true, dest: true, chain: true,
			wantThen: true, wantThenErr: dtr.ErrPermanentRemote},
		{name: "the destination exists and overwrite is set", source: true, dest: true, overwrite: true, chain: true, wantThen: true},
		{name: "the source is missing", dest: true, chain: true, wantErr: true},
		{name: "a grant that is not chained", source: true, dest: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			src, dst := filepath.Join(dir, "in"), filepath.Join(dir, "out")
			if tt.source {
				write(t, src, "12345")
			}
			if tt.dest {
				write(t, dst, "old")
			}
			d := dtr.DTR{ID: uuid.New(), Source: "file://" + src, Destination: "file://" + dst, Options: dtr.Options{Overwrite: tt.overwrite}}
			g := api.Grant{ID: d.ID.String() + ".1", Stage: dtr.StagePre, State: dtr.QueryingReplica, DTR: &d}
			if tt.chain {
				g.Then = &api.GrantThen{State: dtr.PreCleaning, Grant: d.ID.String() + ".2"}
			}
			s := New(Config{}, nil, slog.New(slog.DiscardHandler))
			res := s.Handle(context.Background(), g, func(int64, int64) {})
			if (res.Error != nil) != tt.wantErr {
				t.Fatalf("query error %+v, want one: %v", res.Error, tt.wantErr)
			}
			if !tt.wantErr && res.Size != 5 {
				t.Errorf("size %d, want 5", res.Size)
			}
			if (res.Then != nil) != tt.wantThen {
				t.Fatalf("pre-clean outcome %+v, want one: %v", res.Then, tt.wantThen)
			}
			if res.Then == nil {
				return
			}
			if res.Then.Grant != g.Then.Grant || res.Then.State != dtr.PreCleaning || res.Then.DTR != d.ID {
				t.Errorf("pre-clean outcome under %s %s %s, want %s PRE_CLEANING %s", res.Then.DTR, res.Then.Grant, res.Then.State, d.ID, g.Then.Grant)
			}
			var kind dtr.ErrorKind
			if res.Then.Error != nil {
				kind = res.Then.Error.Kind
				if res.Then.Error.Location != dtr.LocationDestination {
					t.Errorf("pre-clean failure about %q, want the destination", res.Then.Error.Location)
				}
			}
			if kind != tt.wantThenErr {
				t.Errorf("pre-clean error %q, want %q", kind, tt.wantThenErr)
			}
		})
	}
}

// A chained pre-clean that the lease's fence stops before it changes
// storage (here, making the destination's directory on a WebDAV server)
// sends no outcome: the scheduler then queues the DTR for PRE_CLEAN as
// after the query alone, instead of failing it for an error of its own
// making.
func TestAChainedPreCleanStoppedByTheLeaseFenceSendsNoOutcome(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "in")
	write(t, src, "12345")
	davDir := t.TempDir()
	srv := httptest.NewServer(&webdav.Handler{FileSystem: webdav.Dir(davDir), LockSystem: webdav.NewMemLS()})
	t.Cleanup(srv.Close)
	dst := strings.Replace(srv.URL, "http://", "dav://", 1) + "/sub/out"
	d := dtr.DTR{ID: uuid.New(), Source: "file://" + src, Destination: dst}
	g := api.Grant{ID: d.ID.String() + ".1", Stage: dtr.StagePre, State: dtr.QueryingReplica, DTR: &d,
		Then: &api.GrantThen{State: dtr.PreCleaning, Grant: d.ID.String() + ".2"}}
	for _, fenced := range []bool{true, false} {
		ctx := context.Background()
		if fenced {
			ctx = transfer.WithFence(ctx, func() error { return fmt.Errorf("%w: no renewal acknowledged", transfer.ErrLeaseLost) })
		}
		res := New(Config{Client: transfer.New(nil).WithGuard(loopback(t))}, nil, slog.New(slog.DiscardHandler)).Handle(ctx, g, func(int64, int64) {})
		if res.Error != nil || res.Size != 5 {
			t.Fatalf("fenced %v: query error %+v size %d, want none and 5", fenced, res.Error, res.Size)
		}
		_, err := os.Stat(filepath.Join(davDir, "sub"))
		switch {
		case fenced && (res.Then != nil || err == nil):
			t.Fatalf("fenced: pre-clean outcome %+v (%+v), directory made: %v; want neither", res.Then, res.Then.Error, err == nil)
		case !fenced && (res.Then == nil || res.Then.Error != nil || err != nil):
			t.Fatalf("not fenced: pre-clean outcome %+v, directory: %v; want it done", res.Then, err)
		}
	}
}
