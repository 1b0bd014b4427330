package transfer_test

import (
	"crypto/md5"
	"encoding/base64"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// loopback lets the tests reach their servers, all on loopback, which a
// Client's default Guard refuses.
var loopback = mustGuard("127.0.0.0/8", "::1")

func mustGuard(allow ...string) *transfer.Guard {
	g, err := transfer.NewGuard(allow...)
	if err != nil {
		panic(err)
	}
	return g
}

// store is a small HTTP storage server over a directory: GET and HEAD
// serve files, PUT writes them (straight to the final name, as a naive
// server would, so a broken upload leaves a partial file), DELETE removes
// them.
type store struct {
	dir string
	// digest makes GET and HEAD answer with a Digest header.
	digest bool
	// refuseWantDigest, if set, is the status of a GET or HEAD carrying
	// Want-Digest, as a storage without checksums answers it (xrootd:
	// 405 for a file, 500 for a missing one).
	refuseWantDigest func(exists bool) int
	// wantDigests are the Want-Digest headers of the GETs and HEADs seen.
	wantDigests []string

	mu         sync.Mutex
	putLengths map[string]int64 // Content-Length of each PUT, -1 if chunked
}

// newStore starts a store over a fresh temporary directory.
func newStore(t *testing.T) (*store, *httptest.Server) {
	t.Helper()
	s := &store{dir: t.TempDir(), putLengths: map[string]int64{}}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv
}

func (s *store) path(r *http.Request) string {
	return filepath.Join(s.dir, filepath.FromSlash(path.Clean("/"+r.URL.Path)))
}

func (s *store) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := s.path(r)
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		s.mu.Lock()
		s.wantDigests = append(s.wantDigests, r.Header.Get("Want-Digest"))
		s.mu.Unlock()
		if s.refuseWantDigest != nil && r.Header.Get("Want-Digest") != "" {
			_, err := os.Stat(p)
			code := s.refuseWantDigest(err == nil)
			http.Error(w, "Failed to determine checksum", code)
			return
		}
		f, err := os.Open(p)
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil || fi.IsDir() {
			http.Error(w, "not a file", http.StatusNotFound)
			return
		}
		if s.digest {
			a, _ := checksum.File(p, "adler32")
			h := md5.New()
			io.Copy(h, f)
			f.Seek(0, io.SeekStart)
			w.Header().Set("Digest", "adler32="+a[len("adler32:"):]+",md5="+base64.StdEncoding.EncodeToString(h.Sum(nil)))
		}
		http.ServeContent(w, r, "", fi.ModTime(), f)
	case http.MethodPut:
		s.mu.Lock()
		s.putLengths[r.URL.Path] = r.ContentLength
		s.mu.Unlock()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		f, err := os.Create(p)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, err = io.Copy(f, r.Body)
		f.Close()
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusCreated)
	case http.MethodDelete:
		err := os.Remove(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			http.Error(w, "no such file", http.StatusNotFound)
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	default:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

// takeWantDigests returns the Want-Digest headers seen since the last call.
func (s *store) takeWantDigests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.wantDigests
	s.wantDigests = nil
	return w
}

// putLength is the Content-Length the store saw on the PUT of urlPath.
func (s *store) putLength(urlPath string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.putLengths[urlPath]
	return n, ok
}

// statusServer answers every request with code.
func statusServer(t *testing.T, code int) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, http.StatusText(code), code)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// droppingServer declares size bytes, sends half of them and then drops
// the connection.
func droppingServer(t *testing.T, size int) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(size))
		w.WriteHeader(http.StatusOK)
		w.Write(make([]byte, size/2))
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // closes the connection mid-body
	}))
	t.Cleanup(srv.Close)
	return srv
}

// stallingServer sends some of a large body, closes sent and then stalls
// until the client goes away.
func stallingServer(t *testing.T) (srv *httptest.Server, sent <-chan struct{}) {
	t.Helper()
	ch := make(chan struct{})
	var once sync.Once
	release := make(chan struct{})
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(1<<30))
		w.WriteHeader(http.StatusOK)
		w.Write(make([]byte, 256<<10))
		http.NewResponseController(w).Flush()
		once.Do(func() { close(ch) })
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs before srv.Close
	return srv, ch
}

// refusedURL returns a URL on a port nothing listens on any more.
func refusedURL(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.NotFoundHandler())
	u := srv.URL
	srv.Close()
	return u
}

// redirectingServer answers PUT and DELETE on any path with a code
// redirect to /target, which GET serves.
func redirectingServer(t *testing.T, code int) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/target" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			w.Write([]byte("existing"))
			return
		}
		http.Redirect(w, r, "/target", code)
	}))
	t.Cleanup(srv.Close)
	return srv
}
