package xrootdtest_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go-hep.org/x/hep/xrootd"
	"go-hep.org/x/hep/xrootd/xrdfs"

	"github.com/sluice-dtr/sluice/pkg/token/tokentest"
	"github.com/sluice-dtr/sluice/pkg/transfer/xrootdtest"
)

func do(t *testing.T, c *http.Client, method, url, token string, body []byte, header http.Header) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body == nil {
		req.Body = nil
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func TestTheRealXrootdServesItsDirectoryOverRootAndHTTPS(t *testing.T) {
	s := xrootdtest.Start(t, xrootdtest.Options{HTTP: true})
	s.WriteFile(t, "/in/a file", []byte("put behind its back"))
	c := s.Client()
	if code, b := do(t, c, http.MethodGet, s.HTTPS+"/in/a%20file", "", nil, nil); code != http.StatusOK || string(b) != "put behind its back" {
		t.Fatalf("GET: %d %q", code, b)
	}
	if code, _ := do(t, c, http.MethodPut, s.HTTPS+"/in/uploaded", "", []byte("over https"), nil); code/100 != 2 {
		t.Fatalf("PUT: %d", code)
	}
	if b, err := os.ReadFile(s.Path("/in/uploaded")); err != nil || string(b) != "over https" {
		t.Fatalf("the uploaded file: %q, %v", b, err)
	}
	// root:// reads the same directory.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, err := xrootd.NewClient(ctx, strings.TrimSuffix(strings.TrimPrefix(s.Root, "root://"), "/"), "sluice")
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	f, err := cli.FS().Open(ctx, "/in/uploaded", xrdfs.OpenModeOwnerRead, xrdfs.OpenOptionsOpenRead)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close(ctx)
	buf := make([]byte, 64)
	n, err := f.ReadAt(buf, 0)
	if err != nil && err != io.EOF || string(buf[:n]) != "over https" {
		t.Fatalf("root:// read %q, %v", buf[:n], err)
	}
	// The same port speaks plain http.
	if code, b := do(t, http.DefaultClient, http.MethodGet, s.HTTP+"/in/uploaded", "", nil, nil); code != http.StatusOK || string(b) != "over https" {
		t.Fatalf("GET over plain http: %d %q", code, b)
	}
	// An HTTP client that does not trust the helper's CA is refused.
	if _, err := http.Get(s.HTTPS + "/in/uploaded"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a client without the CA: %v, want a certificate error", err)
	}
}

func TestTwoRealXrootdServersOfOneCACopyBetweenEachOther(t *testing.T) {
	ca := xrootdtest.NewCA(t)
	a := xrootdtest.Start(t, xrootdtest.Options{TPC: true, CA: ca})
	b := xrootdtest.Start(t, xrootdtest.Options{TPC: true, CA: ca})
	data := bytes.Repeat([]byte("third party "), 100000)
	a.WriteFile(t, "/src", data)
	c := ca.Client()
	// Pull: the destination fetches from the source.
	code, body := do(t, c, "COPY", b.HTTPS+"/pulled", "", nil, http.Header{"Source": {a.HTTPS + "/src"}})
	if code != http.StatusAccepted && code != http.StatusCreated || !strings.Contains(string(body), "success") {
		t.Fatalf("pull COPY: %d %s", code, body)
	}
	// Push: the source sends to the destination.
	code, body = do(t, c, "COPY", a.HTTPS+"/src", "", nil, http.Header{"Destination": {b.HTTPS + "/pushed"}})
	if code != http.StatusAccepted && code != http.StatusCreated || !strings.Contains(string(body), "success") {
		t.Fatalf("push COPY: %d %s", code, body)
	}
	for _, name := range []string{"/pulled", "/pushed"} {
		if got, err := os.ReadFile(b.Path(name)); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s: %d bytes, %v; want the %d of the source", name, len(got), err, len(data))
		}
	}
	// A server of another CA is not trusted as the other end.
	other := xrootdtest.Start(t, xrootdtest.Options{TPC: true})
	code, body = do(t, c, "COPY", b.HTTPS+"/untrusted", "", nil, http.Header{"Source": {other.HTTPS + "/src"}})
	if strings.Contains(string(body), "success") {
		t.Fatalf("a pull from a server of another CA: %d %s", code, body)
	}
	// xrootd 5.5 leaves the file it opened for the copy, empty.
	if fi, err := os.Stat(b.Path("/untrusted")); err == nil && fi.Size() != 0 {
		t.Fatalf("a pull from a server of another CA left %d bytes", fi.Size())
	}
}

func TestTheRealXrootdWithSciTokensAllowsOnlyTokensForItsAudienceAndPath(t *testing.T) {
	is := tokentest.Start(t)
	const aud = "https://storage.example"
	s := xrootdtest.Start(t, xrootdtest.Options{HTTP: true, Tokens: &xrootdtest.Tokens{Issuer: is.URL, Audience: []string{aud}}})
	s.WriteFile(t, "/data/f", []byte("scoped"))
	c := s.Client()
	mint := func(aud string, scopes ...string) string {
		// scitokens-cpp refuses a token without nbf, which the WLCG
		// profile requires.
		return is.Mint(t, tokentest.Mint{Subject: "reader", Audience: []string{aud}, Scopes: scopes, NotBefore: time.Now().Add(-time.Minute)})
	}
	cases := []struct {
		name, token string
		want        int
	}{
		{"no token", "", http.StatusForbidden},
		{"the right audience and path", mint(aud, "storage.read:/data"), http.StatusOK},
		{"the server's own URL as audience", mint(s.HTTPS, "storage.read:/data/f"), http.StatusOK},
		{"another audience", mint("https://elsewhere.example", "storage.read:/data"), http.StatusForbidden},
		{"another path", mint(aud, "storage.read:/other"), http.StatusForbidden},
		{"a scope to write only", mint(aud, "storage.create:/data"), http.StatusForbidden},
	}
	for _, tc := range cases {
		if code, b := do(t, c, http.MethodGet, s.HTTPS+"/data/f", tc.token, nil, nil); code != tc.want {
			t.Errorf("%s: %d %q, want %d", tc.name, code, b, tc.want)
		}
	}
	// A token of the issuer's next key is accepted once the server has
	// the issuer's keys again.
	is.Rotate(t)
	s.RefreshIssuerKeys(t)
	if code, b := do(t, c, http.MethodGet, s.HTTPS+"/data/f", mint(aud, "storage.read:/data"), nil, nil); code != http.StatusOK {
		t.Fatalf("a token of the new key: %d %q", code, b)
	}
}
