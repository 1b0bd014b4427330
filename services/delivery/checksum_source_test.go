package delivery

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
	"github.com/sluice-dtr/sluice/pkg/transfer/xrootdtest"
)

// A download from the real xrootd over HTTPS: with xrootd.chksum
// configured the storage states the file's adler32, which the stream is
// checked against; without, it refuses to (405 to Want-Digest) and the
// stream's own checksum is all there is. The result says which.
func TestADeliverySaysWhetherTheStorageConfirmedTheChecksum(t *testing.T) {
	data := bytes.Repeat([]byte("grid data "), 20000)
	for _, tc := range []struct {
		name, chksum, want string
	}{
		{"xrootd with xrootd.chksum adler32", "adler32", dtr.ChecksumFromStorage},
		{"xrootd without checksums", "", dtr.ChecksumFromStream},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := xrootdtest.Start(t, xrootdtest.Options{HTTP: true, Checksum: tc.chksum})
			srv.WriteFile(t, "/in/f", data)
			want, _ := checksum.File(srv.Path("/in/f"), "adler32")
			d := dtr.DTR{ID: uuid.New(), Source: srv.HTTPS + "/in/f", Destination: "file://" + filepath.Join(t.TempDir(), "f"),
				Size: int64(len(data)), Options: dtr.Options{Checksum: want}, TransferGrant: "g.2"}
			s := New(Config{Client: transfer.New(srv.Client()).WithGuard(loopback(t))}, nil, slog.New(slog.DiscardHandler))
			res := s.Handle(context.Background(), api.Grant{ID: "g.2", DTR: &d}, func(int64, int64) {})
			if res.Error != nil {
				t.Fatalf("delivery failed: %+v", res.Error)
			}
			if res.Checksum != want || res.ChecksumSource != tc.want {
				t.Fatalf("checksum %s checked against %q, want %s against %q", res.Checksum, res.ChecksumSource, want, tc.want)
			}
		})
	}
}

// The checksum a delivery computes: the job's expected type, else the
// site's (SLUICE_DELIVERY_CHECKSUM), else, with none, nothing, and the
// result then claims no check.
func TestADeliveryComputesTheExpectedChecksumElseTheSitesElseNone(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	data := bytes.Repeat([]byte("kernel "), 100_000)
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	md5sum, _ := checksum.File(src, "md5")
	adler, _ := checksum.File(src, "adler32")
	sha, _ := checksum.File(src, "sha256")
	for i, tc := range []struct {
		name, site, expected string
		want, wantSource     string
	}{
		{"the default, adler32", "", "", adler, dtr.ChecksumFromStream},
		{"the site's sha256", "sha256", "", sha, dtr.ChecksumFromStream},
		{"the site's sha256 in upper case", "SHA256", "", sha, dtr.ChecksumFromStream},
		{"none", NoChecksum, "", "", ""},
		{"none, but the job expects md5", NoChecksum, md5sum, md5sum, dtr.ChecksumFromStream},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := dtr.DTR{ID: uuid.New(), Source: "file://" + src, Destination: "file://" + filepath.Join(dir, fmt.Sprint(i)),
				Size: int64(len(data)), Options: dtr.Options{Checksum: tc.expected}, TransferGrant: "g.1"}
			s := New(Config{Checksum: tc.site}, nil, slog.New(slog.DiscardHandler))
			res := s.Handle(context.Background(), api.Grant{ID: "g.1", DTR: &d}, func(int64, int64) {})
			if res.Error != nil {
				t.Fatalf("delivery failed: %+v", res.Error)
			}
			if res.Checksum != tc.want || res.ChecksumSource != tc.wantSource {
				t.Fatalf("checksum %q checked against %q, want %q against %q", res.Checksum, res.ChecksumSource, tc.want, tc.wantSource)
			}
			if b, err := os.ReadFile(strings.TrimPrefix(transfer.TempURLOf(&d), "file://")); err != nil || !bytes.Equal(b, data) {
				t.Fatalf("the copy differs: %v", err)
			}
		})
	}
}
