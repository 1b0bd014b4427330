package transfer_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

func TestStatHTTPStatuses(t *testing.T) {
	st, srv := newStore(t)
	writeFile(t, filepath.Join(st.dir, "data/f"), []byte("0123456789"))
	tests := []struct {
		name     string
		url      string
		want     transfer.Info
		wantKind dtr.ErrorKind
	}{
		{"existing object gives its size", srv.URL + "/data/f", transfer.Info{Exists: true, Size: 10}, ""},
		{"404 means missing", srv.URL + "/data/missing", transfer.Info{Size: -1}, ""},
		{"redirect is followed", redirectingServer(t, 302).URL + "/f", transfer.Info{Exists: true, Size: 8}, ""},
		{"410 means missing", statusServer(t, 410).URL + "/f", transfer.Info{Size: -1}, ""},
		{"503 is temporary", statusServer(t, 503).URL + "/f", transfer.Info{Size: -1}, dtr.ErrTemporaryRemote},
		{"500 is temporary", statusServer(t, 500).URL + "/f", transfer.Info{Size: -1}, dtr.ErrTemporaryRemote},
		{"429 is temporary", statusServer(t, 429).URL + "/f", transfer.Info{Size: -1}, dtr.ErrTemporaryRemote},
		{"403 is permanent", statusServer(t, 403).URL + "/f", transfer.Info{Size: -1}, dtr.ErrPermanentRemote},
		{"refused connection is temporary", refusedURL(t) + "/f", transfer.Info{Size: -1}, dtr.ErrTemporaryRemote},
	}
	c := transfer.New(nil).WithGuard(loopback)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := c.Stat(context.Background(), tt.url)
			checkKind(t, err, tt.wantKind)
			if got != tt.want {
				t.Errorf("Stat = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestStatHTTPParsesDigestHeader(t *testing.T) {
	const (
		md5abc    = "md5:900150983cd24fb0d6963f7d28e17f72"
		sha256abc = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	)
	tests := []struct {
		name   string
		digest []string
		want   string
	}{
		{"no header", nil, ""},
		{"adler32 hex", []string{"adler32=11e60398"}, "adler32:11e60398"},
		{"adler32 without leading zeros is padded", []string{"ADLER32=3DA0195"}, "adler32:03da0195"},
		{"md5 base64", []string{"md5=kAFQmDzST7DWlj99KOF/cg=="}, md5abc},
		{"md5 hex tolerated", []string{"MD5=900150983CD24FB0D6963F7D28E17F72"}, md5abc},
		{"sha-256 base64", []string{"SHA-256=ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0="}, sha256abc},
		{"adler32 preferred over others", []string{"sha-256=ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0=, adler32=11e60398"}, "adler32:11e60398"},
		{"md5 preferred over sha-256 across header lines", []string{"sha-256=ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0=", "md5=kAFQmDzST7DWlj99KOF/cg=="}, md5abc},
		{"unknown algorithm ignored", []string{"UNIXsum=12345"}, ""},
		{"malformed values ignored", []string{"adler32=xyz, md5=notbase64!, sha-256=YWJj"}, ""},
	}
	var mu sync.Mutex
	var digest []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Want-Digest") == "" {
			t.Error("request has no Want-Digest header")
		}
		mu.Lock()
		for _, d := range digest {
			w.Header().Add("Digest", d)
		}
		mu.Unlock()
		w.Header().Set("Content-Length", "3")
	}))
	defer srv.Close()
	c := transfer.New(nil).WithGuard(loopback)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mu.Lock()
			digest = tt.digest
			mu.Unlock()
			got, err := c.Stat(context.Background(), srv.URL+"/abc")
			if err != nil {
				t.Fatal(err)
			}
			if got.Checksum != tt.want || !got.Exists || got.Size != 3 {
				t.Errorf("Stat = %+v, want checksum %q, exists, size 3", got, tt.want)
			}
		})
	}
}

func TestDeleteHTTP(t *testing.T) {
	st, srv := newStore(t)
	writeFile(t, filepath.Join(st.dir, "f"), []byte("x"))
	tests := []struct {
		name     string
		url      string
		wantKind dtr.ErrorKind
	}{
		{"existing object is removed", srv.URL + "/f", ""},
		{"missing object (404) is fine", srv.URL + "/missing", ""},
		{"500 is temporary", statusServer(t, 500).URL + "/f", dtr.ErrTemporaryRemote},
		{"403 is permanent", statusServer(t, 403).URL + "/f", dtr.ErrPermanentRemote},
		{"302 is not taken for success", redirectingServer(t, 302).URL + "/f", dtr.ErrPermanentRemote},
	}
	c := transfer.New(nil).WithGuard(loopback)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkKind(t, c.Delete(context.Background(), tt.url), tt.wantKind)
		})
	}
	checkAbsent(t, filepath.Join(st.dir, "f"))
}
