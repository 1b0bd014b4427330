// Package httpstore is a small HTTP storage server over a directory: GET and
// HEAD serve files, PUT stores them (creating parent directories), DELETE
// removes them, and with Options it answers Want-Digest and makes HTTP
// third-party copies (COPY, copy.go). The demo and the tests use it as a
// real remote endpoint.
package httpstore

import (
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/sluice-dtr/sluice/pkg/checksum"
)

// Options are what a store does beyond GET, HEAD, PUT and DELETE.
type Options struct {
	// Digest makes GET and HEAD answer a Want-Digest that names adler32
	// with the file's adler32 in a Digest header.
	Digest bool
	// Copy, if set, makes the store answer COPY (copy.go).
	Copy *CopyOptions
}

// Handler serves dir.
func Handler(dir string) http.Handler { return New(dir, Options{}) }

// New serves dir with opt.
func New(dir string, opt Options) http.Handler {
	files := http.FileServer(http.Dir(dir))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		clean := path.Clean("/" + r.URL.Path)
		if strings.Contains(r.URL.Path, "..") {
			http.Error(w, "bad path", http.StatusBadRequest)
			return
		}
		p := filepath.Join(dir, filepath.FromSlash(clean))
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			if st, err := os.Stat(p); err != nil || st.IsDir() {
				http.NotFound(w, r)
				return
			}
			if opt.Digest && strings.Contains(strings.ToLower(r.Header.Get("Want-Digest")), "adler32") {
				if sum, err := checksum.File(p, "adler32"); err == nil {
					w.Header().Set("Digest", "adler32="+strings.TrimPrefix(sum, "adler32:"))
				}
			}
			files.ServeHTTP(w, r)
		case http.MethodPut:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			tmp := p + ".upload"
			f, err := os.Create(tmp)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			_, err = io.Copy(f, r.Body)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err == nil {
				err = os.Rename(tmp, p)
			}
			if err != nil {
				os.Remove(tmp)
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		case http.MethodDelete:
			if err := os.Remove(p); err != nil {
				if os.IsNotExist(err) {
					http.NotFound(w, r)
					return
				}
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		case "COPY":
			if opt.Copy == nil {
				w.Header().Set("Allow", "GET, HEAD, PUT, DELETE")
				http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
				return
			}
			opt.Copy.serve(w, r, p)
		default:
			w.Header().Set("Allow", "GET, HEAD, PUT, DELETE")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		}
	})
}
