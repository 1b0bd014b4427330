package delivery

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/net/webdav"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/httpstore"
	"github.com/sluice-dtr/sluice/pkg/scitag"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// store is an httpstore on loopback, over TLS, that answers Want-Digest
// and, with copyOpts, COPY.
type store struct {
	dir  string
	srv  *httptest.Server
	copy *httpstore.CopyOptions
}

func newStore(t *testing.T, copyOpts *httpstore.CopyOptions) *store {
	t.Helper()
	s := &store{dir: t.TempDir(), copy: copyOpts}
	s.srv = httptest.NewUnstartedServer(httpstore.New(s.dir, httpstore.Options{Digest: true, Copy: copyOpts}))
	s.srv.StartTLS()
	if copyOpts != nil {
		copyOpts.Client = s.srv.Client()
	}
	t.Cleanup(s.srv.Close)
	return s
}

func (s *store) url(name string) string { return s.srv.URL + "/" + name }

// counter counts the body bytes that pass through a deliverer's client.
type counter struct {
	base http.RoundTripper
	n    atomic.Int64
}

func (c *counter) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		req.Body = counted{req.Body, &c.n}
	}
	resp, err := c.base.RoundTrip(req)
	if resp != nil {
		resp.Body = counted{resp.Body, &c.n}
	}
	return resp, err
}

type counted struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b counted) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// deliverer is a delivery service whose client trusts httptest's TLS
// servers, reaches loopback, and counts its bytes.
func deliverer(t *testing.T, trust *httptest.Server, cfg Config, log *slog.Logger) (*Service, *counter) {
	t.Helper()
	ct := &counter{base: trust.Client().Transport}
	cfg.Client = transfer.New(&http.Client{Transport: ct}).WithGuard(loopback(t))
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return New(cfg, nil, log), ct
}

func randomFile(t *testing.T, path string, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestADeliveryBetweenTwoHTTPStoragesIsAThirdPartyCopyAndNoBytesPassThroughTheDeliverer(t *testing.T) {
	src, dst := newStore(t, nil), newStore(t, &httpstore.CopyOptions{})
	const size = 4 << 20
	data := randomFile(t, filepath.Join(src.dir, "f"), size)
	sum, _ := checksum.File(filepath.Join(src.dir, "f"), "adler32")
	s, through := deliverer(t, src.srv, Config{}, nil)
	d := dtr.DTR{ID: uuid.New(), Source: src.url("f"), Destination: dst.url("g"), Size: size,
		TransferGrant: uuid.NewString() + ".1", Options: dtr.Options{Checksum: sum}}
	var reported atomic.Int64
	res := s.Handle(context.Background(), api.Grant{DTR: &d}, func(b, _ int64) { reported.Store(b) })
	if res.Error != nil {
		t.Fatal(res.Error)
	}
	if res.TransferMethod != dtr.TransferPull || res.Size != size || res.Checksum != sum || res.ChecksumUnverified != "" {
		t.Errorf("result %+v; want a verified pull of %d bytes", res, size)
	}
	if got, _ := os.ReadFile(filepath.Join(dst.dir, "g")); !bytes.Equal(got, data) {
		t.Fatal("the destination does not hold the source's bytes")
	}
	if n := through.n.Load(); n > 64<<10 {
		t.Errorf("%d bytes passed through the deliverer", n)
	}
	if reported.Load() != size {
		t.Errorf("progress reported %d bytes", reported.Load())
	}
}

func TestTheTPCOptionDecidesHowABytesMoveAndARefusalFallsBackOrFails(t *testing.T) {
	refuse := func() *httpstore.CopyOptions { return &httpstore.CopyOptions{Refuse: httpstore.RefuseStatus} }
	line := func() *httpstore.CopyOptions { return &httpstore.CopyOptions{Refuse: httpstore.RefuseFailureLine} }
	copies := func() *httpstore.CopyOptions { return &httpstore.CopyOptions{} }
	tests := []struct {
		name     string
		tpc      dtr.TPCMode
		src, dst *httpstore.CopyOptions
		local    bool // a file:// source
		method   string
		kind     dtr.ErrorKind
		text     string
	}{
		{"auto: the destination pulls", "", nil, copies(), false, dtr.TransferPull, "", ""},
		{"auto: the destination refuses, the source pushes", dtr.TPCAuto, copies(), refuse(), false, dtr.TransferPush, "", ""},
		{"auto: both refuse, streamed", "", line(), refuse(), false,
			"streamed: the destination refuses to pull (copy " + "DST" + ": no third-party copy: the storage refuses COPY: HTTP 501 Not Implemented: third-party copy is not implemented here); the source refuses to push", "", ""},
		{"auto: a local source is streamed", "", nil, copies(), true, dtr.TransferStreamed, "", ""},
		{"never: streamed though both could copy", dtr.TPCNever, copies(), copies(), false, dtr.TransferStreamed, "", ""},
		{"only: both refuse", dtr.TPCOnly, nil, refuse(), false, "", dtr.ErrPermanentRemote,
			"tpc is only, and no third-party copy could be made: the destination refuses to pull"},
		{"only: a local source", dtr.TPCOnly, nil, copies(), true, "", dtr.ErrPermanentRemote,
			"tpc is only, but a third-party copy needs http, https, dav or davs at both ends: this transfer is from file:// to https://"},
		{"only: the destination pulls", dtr.TPCOnly, nil, copies(), false, dtr.TransferPull, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, dst := newStore(t, tt.src), newStore(t, tt.dst)
			data := randomFile(t, filepath.Join(src.dir, "f"), 100<<10)
			source := src.url("f")
			if tt.local {
				source = "file://" + filepath.Join(src.dir, "f")
			}
			s, _ := deliverer(t, src.srv, Config{}, nil)
			d := dtr.DTR{ID: uuid.New(), Source: source, Destination: dst.url("g"), Size: int64(len(data)),
				TransferGrant: uuid.NewString() + ".1", Options: dtr.Options{TPC: tt.tpc}}
			res := s.Handle(context.Background(), api.Grant{DTR: &d}, func(int64, int64) {})
			if tt.kind != "" {
				if res.Error == nil || res.Error.Kind != tt.kind || !strings.Contains(res.Error.Text, tt.text) {
					t.Fatalf("error %+v; want %s saying %q", res.Error, tt.kind, tt.text)
				}
				if _, err := os.Stat(filepath.Join(dst.dir, "g")); !os.IsNotExist(err) {
					t.Errorf("a refused transfer wrote its destination: %v", err)
				}
				return
			}
			if res.Error != nil {
				t.Fatal(res.Error)
			}
			want := strings.ReplaceAll(tt.method, "DST", dst.url("g"))
			if !strings.HasPrefix(res.TransferMethod, want) {
				t.Errorf("transfer method %q, want %q", res.TransferMethod, want)
			}
			if got, _ := os.ReadFile(filepath.Join(dst.dir, "g")); !bytes.Equal(got, data) {
				t.Error("the destination does not hold the source's bytes")
			}
			if tt.tpc == dtr.TPCNever {
				for _, o := range []*httpstore.CopyOptions{tt.src, tt.dst} {
					if len(o.Headers()) != 0 {
						t.Error("a storage was asked to copy under tpc never")
					}
				}
			}
		})
	}
}

func TestAStalledThirdPartyCopyFailsAsTooSlowAndTheStorageStopsCopying(t *testing.T) {
	// The source sends a little and then nothing: the destination's
	// markers keep coming with the same count.
	ended := make(chan struct{}, 4)
	src := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			w.Header().Set("Content-Length", fmt.Sprint(1<<30))
			return
		}
		defer func() { ended <- struct{}{} }()
		w.Header().Set("Content-Length", fmt.Sprint(1<<30))
		w.Write(make([]byte, 64<<10))
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(src.Close)
	dst := newStore(t, &httpstore.CopyOptions{MarkerEvery: 20 * time.Millisecond})
	s, _ := deliverer(t, src, Config{MaxInactivity: 300 * time.Millisecond}, nil)
	d := dtr.DTR{ID: uuid.New(), Source: src.URL + "/f", Destination: dst.url("g"), TransferGrant: uuid.NewString() + ".1"}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res := s.Handle(ctx, api.Grant{DTR: &d}, func(int64, int64) {})
	if res.Error == nil || res.Error.Kind != dtr.ErrTransferSpeed || !strings.Contains(res.Error.Text, "no data moved for") ||
		res.Error.Location != dtr.LocationSource || res.TransferMethod != dtr.TransferPull {
		t.Fatalf("result %+v, error %+v; want a pull that failed as too slow at the source", res, res.Error)
	}
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the storage still reads the source")
	}
	deadline := time.Now().Add(10 * time.Second)
	for dst.copy.Aborted() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the storage did not abort its copy")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if entries, _ := os.ReadDir(dst.dir); len(entries) != 0 {
		t.Errorf("the storage kept %v", entries)
	}
}

func TestNoTokenOfAThirdPartyCopyReachesTheLogOrTheResult(t *testing.T) {
	// The destination echoes what it was sent into its failure line.
	dst := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "failure: status code 403 with %s and %s\n", r.Header.Get("Authorization"), r.Header.Get("TransferHeaderAuthorization"))
	}))
	t.Cleanup(dst.Close)
	src := newStore(t, nil)
	randomFile(t, filepath.Join(src.dir, "f"), 1000)
	var logged bytes.Buffer
	secrets := []string{"destination-secret", "source-secret"}
	s, _ := deliverer(t, dst, Config{}, slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug})))
	host := func(srv *httptest.Server) string { u, _ := url.Parse(srv.URL); return u.Host }
	tokens := map[string]string{}
	for i, srv := range []*httptest.Server{dst, src.srv} {
		p := filepath.Join(t.TempDir(), "token")
		os.WriteFile(p, []byte(secrets[i]), 0o600)
		tokens[host(srv)] = p
	}
	s.client = s.client.WithTokens(tokens)
	d := dtr.DTR{ID: uuid.New(), Source: src.url("f"), Destination: dst.URL + "/g", TransferGrant: uuid.NewString() + ".1"}
	res := s.Handle(context.Background(), api.Grant{DTR: &d}, func(int64, int64) {})
	if res.Error == nil || res.Error.Kind != dtr.ErrPermanentRemote {
		t.Fatalf("error %+v; want the storage's refusal", res.Error)
	}
	out := fmt.Sprintf("%s %+v %+v", logged.String(), res, *res.Error)
	for _, secret := range secrets {
		if strings.Contains(out, secret) {
			t.Errorf("%q is in the log or the result:\n%s", secret, out)
		}
	}
	if !strings.Contains(logged.String(), "third-party copy") {
		t.Errorf("the copy was not logged:\n%s", logged.String())
	}
}

func TestAFileBetweenTwoPlainWebDAVServersIsStreamedSayingWhy(t *testing.T) {
	dirs := [2]string{t.TempDir(), t.TempDir()}
	var urls [2]string
	for i, dir := range dirs {
		srv := httptest.NewServer(&webdav.Handler{FileSystem: webdav.Dir(dir), LockSystem: webdav.NewMemLS()})
		t.Cleanup(srv.Close)
		urls[i] = strings.Replace(srv.URL, "http://", "dav://", 1)
	}
	data := randomFile(t, filepath.Join(dirs[0], "f"), 50000)
	plain := httptest.NewServer(http.NotFoundHandler()) // no TLS here: any transport will do
	t.Cleanup(plain.Close)
	for _, mode := range []dtr.TPCMode{dtr.TPCAuto, dtr.TPCOnly} {
		s, _ := deliverer(t, plain, Config{}, nil)
		d := dtr.DTR{ID: uuid.New(), Source: urls[0] + "/f", Destination: urls[1] + "/g", Size: int64(len(data)),
			TransferGrant: uuid.NewString() + ".1", Options: dtr.Options{TPC: mode}}
		res := s.Handle(context.Background(), api.Grant{DTR: &d}, func(int64, int64) {})
		if mode == dtr.TPCOnly {
			if res.Error == nil || res.Error.Kind != dtr.ErrPermanentRemote || !strings.Contains(res.Error.Text, "no third-party copy could be made") {
				t.Errorf("tpc only: error %+v; want the refusal", res.Error)
			}
			continue
		}
		if res.Error != nil {
			t.Fatal(res.Error)
		}
		if !strings.HasPrefix(res.TransferMethod, "streamed: the destination refuses to pull") || !strings.Contains(res.TransferMethod, "HTTP 502 Bad Gateway") {
			t.Errorf("transfer method %q", res.TransferMethod)
		}
		tmp := strings.TrimPrefix(transfer.TempURLOf(&d), urls[1])
		if got, _ := os.ReadFile(filepath.Join(dirs[1], tmp)); !bytes.Equal(got, data) {
			t.Errorf("the temporary file %s does not hold the source's bytes", tmp)
		}
	}
}

func TestAThirdPartyCopyCarriesTheTransfersSciTagToTheStorageThatCopies(t *testing.T) {
	tags, err := scitag.New(scitag.Config{Experiments: "atlas=2,cms=3", Activities: "default=1,Production Input=2"})
	if err != nil {
		t.Fatal(err)
	}
	src, dst := newStore(t, nil), newStore(t, &httpstore.CopyOptions{})
	randomFile(t, filepath.Join(src.dir, "f"), 1000)
	s, _ := deliverer(t, src.srv, Config{SciTags: tags}, nil)
	d := dtr.DTR{ID: uuid.New(), Source: src.url("f"), Destination: dst.url("g"), TransferGrant: uuid.NewString() + ".1",
		Owner: dtr.Identity{DN: "/CN=x", FQANs: []string{"/cms/Role=production"}}, Options: dtr.Options{Activity: "Production Input"}}
	if res := s.Handle(context.Background(), api.Grant{DTR: &d}, func(int64, int64) {}); res.Error != nil || res.TransferMethod != dtr.TransferPull {
		t.Fatalf("result %+v, error %+v; want a pull", res, res.Error)
	}
	if got := dst.copy.Headers()[0].Get(transfer.HeaderSciTag); got != "194" {
		t.Errorf("the COPY carried SciTag %q, want 194 (cms 3 << 6 | Production Input 2)", got)
	}
}
