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

// TestADTRBetweenTwoRealXrootdServersIsAThirdPartyCopyThroughEveryRole runs
// every role on a real JetStream and moves a file from one real xrootd to
// another over WebDAV (plain http on their HTTPS ports: the roles' client
// cannot be given the test's CA): the destination pulls it into the
// attempt's temporary name, post-processing moves it into place, and the
// DTR's record says it was a third-party pull checked against the storage's
// checksum.
func TestADTRBetweenTwoRealXrootdServersIsAThirdPartyCopyThroughEveryRole(t *testing.T) {
	ca := xrootdtest.NewCA(t)
	src := xrootdtest.Start(t, xrootdtest.Options{TPC: true, CA: ca, Checksum: "adler32"})
	dst := xrootdtest.Start(t, xrootdtest.Options{TPC: true, CA: ca, Checksum: "adler32"})
	data := bytes.Repeat([]byte("storage to storage "), 20000)
	src.WriteFile(t, "/in/f", data)
	dst.MkdirAll(t, "/out")
	h, _ := checksum.New("adler32")
	h.Write(data)
	want := checksum.Format("adler32", h)

	dir := t.TempDir()
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
	dav := func(s *xrootdtest.Server) string { return "dav://" + strings.TrimPrefix(s.HTTP, "http://") }
	id := uuid.New()
	b, _ := json.Marshal(map[string]any{"id": id.String(), "source": dav(src) + "/in/f", "destination": dav(dst) + "/out/f",
		"options": map[string]string{"checksum": want, "tpc": "only"}})
	if _, err := js.Publish(context.Background(), api.SubjectSubmit, b); err != nil {
		t.Fatal(err)
	}
	d := waitFinal(t, nc, id)
	if d.State != dtr.Done {
		t.Fatalf("%s (%+v)", d.State, d.Error)
	}
	if d.TransferMethod != dtr.TransferPull || d.Checksum != want || d.ChecksumSource != dtr.ChecksumFromStorage || d.ChecksumUnverified != "" {
		t.Errorf("transfer %q, checksum %s from %q (unverified %q); want a pull checked against the storage's %s",
			d.TransferMethod, d.Checksum, d.ChecksumSource, d.ChecksumUnverified, want)
	}
	if got, err := os.ReadFile(dst.Path("/out/f")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the destination has %d bytes (%v), want %d", len(got), err, len(data))
	}
	entries, _ := os.ReadDir(dst.Path("/out"))
	if len(entries) != 1 {
		t.Errorf("the destination directory holds %d entries, want the file alone", len(entries))
	}
}
