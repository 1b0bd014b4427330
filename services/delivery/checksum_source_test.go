package delivery

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
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
