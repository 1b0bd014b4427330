package transfer_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

func TestRedirectLoopsAndRedirectsToAnotherSchemeFailForGood(t *testing.T) {
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("plain"))
	}))
	t.Cleanup(plain.Close)
	redirects := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch p := r.URL.Path; {
		case p == "/a":
			http.Redirect(w, r, "/b", http.StatusFound)
		case p == "/b":
			http.Redirect(w, r, "/a", http.StatusFound)
		case p == "/self":
			http.Redirect(w, r, "/self", http.StatusMovedPermanently)
		case strings.HasPrefix(p, "/n/"): // /n/1 → /n/2 → ... for ever
			n, _ := strconv.Atoi(strings.TrimPrefix(p, "/n/"))
			http.Redirect(w, r, fmt.Sprintf("/n/%d", n+1), http.StatusTemporaryRedirect)
		case p == "/to-plain":
			http.Redirect(w, r, plain.URL+"/f", http.StatusFound)
		case p == "/to-file":
			w.Header().Set("Location", "file:///etc/passwd")
			w.WriteHeader(http.StatusFound)
		case p == "/to-ftp":
			w.Header().Set("Location", "ftp://ftp.example.org/f")
			w.WriteHeader(http.StatusFound)
		case p == "/f":
			w.Write([]byte("redirected"))
		}
	})
	secure := httptest.NewTLSServer(redirects)
	t.Cleanup(secure.Close)
	insecure := httptest.NewServer(redirects)
	t.Cleanup(insecure.Close)
	// The plain server sends this one on to the TLS server: an upgrade.
	upgrade := httptest.NewServer(http.RedirectHandler(secure.URL+"/f", http.StatusFound))
	t.Cleanup(upgrade.Close)

	tests := []struct {
		name, url string
		want      string // "" is success
	}{
		{"a loop", insecure.URL + "/a", "redirect loop: " + insecure.URL + "/a → " + insecure.URL + "/b → " + insecure.URL + "/a"},
		{"a loop to itself", insecure.URL + "/self", "redirect loop: " + insecure.URL + "/self → " + insecure.URL + "/self"},
		{"too many", insecure.URL + "/n/0", "too many redirects: stopped after 10 (" + insecure.URL + "/n/0 → "},
		{"https to http", secure.URL + "/to-plain", "redirect from https to http refused: " + secure.URL + "/to-plain → " + plain.URL + "/f"},
		{"http to file", insecure.URL + "/to-file", "redirect from http to file refused"},
		{"https to file", secure.URL + "/to-file", "redirect from https to file refused"},
		{"http to ftp", insecure.URL + "/to-ftp", "redirect from http to ftp refused"},
		{"http to https is followed", upgrade.URL + "/f", ""},
		{"the same scheme is followed", secure.URL + "/f", ""},
	}
	// secure.Client() trusts the TLS server and has no CheckRedirect of
	// its own: New gives it Sluice's.
	c := transfer.New(secure.Client()).WithGuard(loopback)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "f")
			_, copyErr := c.Copy(context.Background(), tt.url, fileURL(dst), transfer.CopyOptions{})
			_, statErr := c.Stat(context.Background(), tt.url)
			for op, err := range map[string]error{"copy": copyErr, "stat": statErr} {
				if tt.want == "" {
					if err != nil {
						t.Errorf("%s: %v", op, err)
					}
					continue
				}
				// Not retried: the server answers the same next time.
				if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("%s: %v (%s); want PERMANENT_REMOTE saying %q", op, err, transfer.KindOf(err), tt.want)
				}
			}
			if tt.want != "" {
				checkAbsent(t, dst)
			}
		})
	}
}
