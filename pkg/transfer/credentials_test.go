package transfer_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// hops is a set of servers on loopback that record the Authorization of
// every request they get: a and b over TLS on two ports of one host, c and
// d over plain http.
type hops struct {
	a, b, c, d *httptest.Server
	mu         sync.Mutex
	seen       []string // "server path authorization"
}

func newHops(t *testing.T) *hops {
	h := &hops{}
	handler := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			h.mu.Lock()
			h.seen = append(h.seen, strings.TrimSpace(name+" "+r.URL.Path+" "+r.Header.Get("Authorization")))
			h.mu.Unlock()
			io.Copy(io.Discard, r.Body)
			to := map[string]string{
				"/self":    "/f",
				"/to-b":    h.b.URL + "/f",
				"/to-c":    h.c.URL + "/f",
				"/upgrade": h.a.URL + "/f",
			}[r.URL.Path]
			if to != "" {
				http.Redirect(w, r, to, http.StatusTemporaryRedirect)
				return
			}
			if r.Method == http.MethodPut {
				w.WriteHeader(http.StatusCreated)
				return
			}
			io.WriteString(w, "data")
		}
	}
	h.a = httptest.NewTLSServer(handler("a"))
	h.b = httptest.NewTLSServer(handler("b"))
	h.c = httptest.NewServer(handler("c"))
	h.d = httptest.NewServer(handler("d"))
	for _, s := range []*httptest.Server{h.a, h.b, h.c, h.d} {
		t.Cleanup(s.Close)
	}
	return h
}

// take returns what the servers have seen since the last call.
func (h *hops) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := h.seen
	h.seen = nil
	return seen
}

// client trusts the TLS servers (httptest's one certificate) and reaches
// loopback.
func (h *hops) client() *transfer.Client {
	return transfer.New(h.a.Client()).WithGuard(loopback)
}

func hostOf(s *httptest.Server) string { u, _ := url.Parse(s.URL); return u.Host }

func tokenFile(t *testing.T, token string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestABearerTokenGoesOnlyToTheSchemeHostAndPortItIsConfiguredFor(t *testing.T) {
	h := newHops(t)
	tok := tokenFile(t, "token-of-a")
	tests := []struct {
		name   string
		tokens map[string]string
		url    string
		seen   []string
		err    string
	}{
		{"the host and port it is for", map[string]string{hostOf(h.a): tok}, h.a.URL + "/f",
			[]string{"a /f Bearer token-of-a"}, ""},
		{"a redirect within its origin keeps it", map[string]string{hostOf(h.a): tok}, h.a.URL + "/self",
			[]string{"a /self Bearer token-of-a", "a /f Bearer token-of-a"}, ""},
		{"a redirect to another port of the host drops it", map[string]string{hostOf(h.a): tok}, h.a.URL + "/to-b",
			[]string{"a /to-b Bearer token-of-a", "b /f"}, ""},
		{"a redirect from https to http is refused and reaches nothing", map[string]string{hostOf(h.a): tok}, h.a.URL + "/to-c",
			[]string{"a /to-c Bearer token-of-a"}, "redirect from https to http refused"},
		{"an upgrade from http to https gets it at the https hop", map[string]string{hostOf(h.a): tok}, h.c.URL + "/upgrade",
			[]string{"c /upgrade", "a /f Bearer token-of-a"}, ""},
		{"a host alone is port 443", map[string]string{"127.0.0.1": tok}, h.a.URL + "/f",
			[]string{"a /f"}, ""},
		{"a host alone is port 443 also written out", map[string]string{"127.0.0.1:443": tok}, h.a.URL + "/f",
			[]string{"a /f"}, ""},
	}
	ctx := context.Background()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := h.client().WithTokens(tt.tokens)
			h.take()
			_, err := c.Copy(ctx, tt.url, fileURL(filepath.Join(t.TempDir(), "f")), transfer.CopyOptions{})
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("copy: %v", err)
			case tt.err != "" && (transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("copy: %v (%s), want PERMANENT_REMOTE saying %q", err, transfer.KindOf(err), tt.err)
			}
			if seen := h.take(); !slices.Equal(seen, tt.seen) {
				t.Fatalf("the servers saw %q, want %q", seen, tt.seen)
			}
		})
	}
}

func TestABearerTokenIsNeverSentOverPlainHTTP(t *testing.T) {
	h := newHops(t)
	const secret = "token-of-c"
	c := h.client().WithTokens(map[string]string{hostOf(h.c): tokenFile(t, secret)})
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, src, []byte("data"))
	want := "request to http://" + hostOf(h.c) + " refused: SLUICE_HTTP_TOKENS has a bearer token for " + hostOf(h.c) + ", which is sent over https only (use https:// or davs://)"
	h.take()
	for op, do := range map[string]func(u string) error{
		"stat": func(u string) error { _, err := c.Stat(ctx, u); return err },
		"download": func(u string) error {
			_, err := c.Copy(ctx, u, fileURL(filepath.Join(t.TempDir(), "f")), transfer.CopyOptions{})
			return err
		},
		"upload": func(u string) error { _, err := c.Copy(ctx, fileURL(src), u, transfer.CopyOptions{}); return err },
		"delete": func(u string) error { return c.Delete(ctx, u) },
		"mkdir":  func(u string) error { return c.MakeParents(ctx, u) },
	} {
		for _, u := range []string{h.c.URL + "/dir/f", strings.Replace(h.c.URL, "http://", "dav://", 1) + "/dir/f"} {
			err := do(u)
			if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), secret) {
				t.Errorf("%s %s: %v (%s), want PERMANENT_REMOTE saying %q", op, u, err, transfer.KindOf(err), want)
			}
		}
	}
	// A redirect from another plain server to it is refused at that hop.
	redirect := httptest.NewServer(http.RedirectHandler(h.c.URL+"/f", http.StatusFound))
	t.Cleanup(redirect.Close)
	if _, err := c.Stat(ctx, redirect.URL+"/f"); transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), want) {
		t.Errorf("a redirect to it: %v (%s), want PERMANENT_REMOTE saying %q", err, transfer.KindOf(err), want)
	}
	if seen := h.take(); len(seen) != 0 {
		t.Fatalf("the plain http server got %q", seen)
	}
	// Another port of that host is not what the token is for: no token, no refusal.
	if _, err := c.Stat(ctx, h.d.URL+"/f"); err != nil {
		t.Fatalf("another port: %v", err)
	}
	if seen := h.take(); !slices.Equal(seen, []string{"d /f"}) {
		t.Fatalf("the other port saw %q", seen)
	}
}

func TestATokenSourceIsAskedAtEveryHTTPSHopForThatHop(t *testing.T) {
	h := newHops(t)
	var mu sync.Mutex
	var asked []string
	source := func(_ context.Context, u *url.URL, access transfer.Access) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, transfer.Audience(u)+" "+string(access)+":"+u.Path)
		if u.Path == "/fails" {
			return "", errors.New("token service down")
		}
		if u.Path == "/refused" {
			return "", transfer.TokenRefused(errors.New("scope refused"))
		}
		return "for-" + transfer.Audience(u), nil
	}
	take := func() []string {
		mu.Lock()
		defer mu.Unlock()
		a := asked
		asked = nil
		return a
	}
	ctx := context.Background()
	audA, audB := "https://"+hostOf(h.a), "https://"+hostOf(h.b)
	c := h.client().WithTokenSource(source)
	h.take()

	if _, err := c.Copy(ctx, h.a.URL+"/to-b", fileURL(filepath.Join(t.TempDir(), "f")), transfer.CopyOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, want := take(), []string{audA + " storage.read:/to-b", audB + " storage.read:/f"}; !slices.Equal(got, want) {
		t.Errorf("asked %q, want %q", got, want)
	}
	if got, want := h.take(), []string{"a /to-b Bearer for-" + audA, "b /f Bearer for-" + audB}; !slices.Equal(got, want) {
		t.Errorf("the servers saw %q, want %q", got, want)
	}

	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, src, []byte("data"))
	if _, err := c.Copy(ctx, fileURL(src), h.a.URL+"/up", transfer.CopyOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, want := take(), []string{audA + " storage.create:/up"}; !slices.Equal(got, want) {
		t.Errorf("an upload asked %q, want %q", got, want)
	}
	h.take()

	// Plain http: not asked, nothing sent.
	if _, err := c.Stat(ctx, h.c.URL+"/f"); err != nil {
		t.Fatal(err)
	}
	if got, seen := take(), h.take(); len(got) != 0 || !slices.Equal(seen, []string{"c /f"}) {
		t.Errorf("plain http: asked %q, the server saw %q", got, seen)
	}

	// A token of SLUICE_HTTP_TOKENS comes first; the source has the rest.
	c2 := c.WithTokens(map[string]string{hostOf(h.a): tokenFile(t, "static")})
	if _, err := c2.Stat(ctx, h.a.URL+"/to-b"); err != nil {
		t.Fatal(err)
	}
	if got, seen := take(), h.take(); !slices.Equal(got, []string{audB + " storage.read:/f"}) ||
		!slices.Equal(seen, []string{"a /to-b Bearer static", "b /f Bearer for-" + audB}) {
		t.Errorf("with a static token: asked %q, the servers saw %q", got, seen)
	}

	// A source that fails may succeed next time: retried.
	_, err := c.Stat(ctx, h.a.URL+"/fails")
	if transfer.KindOf(err) != dtr.ErrTemporaryRemote || !strings.Contains(err.Error(), "token service down") {
		t.Errorf("a failing source: %v (%s), want TEMPORARY_REMOTE", err, transfer.KindOf(err))
	}
	// One that refuses for good is final, as an unreadable token file.
	_, err = c.Stat(ctx, h.a.URL+"/refused")
	if transfer.KindOf(err) != dtr.ErrLocalFile || !strings.Contains(err.Error(), "scope refused") {
		t.Errorf("a refusing source: %v (%s), want LOCAL_FILE", err, transfer.KindOf(err))
	}
	if seen := h.take(); len(seen) != 0 {
		t.Errorf("a request without its token went out: %q", seen)
	}
}

func TestATokenForAWebDAVMoveCoversTheDirectoryOfBothNames(t *testing.T) {
	h := newHops(t)
	var asked []string
	source := func(_ context.Context, u *url.URL, access transfer.Access) (string, error) {
		asked = append(asked, u.EscapedPath()+" "+string(access))
		return "token", nil
	}
	c := h.client().WithTokenSource(source)
	dav := "davs://" + hostOf(h.a)
	cases := []struct{ from, to, want string }{
		{dav + "/data/run 1/.f.sluice-g.1.part", dav + "/data/run 1/f", "/data/run%201 storage.modify"},
		{dav + "/data/a/f", dav + "/data/b/f", "/data storage.modify"},
		{dav + "/f.part", dav + "/f", "/ storage.modify"},
	}
	for _, tc := range cases {
		asked = nil
		if err := c.Rename(context.Background(), tc.from, tc.to); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(asked, []string{tc.want}) {
			t.Errorf("MOVE %s to %s asked for %q, want %q", tc.from, tc.to, asked, tc.want)
		}
	}
}

func TestS3SignaturesAreNotSentOnToARedirect(t *testing.T) {
	// minio-go follows no redirect: a signed request goes to its endpoint
	// only, whatever the endpoint answers.
	other, hits := counter(t, "", "")
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	}))
	t.Cleanup(endpoint.Close)
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("sluice sluice-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := transfer.New(nil).WithGuard(loopback).WithS3Credentials(map[string]string{hostOf(endpoint): keys})
	ctx := context.Background()
	obj := "s3://" + hostOf(endpoint) + "/bucket/key"
	_, statErr := c.Stat(ctx, obj)
	_, copyErr := c.Copy(ctx, obj, fileURL(filepath.Join(t.TempDir(), "f")), transfer.CopyOptions{})
	for op, err := range map[string]error{"stat": statErr, "copy": copyErr} {
		if err == nil {
			t.Errorf("%s through a redirecting endpoint succeeded", op)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the server redirected to got %d requests", n)
	}
}

// TestATokenSourceIsNotAskedForAHopTheGuardRefuses: a storage that
// redirects to an address transfers may not reach gets the Guard's
// refusal, and no token is minted for that address.
func TestATokenSourceIsNotAskedForAHopTheGuardRefuses(t *testing.T) {
	h := newHops(t)
	g := mustGuard("127.0.0.0/8", "::1")
	if err := g.Deny("a test's forbidden storage", hostOf(h.b)); err != nil {
		t.Fatal(err)
	}
	var asked []string
	source := func(_ context.Context, u *url.URL, _ transfer.Access) (string, error) {
		asked = append(asked, transfer.Audience(u))
		return "token", nil
	}
	c := transfer.New(h.a.Client()).WithGuard(g).WithTokenSource(source)
	_, err := c.Stat(t.Context(), h.a.URL+"/to-b")
	if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), "forbidden storage") {
		t.Fatalf("a redirect to a denied address: %v (%s), want PERMANENT_REMOTE naming why", err, transfer.KindOf(err))
	}
	for _, a := range asked {
		if strings.HasSuffix(a, ":"+strings.Split(hostOf(h.b), ":")[1]) {
			t.Fatalf("a token was asked for the denied hop: %q", asked)
		}
	}
	if len(asked) != 1 {
		t.Errorf("asked for %q, want the first hop's token only", asked)
	}
}
