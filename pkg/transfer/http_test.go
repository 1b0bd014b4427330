package transfer_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
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

// A storage that refuses Expect: 100-continue (417) fails the upload of a
// source of unknown size as temporary, and the next attempt sends the
// body without waiting: the source is read once, so one attempt cannot
// send it again.
func TestAnUploadRefusedForItsExpectationIsRetriedWithoutIt(t *testing.T) {
	var mu sync.Mutex
	var stored []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			return
		}
		if r.Header.Get("Expect") != "" {
			w.WriteHeader(http.StatusExpectationFailed)
			return
		}
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		stored = b
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	c := transfer.New(nil).WithGuard(loopback)
	src, _ := closeDelimitedServer(t, sized(1000))
	_, err := c.Copy(context.Background(), src+"/f", srv.URL+"/dst", transfer.CopyOptions{})
	if transfer.KindOf(err) != dtr.ErrTemporaryRemote || !strings.Contains(err.Error(), "Expect: 100-continue") {
		t.Fatalf("first attempt: %v (%s), want a temporary failure naming the expectation", err, transfer.KindOf(err))
	}
	src, _ = closeDelimitedServer(t, sized(1000))
	if res, err := c.Copy(context.Background(), src+"/f", srv.URL+"/dst", transfer.CopyOptions{}); err != nil || res.Bytes != 1000 {
		t.Fatalf("next attempt: %+v, %v", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(stored) != 1000 {
		t.Fatalf("stored %d bytes, want 1000", len(stored))
	}
}

// Behind a redirector, the request asked again without Want-Digest may
// reach another pool: the pool that refused is remembered only if it is
// the one that then answered, so one pool's refusal does not stop the
// checksums of another.
func TestAWantDigestRefusalIsRememberedOnlyForTheHostThatAnsweredWithoutIt(t *testing.T) {
	var mu sync.Mutex
	asked := map[string]int{} // pool → requests that carried Want-Digest
	pool := func(name string, refuses bool) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Want-Digest") != "" {
				mu.Lock()
				asked[name]++
				mu.Unlock()
				if refuses {
					w.WriteHeader(http.StatusMethodNotAllowed)
					return
				}
			}
			w.Header().Set("Content-Length", "3")
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	a, b := pool("a", true), pool("b", false)
	var n int
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		to := []string{a.URL, b.URL}[n%2]
		n++
		mu.Unlock()
		http.Redirect(w, r, to+r.URL.Path, http.StatusFound)
	}))
	t.Cleanup(redirector.Close)
	c := transfer.New(nil).WithGuard(loopback)
	if info, err := c.Stat(context.Background(), redirector.URL+"/f"); err != nil || !info.Exists {
		t.Fatalf("stat through the redirector: %+v, %v", info, err)
	}
	// Pool a refused, pool b answered the retry: a is asked again, with
	// Want-Digest, when reached directly.
	if _, err := c.Stat(context.Background(), a.URL+"/f"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if asked["a"] != 2 {
		t.Fatalf("pool a was asked with Want-Digest %d times, want 2: it was remembered for pool b's answer", asked["a"])
	}
}
