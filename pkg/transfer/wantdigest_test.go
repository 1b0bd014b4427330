package transfer_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// wantDigest is what Sluice asks storages for.
const wantDigest = "adler32, md5;q=0.5, sha-256;q=0.4"

func TestAStorageThatRefusesWantDigestIsAskedAgainWithoutItAndRemembered(t *testing.T) {
	// As xrootd 5.5 over HTTP without xrootd.chksum: 405 for a file, 500
	// for a missing one.
	st, srv := newStore(t)
	st.refuseWantDigest = func(exists bool) int {
		if exists {
			return http.StatusMethodNotAllowed
		}
		return http.StatusInternalServerError
	}
	data := []byte("a storage that keeps no checksums")
	writeFile(t, filepath.Join(st.dir, "f"), data)
	c := transfer.New(nil).WithGuard(loopback)
	ctx := context.Background()

	// A 500 for a missing file is asked again, and is really a 404; it
	// is not remembered, as a storage may fail a checksum for one file.
	if info, err := c.Stat(ctx, srv.URL+"/missing"); err != nil || info.Exists {
		t.Fatalf("stat of a missing file: %+v, %v", info, err)
	}
	if got := st.takeWantDigests(); !slices.Equal(got, []string{wantDigest, ""}) {
		t.Fatalf("a missing file was asked with Want-Digest %q, want once with, once without", got)
	}
	info, err := c.Stat(ctx, srv.URL+"/f")
	if err != nil || !info.Exists || info.Size != int64(len(data)) || info.Checksum != "" {
		t.Fatalf("stat: %+v, %v", info, err)
	}
	if got := st.takeWantDigests(); !slices.Equal(got, []string{wantDigest, ""}) {
		t.Fatalf("the first stat sent Want-Digest %q, want once with, once without", got)
	}
	// Remembered: one request without it, by every copy of the Client.
	res, err := c.WithTokens(nil).Copy(ctx, srv.URL+"/f", fileURL(filepath.Join(t.TempDir(), "back")), transfer.CopyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := checksum.File(filepath.Join(st.dir, "f"), "adler32")
	if res.SourceChecksum != "" || res.Checksums["adler32"] != want {
		t.Fatalf("copy: the storage's checksum %q, the stream's %q; want none and %s", res.SourceChecksum, res.Checksums["adler32"], want)
	}
	if got := st.takeWantDigests(); !slices.Equal(got, []string{""}) {
		t.Fatalf("after the refusal the GET sent Want-Digest %q, want none", got)
	}
	// Another Client has not met the storage yet.
	if _, err := transfer.New(nil).WithGuard(loopback).Stat(ctx, srv.URL+"/f"); err != nil {
		t.Fatal(err)
	}
	if got := st.takeWantDigests(); len(got) != 2 {
		t.Fatalf("a new Client sent %q, want a refused request and its retry", got)
	}
}

func TestARefusalThatIsNotAboutWantDigestStandsAndIsNotRemembered(t *testing.T) {
	// 405 with or without Want-Digest: the refusal is the answer.
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Want-Digest"))
		mu.Unlock()
		http.Error(w, "no", http.StatusMethodNotAllowed)
	}))
	t.Cleanup(srv.Close)
	c := transfer.New(nil).WithGuard(loopback)
	for range 2 {
		_, err := c.Stat(context.Background(), srv.URL+"/f")
		if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), "405") {
			t.Fatalf("stat: %v (%s), want the 405, PERMANENT_REMOTE", err, transfer.KindOf(err))
		}
		mu.Lock()
		got := seen
		seen = nil
		mu.Unlock()
		if !slices.Equal(got, []string{wantDigest, ""}) {
			t.Fatalf("sent Want-Digest %q, want once with and once without each time", got)
		}
	}
}
