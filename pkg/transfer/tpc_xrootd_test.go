package transfer_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/token/tokentest"
	"github.com/sluice-dtr/sluice/pkg/transfer"
	"github.com/sluice-dtr/sluice/pkg/transfer/xrootdtest"
)

// xrootdPair starts two real xrootd servers of one CA that copy between
// each other, both keeping adler32 checksums.
func xrootdPair(t *testing.T, tokens *xrootdtest.Tokens) (ca *xrootdtest.CA, a, b *xrootdtest.Server) {
	t.Helper()
	ca = xrootdtest.NewCA(t)
	a = xrootdtest.Start(t, xrootdtest.Options{TPC: true, CA: ca, Checksum: "adler32", Tokens: tokens})
	b = xrootdtest.Start(t, xrootdtest.Options{TPC: true, CA: ca, Checksum: "adler32", Tokens: tokens})
	return ca, a, b
}

// caClient is a Client that trusts ca, reaches loopback and counts the
// bytes that pass through it. Unlike ca.Client it has no overall timeout.
func caClient(ca *xrootdtest.CA) (*transfer.Client, *countingTransport) {
	ct := &countingTransport{base: ca.Client().Transport}
	return transfer.New(&http.Client{Transport: ct}).WithGuard(loopback), ct
}

func TestAThirdPartyCopyBetweenTwoRealXrootdServersMovesNoBytesThroughSluice(t *testing.T) {
	ca, a, b := xrootdPair(t, nil)
	const size = 32 << 20
	data := make([]byte, size)
	rand.Read(data)
	a.WriteFile(t, "/data/f", data)
	want := func() string { h, _ := checksum.New("adler32"); h.Write(data); return checksum.Format("adler32", h) }()
	for _, mode := range []transfer.ThirdPartyMode{transfer.ThirdPartyPull, transfer.ThirdPartyPush} {
		t.Run(string(mode), func(t *testing.T) {
			c, counted := caClient(ca)
			var last atomic.Int64
			dst := b.HTTPS + "/out/" + string(mode)
			b.MkdirAll(t, "/out")
			res, err := c.ThirdPartyCopy(context.Background(), a.HTTPS+"/data/f", dst, transfer.ThirdPartyOptions{
				Mode: mode, ExpectedSize: size, Checksum: want, Progress: func(n int64) { last.Store(n) }})
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(b.Path("/out/" + string(mode)))
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("the destination has %d bytes (%v), not the source's %d", len(got), err, size)
			}
			if res.Bytes != size || res.Checksum != want || res.ReadBack != 0 {
				t.Errorf("result %+v; want %d bytes and the storage's checksum %s", res, size, want)
			}
			if last.Load() != size {
				t.Errorf("progress ended at %d", last.Load())
			}
			if n := counted.n.Load(); n > 64<<10 {
				t.Errorf("%d bytes passed through Sluice for a third-party copy of %d", n, size)
			}
		})
	}
}

func TestARealXrootdThirdPartyCopyWithSciTokensCarriesEachStoragesOwnToken(t *testing.T) {
	is := tokentest.Start(t)
	const aud = "https://storage.example"
	ca, a, b := xrootdPair(t, &xrootdtest.Tokens{Issuer: is.URL, Audience: []string{aud}})
	a.WriteFile(t, "/data/f", []byte("scoped third-party copy"))
	b.MkdirAll(t, "/out")
	// Each token names exactly the access asked for, on the file's
	// directory: xrootd then takes only what the request needs.
	var minted, asked []string
	mint := func(u *url.URL, access transfer.Access) string {
		scope := string(access) + ":" + path.Dir(u.Path)
		scopes := []string{scope}
		if access == transfer.AccessModify {
			// As the storage token source does: xrootd deletes only with
			// storage.read beside storage.modify.
			scopes = append(scopes, string(transfer.AccessRead)+":"+path.Dir(u.Path))
		}
		tok := is.Mint(t, tokentest.Mint{Subject: "sluice", Audience: []string{aud}, Scopes: scopes, NotBefore: time.Now().Add(-time.Minute)})
		minted, asked = append(minted, tok), append(asked, scope)
		return tok
	}
	c, _ := caClient(ca)
	c = c.WithTokenSource(func(ctx context.Context, u *url.URL, access transfer.Access) (string, error) {
		return mint(u, access), nil
	})
	res, err := c.ThirdPartyCopy(context.Background(), a.HTTPS+"/data/f", b.HTTPS+"/out/g", transfer.ThirdPartyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(b.Path("/out/g")); string(got) != "scoped third-party copy" || res.Bytes != int64(len(got)) {
		t.Fatalf("the destination has %q", got)
	}
	// The source's token, for the storage to read with, and the
	// destination's, to create the file (and to read its size and
	// checksum after).
	for _, want := range []string{"storage.read:/data", "storage.create:/out", "storage.read:/out"} {
		if !slices.Contains(asked, want) {
			t.Errorf("tokens asked for %v; want one of %s", asked, want)
		}
	}
	// Without the source's token (a source Sluice has no credentials for)
	// the source refuses the storage, and the error says so, with no token.
	c2, _ := caClient(ca)
	c2 = c2.WithTokenSource(func(ctx context.Context, u *url.URL, access transfer.Access) (string, error) {
		if !strings.HasPrefix(u.Path, "/out") {
			return "", nil
		}
		return mint(u, access), nil
	})
	_, err = c2.ThirdPartyCopy(context.Background(), a.HTTPS+"/data/f", b.HTTPS+"/out/h", transfer.ThirdPartyOptions{})
	if err == nil || transfer.KindOf(err) != dtr.ErrPermanentRemote || errors.Is(err, transfer.ErrNoThirdPartyCopy) {
		t.Fatalf("error %v; want the source's refusal, for good", err)
	}
	for _, tok := range minted {
		if strings.Contains(err.Error(), tok) {
			t.Fatal("the error holds a token")
		}
	}
	if _, err := os.Stat(b.Path("/out/h")); !os.IsNotExist(err) {
		t.Errorf("the failed copy left its file: %v", err)
	}
}

// caDrip is an HTTPS server with a certificate of ca that serves a large
// file slowly; ended gets a value when a request of it ends.
func caDrip(t *testing.T, ca *xrootdtest.CA, stall bool) (srv *httptest.Server, ended <-chan struct{}) {
	t.Helper()
	ch := make(chan struct{}, 16)
	srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { ch <- struct{}{} }()
		w.Header().Set("Content-Length", fmt.Sprint(1<<30))
		chunk := make([]byte, 64<<10)
		for i := 0; ; i++ {
			if !stall || i < 4 {
				if _, err := w.Write(chunk); err != nil {
					return
				}
				http.NewResponseController(w).Flush()
			}
			select {
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}))
	srv.TLS = ca.TLSConfig(t)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, ch
}

func TestCancellingAThirdPartyCopyStopsTheRealXrootdsCopy(t *testing.T) {
	ca := xrootdtest.NewCA(t)
	b := xrootdtest.Start(t, xrootdtest.Options{TPC: true, CA: ca, Checksum: "adler32"})
	src, ended := caDrip(t, ca, false)
	c, _ := caClient(ca)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var moved atomic.Int64
	done := make(chan error, 1)
	go func() {
		_, err := c.ThirdPartyCopy(ctx, src.URL+"/f", b.HTTPS+"/g", transfer.ThirdPartyOptions{Progress: moved.Store})
		done <- err
	}()
	// xrootd sends a marker every few seconds.
	deadline := time.Now().Add(30 * time.Second)
	for moved.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no progress from xrootd in 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want cancelled", err)
	}
	// xrootd notices at its next marker that no one listens, and stops
	// reading the source.
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("xrootd still reads the source 30 s after the copy was cancelled")
	}
	// The partial file is removed (by Sluice's DELETE after the cancel, or
	// by xrootd) and nothing grows there.
	time.Sleep(500 * time.Millisecond)
	if fi, err := os.Stat(b.Path("/g")); err == nil {
		t.Errorf("the partial file is left, %d bytes", fi.Size())
	}
}

func TestARealXrootdWithoutTheThirdPartyCopyHandlerRefusesCopy(t *testing.T) {
	ca := xrootdtest.NewCA(t)
	a := xrootdtest.Start(t, xrootdtest.Options{TPC: true, CA: ca, Checksum: "adler32"})
	b := xrootdtest.Start(t, xrootdtest.Options{HTTP: true, CA: ca, Checksum: "adler32"})
	a.WriteFile(t, "/f", []byte("x"))
	c, _ := caClient(ca)
	_, err := c.ThirdPartyCopy(context.Background(), a.HTTPS+"/f", b.HTTPS+"/g", transfer.ThirdPartyOptions{})
	if !errors.Is(err, transfer.ErrNoThirdPartyCopy) || transfer.KindOf(err) != dtr.ErrPermanentRemote {
		t.Fatalf("error %v; want a refusal of third-party copy", err)
	}
	if _, err := os.Stat(b.Path("/g")); !os.IsNotExist(err) {
		t.Errorf("the destination exists: %v", err)
	}
}
