// Package httpstore is a small HTTP storage server over a directory: GET and
// HEAD serve files, PUT stores them (creating parent directories), DELETE
// removes them. The demo and the tests use it as a real remote endpoint.
package httpstore

import (
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Handler serves dir.
func Handler(dir string) http.Handler {
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
		default:
			w.Header().Set("Allow", "GET, HEAD, PUT, DELETE")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		}
	})
}
