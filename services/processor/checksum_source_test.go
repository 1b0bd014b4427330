package processor

import (
	"bytes"
	"context"
	"log/slog"
	"net/url"
	"os"
	"testing"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
	"github.com/sluice-dtr/sluice/pkg/transfer/xrootdtest"
)

// Post-processing of an upload to the real xrootd over WebDAV asks the
// storage for the checksum of what it stored: with xrootd.chksum
// configured it confirms delivery's (or, differing, the copy goes as a
// mismatch on disk would); without, nothing is confirmed and the DTR keeps
// the stream's word.
func TestPostProcessingAsksTheStorageForTheChecksumOfWhatItStored(t *testing.T) {
	data := bytes.Repeat([]byte("written "), 30000)
	h, _ := checksum.New("adler32")
	h.Write(data)
	sum := checksum.Format("adler32", h)
	for _, tc := range []struct {
		name, chksum, delivered string
		want                    string // the result's checksum source
		wantErr                 dtr.ErrorKind
	}{
		{"xrootd with xrootd.chksum adler32", "adler32", sum, dtr.ChecksumFromStorage, ""},
		{"xrootd without checksums", "", sum, "", ""},
		{"xrootd that stored other bytes than delivery sent", "adler32", "adler32:00000001", "", dtr.ErrTransferSpeed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := xrootdtest.Start(t, xrootdtest.Options{HTTP: true, Checksum: tc.chksum})
			host := srv.HTTPS[len("https://"):]
			d := dtr.DTR{ID: uuid.New(), Source: "file:///in/f", Destination: "davs://" + host + "/out/f",
				Checksum: tc.delivered, TransferGrant: "g.3"}
			tmp, _ := url.Parse(transfer.TempURLOf(&d))
			srv.WriteFile(t, tmp.Path, data)
			s := New(Config{Client: transfer.New(srv.Client()).WithGuard(loopback(t))}, nil, slog.New(slog.DiscardHandler))
			res, err := s.finalise(context.Background(), d)
			if tc.wantErr != "" {
				if transfer.KindOf(err) != tc.wantErr {
					t.Fatalf("finalise: %v (%s), want %s", err, transfer.KindOf(err), tc.wantErr)
				}
				if _, err := os.Stat(srv.Path(tmp.Path)); err == nil {
					t.Fatal("the copy that differs is still there")
				}
				return
			}
			if err != nil {
				t.Fatalf("finalise: %v", err)
			}
			if res.ChecksumSource != tc.want {
				t.Fatalf("checksum source %q, want %q", res.ChecksumSource, tc.want)
			}
			if b, err := os.ReadFile(srv.Path("/out/f")); err != nil || !bytes.Equal(b, data) {
				t.Fatalf("the file was not put in place: %v", err)
			}
		})
	}
}

// The source check of a file on a storage that keeps no checksums (the
// real xrootd without xrootd.chksum, which answers a HEAD asking for one
// 405) finds it and its size: the refusal is of the Want-Digest, not of
// the file.
func TestTheSourceCheckFindsAFileOnAStorageWithoutChecksums(t *testing.T) {
	srv := xrootdtest.Start(t, xrootdtest.Options{HTTP: true})
	srv.WriteFile(t, "/in/f", []byte("no checksum kept"))
	s := New(Config{Client: transfer.New(srv.Client()).WithGuard(loopback(t))}, nil, slog.New(slog.DiscardHandler))
	for _, src := range []string{srv.HTTPS + "/in/f", "davs://" + srv.HTTPS[len("https://"):] + "/in/f"} {
		res, err := s.queryReplica(context.Background(), dtr.DTR{ID: uuid.New(), Source: src, Destination: "file:///out/f"})
		if err != nil || res.Size != int64(len("no checksum kept")) {
			t.Fatalf("source check of %s: %+v, %v", src, res, err)
		}
	}
}
