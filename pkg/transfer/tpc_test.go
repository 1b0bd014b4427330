package transfer_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/httpstore"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// tpcStore is an httpstore that makes third-party copies, on loopback.
type tpcStore struct {
	dir  string
	srv  *httptest.Server
	copy *httpstore.CopyOptions
}

func (s *tpcStore) url(name string) string { return s.srv.URL + "/" + name }

func (s *tpcStore) path(name string) string { return filepath.Join(s.dir, name) }

// newTPCStore starts a store over TLS (trusting every other httptest TLS
// server) or plain http, with the given copy options (nil: COPY refused
// with 405) and digest answers.
func newTPCStore(t *testing.T, tls bool, copyOpts *httpstore.CopyOptions, digest bool) *tpcStore {
	t.Helper()
	s := &tpcStore{dir: t.TempDir(), copy: copyOpts}
	s.srv = httptest.NewUnstartedServer(httpstore.New(s.dir, httpstore.Options{Digest: digest, Copy: copyOpts}))
	if tls {
		s.srv.StartTLS()
	} else {
		s.srv.Start()
	}
	if copyOpts != nil && copyOpts.Client == nil {
		copyOpts.Client = s.srv.Client()
	}
	t.Cleanup(s.srv.Close)
	return s
}

// writeRandom writes n random bytes to path and returns them.
func writeRandom(t *testing.T, path string, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

// countingTransport counts the bytes of every request and response body
// that pass through a Client: what moves through Sluice itself.
type countingTransport struct {
	base http.RoundTripper
	n    atomic.Int64
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		req.Body = countingBody{req.Body, &c.n}
	}
	resp, err := c.base.RoundTrip(req)
	if resp != nil {
		resp.Body = countingBody{resp.Body, &c.n}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// countingClient is a Client over srv's TLS settings whose bytes are
// counted.
func countingClient(srv *httptest.Server) (*transfer.Client, *countingTransport) {
	ct := &countingTransport{base: srv.Client().Transport}
	return transfer.New(&http.Client{Transport: ct}).WithGuard(loopback), ct
}

func TestAThirdPartyCopyMovesTheFileWithoutItsBytesPassingThroughSluice(t *testing.T) {
	for _, mode := range []transfer.ThirdPartyMode{transfer.ThirdPartyPull, transfer.ThirdPartyPush} {
		t.Run(string(mode), func(t *testing.T) {
			src := newTPCStore(t, true, &httpstore.CopyOptions{Stripes: 3}, true)
			dst := newTPCStore(t, true, &httpstore.CopyOptions{Stripes: 3}, true)
			const size = 8 << 20
			data := writeRandom(t, src.path("f"), size)
			c, counted := countingClient(src.srv)
			var progress []int64
			res, err := c.ThirdPartyCopy(context.Background(), src.url("f"), dst.url("g"), transfer.ThirdPartyOptions{
				Mode: mode, ExpectedSize: size, Progress: func(b int64) { progress = append(progress, b) }})
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(dst.path("g"))
			if !bytes.Equal(got, data) {
				t.Fatalf("the destination has %d bytes, not the source's %d", len(got), len(data))
			}
			want, _ := checksum.File(src.path("f"), "adler32")
			if res.Bytes != size || res.Checksum != want || res.ChecksumUnverified != "" || res.ReadBack != 0 {
				t.Errorf("result %+v; want %d bytes, checksum %s verified against the source's", res, size, want)
			}
			// Only markers, a HEAD of each end and their answers went
			// through Sluice.
			if n := counted.n.Load(); n > 64<<10 {
				t.Errorf("%d bytes passed through Sluice for a third-party copy of %d", n, size)
			}
			if len(progress) == 0 || progress[len(progress)-1] != size {
				t.Errorf("progress %v, want it to end at %d", progress, size)
			}
			active := dst
			if mode == transfer.ThirdPartyPush {
				active = src
			}
			if active.copy.Copies() != 1 {
				t.Errorf("the %s storage made %d copies, want 1", mode, active.copy.Copies())
			}
		})
	}
}

func TestTheRemoteStoragesTokenGoesInTransferHeaderAuthorizationOnlyOverHTTPS(t *testing.T) {
	// The remote end records what it is sent.
	var remoteAuth atomic.Value
	recording := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet {
				remoteAuth.Store(r.Header.Get("Authorization"))
			}
			h.ServeHTTP(w, r)
		})
	}
	dst := newTPCStore(t, true, &httpstore.CopyOptions{}, false)
	secure := httptest.NewTLSServer(recording(httpstore.Handler(t.TempDir())))
	t.Cleanup(secure.Close)
	plainDir := t.TempDir()
	plain := httptest.NewServer(recording(httpstore.Handler(plainDir)))
	t.Cleanup(plain.Close)
	for _, d := range []string{plainDir} {
		writeRandom(t, filepath.Join(d, "f"), 1000)
	}
	// The secure server's directory is the handler's own: write through PUT.
	c := transfer.New(dst.srv.Client()).WithGuard(loopback)
	if err := put(c, secure.URL+"/f", make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{
		hostOf(dst.srv): tokenFile(t, "token-of-the-destination"),
		hostOf(secure):  tokenFile(t, "token-of-the-source"),
	}
	c = c.WithTokens(tokens)

	if _, err := c.ThirdPartyCopy(context.Background(), secure.URL+"/f", dst.url("g"), transfer.ThirdPartyOptions{}); err != nil {
		t.Fatal(err)
	}
	h := dst.copy.Headers()[0]
	if got := h.Get("Authorization"); got != "Bearer token-of-the-destination" {
		t.Errorf("COPY Authorization %q, want the destination's token", got)
	}
	if got := h.Get("TransferHeaderAuthorization"); got != "Bearer token-of-the-source" {
		t.Errorf("COPY TransferHeaderAuthorization %q, want the source's token", got)
	}
	if got := remoteAuth.Load(); got != "Bearer token-of-the-source" {
		t.Errorf("the source was sent Authorization %q, want its own token", got)
	}

	// A plain http source gets no token, and none is asked of anyone.
	if _, err := c.ThirdPartyCopy(context.Background(), plain.URL+"/f", dst.url("h"), transfer.ThirdPartyOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := dst.copy.Headers()[1].Get("TransferHeaderAuthorization"); got != "" {
		t.Errorf("a plain http source's token went to the storage: %q", got)
	}
	if got := remoteAuth.Load(); got != "" {
		t.Errorf("the plain http source was sent Authorization %q", got)
	}

	// A plain http source that has a token configured is refused, not
	// sent it in clear.
	c2 := c.WithTokens(map[string]string{hostOf(dst.srv): tokens[hostOf(dst.srv)], hostOf(plain): tokenFile(t, "token-of-plain")})
	_, err := c2.ThirdPartyCopy(context.Background(), plain.URL+"/f", dst.url("i"), transfer.ThirdPartyOptions{})
	if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), "sent over https only") || errors.Is(err, transfer.ErrNoThirdPartyCopy) {
		t.Fatalf("error %v; want the insecure token refused for good", err)
	}
	if len(dst.copy.Headers()) != 2 {
		t.Error("a COPY was sent for a source whose token cannot be sent")
	}
}

// put writes data to rawURL through c.
func put(c *transfer.Client, rawURL string, data []byte) error {
	dir, err := os.MkdirTemp("", "put")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		return err
	}
	_, err = c.Copy(context.Background(), "file://"+p, rawURL, transfer.CopyOptions{})
	return err
}

func TestTheRemoteStoragesTokenIsDroppedWhenTheCopyIsRedirectedToAnotherHost(t *testing.T) {
	dst := newTPCStore(t, true, &httpstore.CopyOptions{}, false)
	src := newTPCStore(t, true, nil, false)
	writeRandom(t, src.path("f"), 1000)
	var mu sync.Mutex
	var seen []string
	// A door that sends every COPY on to the real storage, on another port.
	door := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "COPY" {
			mu.Lock()
			seen = append(seen, r.Header.Get("TransferHeaderAuthorization"))
			mu.Unlock()
		}
		http.Redirect(w, r, dst.srv.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(door.Close)
	// The site configured a token for the door too: only to such a
	// storage is the source's token handed on (mayHandOn).
	c := transfer.New(dst.srv.Client()).WithGuard(loopback).WithTokens(map[string]string{
		hostOf(src.srv): tokenFile(t, "token-of-the-source"),
		hostOf(door):    tokenFile(t, "token-of-the-door"),
	})
	// The source here asks for no token, so the copy itself succeeds.
	if _, err := c.ThirdPartyCopy(context.Background(), src.url("f"), door.URL+"/g", transfer.ThirdPartyOptions{}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || seen[0] != "Bearer token-of-the-source" {
		t.Errorf("the door was sent %q, want the source's token", seen)
	}
	if got := dst.copy.Headers()[0].Get("TransferHeaderAuthorization"); got != "" {
		t.Errorf("the storage on another port got the source's token: %q", got)
	}
}

func TestAStorageThatRefusesThirdPartyCopySaysSoAndNothingIsWritten(t *testing.T) {
	tests := []struct {
		name string
		copy *httpstore.CopyOptions
		text string
	}{
		{"COPY not allowed (405)", nil, "HTTP 405 Method Not Allowed"},
		{"COPY not implemented (501)", &httpstore.CopyOptions{Refuse: httpstore.RefuseStatus}, "HTTP 501 Not Implemented: third-party copy is not implemented here"},
		{"a failure line", &httpstore.CopyOptions{Refuse: httpstore.RefuseFailureLine}, "the storage reports the copy failed: third-party copy is not supported by this storage"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := newTPCStore(t, false, nil, false)
			dst := newTPCStore(t, false, tt.copy, false)
			writeRandom(t, src.path("f"), 1000)
			c := transfer.New(nil).WithGuard(loopback)
			_, err := c.ThirdPartyCopy(context.Background(), src.url("f"), dst.url("g"), transfer.ThirdPartyOptions{})
			if !errors.Is(err, transfer.ErrNoThirdPartyCopy) || transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("error %v; want a refusal of third-party copy saying %q", err, tt.text)
			}
			if _, err := os.Stat(dst.path("g")); !os.IsNotExist(err) {
				t.Errorf("the destination exists: %v", err)
			}
		})
	}
}

func TestAThirdPartyCopyBetweenSchemesWithoutOneIsRefusedBeforeAnyRequest(t *testing.T) {
	dst := newTPCStore(t, false, &httpstore.CopyOptions{}, false)
	c := transfer.New(nil).WithGuard(loopback)
	for _, src := range []string{"file:///etc/hostname", "s3://host/bucket/key", "root://host//f"} {
		_, err := c.ThirdPartyCopy(context.Background(), src, dst.url("g"), transfer.ThirdPartyOptions{})
		if !errors.Is(err, transfer.ErrNoThirdPartyCopy) || !strings.Contains(err.Error(), "URLs have none (only http, https, dav and davs)") {
			t.Errorf("%s: error %v; want no third-party copy", src, err)
		}
	}
	if n := len(dst.copy.Headers()); n != 0 {
		t.Errorf("%d COPY requests were sent", n)
	}
	if transfer.CanThirdPartyCopy("davs://a/f", "https://b/g") != true || transfer.CanThirdPartyCopy("file:///f", "https://b/g") {
		t.Error("CanThirdPartyCopy is wrong")
	}
}

func TestTheGuardChecksBothStoragesOfAThirdPartyCopy(t *testing.T) {
	src := newTPCStore(t, false, nil, false)
	dst := newTPCStore(t, false, &httpstore.CopyOptions{}, false)
	writeRandom(t, src.path("f"), 1000)
	// Loopback not allowed: the storage Sluice talks to is refused, and so
	// is a remote one the storage would reach on Sluice's behalf.
	_, err := transfer.New(nil).ThirdPartyCopy(context.Background(), src.url("f"), dst.url("g"), transfer.ThirdPartyOptions{})
	if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), "refused: it is loopback") {
		t.Fatalf("error %v; want the loopback address refused", err)
	}
	if n := len(dst.copy.Headers()); n != 0 {
		t.Errorf("%d COPY requests reached a refused address", n)
	}
	// Only the destination is allowed: the source, reached by the
	// storage, is still checked.
	g := mustGuard("127.0.0.0/8")
	if err := g.Deny("a storage the test forbids", hostOf(src.srv)); err != nil {
		t.Fatal(err)
	}
	_, err = transfer.New(nil).WithGuard(g).ThirdPartyCopy(context.Background(), src.url("f"), dst.url("g"), transfer.ThirdPartyOptions{})
	if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), "a storage the test forbids") {
		t.Fatalf("error %v; want the source refused", err)
	}
	if n := len(dst.copy.Headers()); n != 0 {
		t.Errorf("%d COPY requests were sent for a refused source", n)
	}
	// The storage Sluice talks to, refused at the dial.
	g = mustGuard("127.0.0.0/8")
	if err := g.Deny("the storage the test forbids", hostOf(dst.srv)); err != nil {
		t.Fatal(err)
	}
	_, err = transfer.New(nil).WithGuard(g).ThirdPartyCopy(context.Background(), src.url("f"), dst.url("g"), transfer.ThirdPartyOptions{})
	if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), "the storage the test forbids") {
		t.Fatalf("error %v; want the destination refused", err)
	}
	if n := len(dst.copy.Headers()); n != 0 {
		t.Errorf("%d COPY requests reached a refused storage", n)
	}
}

// dripServer serves a large file slowly, a chunk every 10 ms, and closes
// ended when a request of it ends, whatever the reason.
func dripServer(t *testing.T) (srv *httptest.Server, ended <-chan struct{}) {
	t.Helper()
	ch := make(chan struct{}, 16)
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { ch <- struct{}{} }()
		w.Header().Set("Content-Length", fmt.Sprint(1<<30))
		chunk := make([]byte, 16<<10)
		for {
			if _, err := w.Write(chunk); err != nil {
				return
			}
			http.NewResponseController(w).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv, ch
}

func TestCancellingAThirdPartyCopyStopsTheStoragesCopyAndRemovesThePartialFile(t *testing.T) {
	src, ended := dripServer(t)
	dst := newTPCStore(t, false, &httpstore.CopyOptions{MarkerEvery: 20 * time.Millisecond}, false)
	c := transfer.New(nil).WithGuard(loopback)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var progressed atomic.Bool
	done := make(chan error, 1)
	go func() {
		_, err := c.ThirdPartyCopy(ctx, src.URL+"/f", dst.url("g"), transfer.ThirdPartyOptions{Progress: func(b int64) {
			if b > 0 {
				progressed.Store(true)
			}
		}})
		done <- err
	}()
	waitFor(t, progressed.Load)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v, want cancelled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the copy did not return after its context was cancelled")
	}
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the storage still reads the source after the copy was cancelled")
	}
	waitFor(t, func() bool { return dst.copy.Aborted() == 1 })
	entries, _ := os.ReadDir(dst.dir)
	if len(entries) != 0 {
		t.Errorf("the storage kept %v", entries)
	}
}

func TestAFenceThatRefusesStopsAThirdPartyCopyAndDeletesNothing(t *testing.T) {
	src, ended := dripServer(t)
	dst := newTPCStore(t, false, &httpstore.CopyOptions{MarkerEvery: 20 * time.Millisecond}, false)
	// What an earlier attempt finished at the destination: not ours to
	// delete once the lease may have passed.
	os.WriteFile(dst.path("g"), []byte("another attempt's"), 0o644)
	var markers atomic.Int32
	ctx := transfer.WithFence(context.Background(), func() error {
		if markers.Add(1) > 3 {
			return transfer.ErrLeaseLost
		}
		return nil
	})
	_, err := transfer.New(nil).WithGuard(loopback).ThirdPartyCopy(ctx, src.URL+"/f", dst.url("g"), transfer.ThirdPartyOptions{})
	if !transfer.IsLeaseLost(err) {
		t.Fatalf("error %v; want the fence's", err)
	}
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the storage still reads the source after the fence refused")
	}
	if b, _ := os.ReadFile(dst.path("g")); string(b) != "another attempt's" {
		t.Errorf("the destination holds %q", b)
	}
}

func TestAThirdPartyCopyIsVerifiedByTheStoragesChecksums(t *testing.T) {
	data := []byte(strings.Repeat("sluice", 1000))
	h, _ := checksum.New("adler32")
	h.Write(data)
	sum := checksum.Format("adler32", h)
	tests := []struct {
		name                   string
		srcDigest, dstDigest   bool
		expected               string
		wantSum, wantUnverfied string
		readBack               bool
		err                    string
	}{
		{"the destination's checksum against the source's", true, true, "", sum, "", false, ""},
		{"the destination's checksum and the job's", false, true, sum, sum, "", false, ""},
		{"no checksum anywhere", false, false, "", "", "the destination storage gives no adler32 checksum and the job expects none", false, ""},
		{"no source checksum", false, true, "", sum, "the job expects no checksum and the source storage gives no adler32 checksum", false, ""},
		{"the job's checksum, the storage has none: read back", false, false, sum, sum, "", true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := newTPCStore(t, false, nil, tt.srcDigest)
			dst := newTPCStore(t, false, &httpstore.CopyOptions{}, tt.dstDigest)
			os.WriteFile(src.path("f"), data, 0o644)
			res, err := transfer.New(nil).WithGuard(loopback).ThirdPartyCopy(context.Background(), src.url("f"), dst.url("g"),
				transfer.ThirdPartyOptions{Checksum: tt.expected})
			if err != nil {
				t.Fatal(err)
			}
			if res.Checksum != tt.wantSum || !strings.Contains(res.ChecksumUnverified, tt.wantUnverfied) || (tt.wantUnverfied == "") != (res.ChecksumUnverified == "") {
				t.Errorf("checksum %q, unverified %q; want %q, %q", res.Checksum, res.ChecksumUnverified, tt.wantSum, tt.wantUnverfied)
			}
			if (res.ReadBack > 0) != tt.readBack {
				t.Errorf("read back %d bytes", res.ReadBack)
			}
		})
	}
}

func TestADestinationThatDiffersFromTheSourceAfterAThirdPartyCopyIsRemoved(t *testing.T) {
	// A storage that lies: it says success but stores other bytes.
	src := newTPCStore(t, false, nil, true)
	os.WriteFile(src.path("f"), []byte("the source's bytes"), 0o644)
	dir := t.TempDir()
	store := httpstore.New(dir, httpstore.Options{Digest: true})
	liar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "COPY" {
			os.WriteFile(filepath.Join(dir, "g"), []byte("something else"), 0o644)
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "success: Created\n")
			return
		}
		store.ServeHTTP(w, r)
	}))
	t.Cleanup(liar.Close)
	_, err := transfer.New(nil).WithGuard(loopback).ThirdPartyCopy(context.Background(), src.url("f"), liar.URL+"/g",
		transfer.ThirdPartyOptions{ExpectedSize: int64(len("the source's bytes"))})
	if transfer.KindOf(err) != dtr.ErrTemporaryRemote || !strings.Contains(err.Error(), "size changed: the source had 18 bytes when queried, the destination has 14 after the copy") {
		t.Fatalf("error %v; want the size change", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "g")); !os.IsNotExist(err) {
		t.Errorf("the wrong copy is kept: %v", err)
	}
	os.WriteFile(src.path("f"), []byte("something same"), 0o644) // same size, other bytes
	_, err = transfer.New(nil).WithGuard(loopback).ThirdPartyCopy(context.Background(), src.url("f"), liar.URL+"/g", transfer.ThirdPartyOptions{})
	if transfer.KindOf(err) != dtr.ErrTemporaryRemote || !strings.Contains(err.Error(), "checksum mismatch after the copy") {
		t.Fatalf("error %v; want a checksum mismatch", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "g")); !os.IsNotExist(err) {
		t.Errorf("the wrong copy is kept: %v", err)
	}
}

func TestATokenEchoedByAStorageNeverReachesTheError(t *testing.T) {
	echo := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "failure: remote said 401 to %s and %s\n", r.Header.Get("TransferHeaderAuthorization"), r.Header.Get("Authorization"))
	}))
	t.Cleanup(echo.Close)
	refuse := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "bad credentials "+r.Header.Get("TransferHeaderAuthorization"), http.StatusBadRequest)
	}))
	t.Cleanup(refuse.Close)
	src := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(src.Close)
	const jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl"
	c := transfer.New(echo.Client()).WithGuard(loopback).WithTokens(map[string]string{
		hostOf(echo): tokenFile(t, "opaque-secret"), hostOf(refuse): tokenFile(t, "opaque-secret"), hostOf(src): tokenFile(t, jwt),
	})
	for _, active := range []string{echo.URL, refuse.URL} {
		_, err := c.ThirdPartyCopy(context.Background(), src.URL+"/f", active+"/g", transfer.ThirdPartyOptions{})
		if err == nil || strings.Contains(err.Error(), "opaque-secret") || strings.Contains(err.Error(), jwt) || strings.Contains(err.Error(), "eyJ") {
			t.Errorf("error %v: holds a token", err)
		}
	}
}

func TestPerfMarkersAreReadWhateverTheirChunksAndAMalformedStreamIsAClearError(t *testing.T) {
	marker := func(stripe, bytes int) string {
		return fmt.Sprintf("Perf Marker\n\tTimestamp: 1700000000\n\tStripe Index: %d\n\tStripe Bytes Transferred: %d\n\tTotal Stripe Count: 2\nEnd\n", stripe, bytes)
	}
	tests := []struct {
		name     string
		body     string
		progress int64 // the last count reported
		kind     dtr.ErrorKind
		text     string
	}{
		{"two stripes and unknown lines", "Perf Marker\nRemoteConnections: tcp:1.2.3.4:443\nEnd\n" + marker(0, 100) + "some note\n" + marker(1, 50) +
			marker(0, 300) + marker(1, 700) + "success: Created\n", 1000, "", ""},
		{"a failure naming the remote status", marker(0, 10) + "failure: Remote side failed with status code 404; not found\n", 10,
			dtr.ErrPermanentRemote, "the storage reports the copy failed: Remote side failed with status code 404; not found"},
		{"a failure from the network", "failure: Couldn't connect to server\n", 0, dtr.ErrTemporaryRemote, "Couldn't connect to server"},
		{"a bad number", "Perf Marker\nStripe Bytes Transferred: lots\nEnd\nsuccess: Created\n", 0, dtr.ErrTemporaryRemote,
			`malformed perf-marker stream at line 2: bytes transferred "lots" is not a number`},
		{"a marker inside a marker", "Perf Marker\nPerf Marker\n", 0, dtr.ErrTemporaryRemote, "at line 2: a perf marker starts before the last one ended"},
		{"no final line", marker(0, 10), 10, dtr.ErrTemporaryRemote, "the stream ended without a success or failure line"},
		{"a line without end", marker(0, 10) + strings.Repeat("x", 20<<10), 10, dtr.ErrTemporaryRemote, "a line longer than 16384 bytes"},
		{"a page, not a marker stream", strings.Repeat("<p>a file, or a web page</p>\n", 10), 0, dtr.ErrPermanentRemote,
			"no third-party copy: the storage answered COPY with 201 Created and no perf markers"},
		{"binary bytes, not a marker stream", strings.Repeat("\x00\x01", 10<<10), 0, dtr.ErrPermanentRemote,
			"no third-party copy: the storage answered COPY with 201 Created and no perf markers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.Method {
				case "COPY":
					w.WriteHeader(http.StatusCreated)
					// Byte by byte: every read may end mid-line.
					for i := range len(tt.body) {
						w.Write([]byte{tt.body[i]})
						if i%7 == 0 {
							http.NewResponseController(w).Flush()
						}
					}
				case http.MethodHead:
					w.Header().Set("Content-Length", "1000")
				case http.MethodDelete:
					w.WriteHeader(http.StatusNoContent)
				}
			}))
			t.Cleanup(srv.Close)
			var last int64
			_, err := transfer.New(nil).WithGuard(loopback).ThirdPartyCopy(context.Background(), srv.URL+"/f", srv.URL+"/g",
				transfer.ThirdPartyOptions{Progress: func(b int64) { last = b }})
			if transfer.KindOf(err) != tt.kind || tt.kind != "" && !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("error %v; want %q saying %q", err, tt.kind, tt.text)
			}
			if tt.kind == "" {
				tt.progress = 1000 // the destination's size, on success
			}
			if last != tt.progress {
				t.Errorf("progress ended at %d, want %d", last, tt.progress)
			}
		})
	}
}

// The site's static token for a storage (SLUICE_HTTP_TOKENS) acts for
// every submitter there, with no path scope: it is handed on in a COPY
// only to a storage the site also configured a token for, and only over
// https; otherwise no COPY is sent and the transfer may be streamed.
func TestTheSitesTokenIsHandedOnOnlyToAStorageTheSiteTrustsOverHTTPS(t *testing.T) {
	src := newTPCStore(t, true, nil, false)
	writeRandom(t, src.path("f"), 1000)
	for _, tc := range []struct {
		name    string
		tls     bool
		trusted bool // the site configured a token for the storage that copies
		want    string
	}{
		{"a storage the site configured no token for", true, false, "handed on only to storages the site configured a token for"},
		{"a plain http storage", false, true, "would go in clear"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := newTPCStore(t, tc.tls, &httpstore.CopyOptions{}, false)
			tokens := map[string]string{hostOf(src.srv): tokenFile(t, "token-of-the-source")}
			if tc.trusted {
				tokens[hostOf(dst.srv)] = tokenFile(t, "token-of-the-destination")
			}
			c := transfer.New(src.srv.Client()).WithGuard(loopback).WithTokens(tokens)
			_, err := c.ThirdPartyCopy(context.Background(), src.url("f"), dst.url("g"), transfer.ThirdPartyOptions{})
			if !errors.Is(err, transfer.ErrNoThirdPartyCopy) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v; want no third-party copy, saying %q", err, tc.want)
			}
			if n := len(dst.copy.Headers()); n != 0 {
				t.Fatalf("%d COPY requests were sent; want none", n)
			}
		})
	}
}

// scriptedCopyStore answers every COPY with 202 and body, then, if cut,
// drops the connection; it counts the DELETEs it is sent.
func scriptedCopyStore(t *testing.T, body string, cut bool) (*httptest.Server, *atomic.Int32) {
	var deletes atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodDelete:
			deletes.Add(1)
		case "COPY":
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, body)
			w.(http.Flusher).Flush()
			if cut {
				panic(http.ErrAbortHandler)
			}
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &deletes
}

// Once a copy has begun, its failure is a failed copy, whatever words it
// uses: what the storage wrote is removed, and it is not a refusal to
// fall back from at once (the storage may still be at it).
func TestACopyThatFailsOnceBegunIsAFailedCopyNotARefusal(t *testing.T) {
	marker := "Perf Marker\nTimestamp: 1700000000\nStripe Index: 0\nStripe Bytes Transferred: 500\nTotal Stripe Count: 1\nEnd\n"
	for _, tc := range []struct {
		name string
		body string
		cut  bool
	}{
		{"a failure line after a marker, naming something not supported", marker + "failure: TLS: protocol version not supported\n", false},
		{"the connection lost after a marker", marker, true},
		{"the connection lost before the first marker", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst, deletes := scriptedCopyStore(t, tc.body, tc.cut)
			c := transfer.New(dst.Client()).WithGuard(loopback)
			_, err := c.ThirdPartyCopy(context.Background(), "https://127.0.0.1:1/f", dst.URL+"/g", transfer.ThirdPartyOptions{})
			if err == nil || errors.Is(err, transfer.ErrNoThirdPartyCopy) {
				t.Fatalf("error %v; want a failed copy, not a refusal", err)
			}
			if deletes.Load() == 0 {
				t.Fatal("what the storage wrote was not removed")
			}
		})
	}
}

// A copy faster than the markers is checked against the maximum file
// size afterwards, as a streamed one is at every read.
func TestAThirdPartyCopyLargerThanTheMaximumFileSizeFailsAndIsRemoved(t *testing.T) {
	dst := newTPCStore(t, true, &httpstore.CopyOptions{MarkerEvery: time.Hour}, false)
	src := newTPCStore(t, true, nil, false)
	writeRandom(t, src.path("f"), 1000)
	c := transfer.New(dst.srv.Client()).WithGuard(loopback)
	_, err := c.ThirdPartyCopy(context.Background(), src.url("f"), dst.url("g"), transfer.ThirdPartyOptions{MaxSize: 500})
	if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), "maximum file size") {
		t.Fatalf("error %v; want the maximum file size exceeded, for good", err)
	}
	if _, err := os.Stat(dst.path("g")); !os.IsNotExist(err) {
		t.Fatalf("the destination is still there: %v", err)
	}
}
