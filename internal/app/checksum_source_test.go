package app

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer/xrootdtest"
)

// TestEveryDTRSaysWhatItsChecksumWasCheckedAgainst runs every role on a
// real JetStream and moves files with expected checksums from and to the
// real xrootd over HTTP: one that keeps no checksums (it refuses requests
// asking for one, 405) and one with xrootd.chksum adler32. Every DTR is
// DONE with its file intact, and its record says whether the storage
// confirmed the checksum (storage) or only the stream's was checked
// (stream).
func TestEveryDTRSaysWhatItsChecksumWasCheckedAgainst(t *testing.T) {
	plain := xrootdtest.Start(t, xrootdtest.Options{HTTP: true})
	summing := xrootdtest.Start(t, xrootdtest.Options{HTTP: true, Checksum: "adler32"})
	data := bytes.Repeat([]byte("a file of the grid "), 5000)
	plain.WriteFile(t, "/in/f", data)
	summing.WriteFile(t, "/in/f", data)
	dir := t.TempDir()
	local := filepath.Join(dir, "local")
	if err := os.WriteFile(local, data, 0o644); err != nil {
		t.Fatal(err)
	}
	want, _ := checksum.File(local, "adler32")

	ns, err := bus.Embedded(filepath.Join(dir, "js"), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	cfg := defaults(t)
	cfg.NATSURL = ns.ClientURL()
	cfg.AllowNetworks = []string{"127.0.0.0/8"}
	cfg.Processor.StageDir = filepath.Join(dir, "stage")
	runRoles(t, cfg, Roles...).healthy(t, nil)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	submit := func(src, dst string) uuid.UUID {
		t.Helper()
		id := uuid.New()
		b, _ := json.Marshal(map[string]any{"id": id.String(), "source": src, "destination": dst,
			"options": map[string]string{"checksum": want}})
		if _, err := js.Publish(context.Background(), api.SubjectSubmit, b); err != nil {
			t.Fatal(err)
		}
		return id
	}
	dav := func(s *xrootdtest.Server) string { return "dav://" + strings.TrimPrefix(s.HTTP, "http://") }
	cases := []struct {
		name   string
		id     uuid.UUID
		stored string // the local path of the file written
		want   string
	}{
		{"a download from xrootd without checksums", submit(plain.HTTP+"/in/f", "file://"+filepath.Join(dir, "a")), filepath.Join(dir, "a"), dtr.ChecksumFromStream},
		{"a download from xrootd with xrootd.chksum", submit(summing.HTTP+"/in/f", "file://"+filepath.Join(dir, "b")), filepath.Join(dir, "b"), dtr.ChecksumFromStorage},
		{"an upload to xrootd without checksums", submit("file://"+local, dav(plain)+"/out/c"), plain.Path("/out/c"), dtr.ChecksumFromStream},
		{"an upload to xrootd with xrootd.chksum", submit("file://"+local, dav(summing)+"/out/d"), summing.Path("/out/d"), dtr.ChecksumFromStorage},
	}
	for _, tc := range cases {
		d := waitFinal(t, nc, tc.id)
		if d.State != dtr.Done {
			t.Errorf("%s: %s (%+v)", tc.name, d.State, d.Error)
			continue
		}
		if d.Checksum != want || d.ChecksumSource != tc.want {
			t.Errorf("%s: checksum %s checked against %q, want %s against %q", tc.name, d.Checksum, d.ChecksumSource, want, tc.want)
		}
		if b, err := os.ReadFile(tc.stored); err != nil || !bytes.Equal(b, data) {
			t.Errorf("%s: the file written differs: %v", tc.name, err)
		}
	}
}
