package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/httpstore"
	"github.com/sluice-dtr/sluice/pkg/job"
)

func TestAJobBetweenHTTPStoragesIsCopiedStorageToStorageAndItsDTRsSaySo(t *testing.T) {
	s := start(t, testConfig())
	dirs := map[string]string{}
	store := func(name string, copyOpts *httpstore.CopyOptions) string {
		dirs[name] = filepath.Join(s.dir, name)
		os.MkdirAll(dirs[name], 0o755)
		return httpServer(t, httpstore.New(dirs[name], httpstore.Options{Digest: true, Copy: copyOpts}))
	}
	src := store("src", &httpstore.CopyOptions{})
	copying := store("copying", &httpstore.CopyOptions{})
	refusing := store("refusing", &httpstore.CopyOptions{Refuse: httpstore.RefuseStatus})
	files := []struct {
		name, dst string
		tpc       dtr.TPCMode
		method    string
	}{
		{"pulled", copying, "", dtr.TransferPull},
		{"pushed", refusing, dtr.TPCAuto, dtr.TransferPush},
		{"streamed", copying, dtr.TPCNever, dtr.TransferStreamed},
	}
	j := &job.Job{}
	data := map[string][]byte{}
	for i, f := range files {
		p := filepath.Join(dirs["src"], f.name)
		writeFile(t, p, 200000+i, i)
		data[f.name], _ = os.ReadFile(p)
		sum, _ := checksum.File(p, "adler32")
		j.Outputs = append(j.Outputs, job.File{Source: src + "/" + f.name, Destination: f.dst + "/out/" + f.name, Checksum: sum, TPC: f.tpc})
	}
	ev := s.wait(s.submit(j).JobID, time.Minute)
	if ev.State != api.JobFinished || ev.Done != len(files) {
		t.Fatalf("job %s with %d done: %v", ev.State, ev.Done, ev.Failures)
	}
	for _, line := range ev.Files {
		name := filepath.Base(line.Destination)
		var want string
		for _, f := range files {
			if f.name == name {
				want = f.method
			}
		}
		d, _, ok := s.dtrRecord(line.DTR)
		if !ok || d.TransferMethod != want || d.ChecksumUnverified != "" || !strings.HasPrefix(d.Checksum, "adler32:") {
			t.Errorf("%s: transfer %q, checksum %q, unverified %q; want %q, verified", name, d.TransferMethod, d.Checksum, d.ChecksumUnverified, want)
		}
		dir := dirs["copying"]
		if name == "pushed" {
			dir = dirs["refusing"]
		}
		if got, _ := os.ReadFile(filepath.Join(dir, "out", name)); !bytes.Equal(got, data[name]) {
			t.Errorf("%s: the destination does not hold the source's bytes", name)
		}
	}
}
