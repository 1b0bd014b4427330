package delivery

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/token/tokentest"
	"github.com/sluice-dtr/sluice/pkg/transfer"
	"github.com/sluice-dtr/sluice/pkg/transfer/xrootdtest"
)

func TestADeliveryBetweenRealXrootdServersPullsOrPushesOrStreamsAsTheyAllow(t *testing.T) {
	ca := xrootdtest.NewCA(t)
	copying := xrootdtest.Options{TPC: true, CA: ca, Checksum: "adler32"}
	plain := xrootdtest.Options{HTTP: true, CA: ca, Checksum: "adler32"}
	withTPC, withTPC2 := xrootdtest.Start(t, copying), xrootdtest.Start(t, copying)
	without, without2 := xrootdtest.Start(t, plain), xrootdtest.Start(t, plain)
	data := bytes.Repeat([]byte("grid bytes "), 300000)
	for _, s := range []*xrootdtest.Server{withTPC, without} {
		s.WriteFile(t, "/data/f", data)
	}
	tests := []struct {
		name     string
		src, dst *xrootdtest.Server
		method   string
	}{
		{"both copy: the destination pulls", withTPC, withTPC2, dtr.TransferPull},
		{"the destination does not copy: the source pushes", withTPC, without2, dtr.TransferPush},
		{"neither copies: streamed, saying why", without, without2, "streamed: the destination refuses to pull"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ct := &counter{base: ca.Client().Transport}
			s := New(Config{Client: transfer.New(&http.Client{Transport: ct}).WithGuard(loopback(t))}, nil, slog.New(slog.DiscardHandler))
			name := "/out" + string(rune('a'+i))
			d := dtr.DTR{ID: uuid.New(), Source: tt.src.HTTPS + "/data/f", Destination: tt.dst.HTTPS + name,
				Size: int64(len(data)), TransferGrant: uuid.NewString() + ".1"}
			res := s.Handle(context.Background(), api.Grant{DTR: &d}, func(int64, int64) {})
			if res.Error != nil {
				t.Fatal(res.Error)
			}
			if !strings.HasPrefix(res.TransferMethod, tt.method) {
				t.Errorf("transfer method %q, want %q", res.TransferMethod, tt.method)
			}
			if got, err := os.ReadFile(tt.dst.Path(name)); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("the destination has %d bytes (%v), want %d", len(got), err, len(data))
			}
			if res.ChecksumUnverified != "" || !strings.HasPrefix(res.Checksum, "adler32:") {
				t.Errorf("checksum %q, unverified %q", res.Checksum, res.ChecksumUnverified)
			}
			through := ct.n.Load()
			if streamed := strings.HasPrefix(res.TransferMethod, dtr.TransferStreamed); streamed != (through >= int64(2*len(data))) || !streamed && through > 64<<10 {
				t.Errorf("%d bytes passed through the deliverer for %q", through, res.TransferMethod)
			}
		})
	}
}

func TestAStalledCopyOfTheRealXrootdFailsAsTooSlowAndXrootdStopsReadingTheSource(t *testing.T) {
	ca := xrootdtest.NewCA(t)
	dst := xrootdtest.Start(t, xrootdtest.Options{TPC: true, CA: ca, Checksum: "adler32"})
	// A source that sends 256 KiB of a large file, then nothing.
	ended := make(chan struct{}, 4)
	src := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(1<<30))
		if r.Method == http.MethodHead {
			return
		}
		defer func() { ended <- struct{}{} }()
		w.Write(make([]byte, 256<<10))
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
	}))
	src.TLS = ca.TLSConfig(t)
	src.StartTLS()
	t.Cleanup(src.Close)
	// xrootd sends a marker every 5 s: the window is longer than that.
	s := New(Config{MaxInactivity: 8 * time.Second, Client: transfer.New(&http.Client{Transport: ca.Client().Transport}).WithGuard(loopback(t))},
		nil, slog.New(slog.DiscardHandler))
	d := dtr.DTR{ID: uuid.New(), Source: src.URL + "/f", Destination: dst.HTTPS + "/g", TransferGrant: uuid.NewString() + ".1"}
	res := s.Handle(context.Background(), api.Grant{DTR: &d}, func(int64, int64) {})
	if res.Error == nil || res.Error.Kind != dtr.ErrTransferSpeed || !strings.Contains(res.Error.Text, "no data moved for") {
		t.Fatalf("error %+v; want too slow", res.Error)
	}
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("xrootd still reads the stalled source 30 s after the transfer failed")
	}
	if fi, err := os.Stat(dst.Path("/g")); err == nil {
		t.Errorf("the partial file is left, %d bytes", fi.Size())
	}
}

func TestADeliveryBetweenRealXrootdServersWithSciTokensLogsNoToken(t *testing.T) {
	is := tokentest.Start(t)
	const aud = "https://storage.example"
	ca := xrootdtest.NewCA(t)
	tokens := &xrootdtest.Tokens{Issuer: is.URL, Audience: []string{aud}}
	src := xrootdtest.Start(t, xrootdtest.Options{TPC: true, CA: ca, Checksum: "adler32", Tokens: tokens})
	dst := xrootdtest.Start(t, xrootdtest.Options{TPC: true, CA: ca, Checksum: "adler32", Tokens: tokens})
	src.WriteFile(t, "/data/f", []byte("tokens stay secret"))
	src.WriteFile(t, "/private/f", []byte("no token reads this"))
	dst.MkdirAll(t, "/out")
	var mu sync.Mutex
	var minted []string
	var logged bytes.Buffer
	client := transfer.New(&http.Client{Transport: ca.Client().Transport}).WithGuard(loopback(t)).WithTokenSource(
		func(ctx context.Context, u *url.URL, _ transfer.Access) (string, error) {
			scope := "storage.read:/data"
			if strings.HasPrefix(u.Path, "/out") {
				scope = "storage.create:/out storage.modify:/out storage.read:/out"
			}
			tok := is.Mint(t, tokentest.Mint{Subject: "sluice", Audience: []string{aud}, Scopes: strings.Fields(scope), NotBefore: time.Now().Add(-time.Minute)})
			mu.Lock()
			minted = append(minted, tok)
			mu.Unlock()
			return tok, nil
		})
	s := New(Config{Client: client}, nil, slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug})))
	var results []string
	for _, name := range []string{"/data/f", "/private/f"} {
		d := dtr.DTR{ID: uuid.New(), Source: src.HTTPS + name, Destination: dst.HTTPS + "/out" + strings.ReplaceAll(name, "/", "-"),
			TransferGrant: uuid.NewString() + ".1"}
		res := s.Handle(context.Background(), api.Grant{DTR: &d}, func(int64, int64) {})
		results = append(results, fmt.Sprintf("%+v %+v", res, res.Error))
		switch {
		case name == "/data/f" && (res.Error != nil || res.TransferMethod != dtr.TransferPull):
			t.Errorf("%s: %+v %+v; want a pull", name, res, res.Error)
		case name == "/private/f" && (res.Error == nil || res.Error.Kind != dtr.ErrPermanentRemote || !strings.Contains(res.Error.Text, "403")):
			t.Errorf("%s: %+v; want the source's 403 for a path the token does not cover", name, res.Error)
		}
	}
	out := logged.String() + strings.Join(results, "\n")
	mu.Lock()
	defer mu.Unlock()
	if len(minted) == 0 {
		t.Fatal("no token was asked for")
	}
	for _, tok := range minted {
		if strings.Contains(out, tok) || strings.Contains(out, tok[:40]) {
			t.Fatalf("a token is in the log or a result:\n%s", out)
		}
	}
}

func TestAThirdPartyCopyBetweenRealXrootdServersWithoutChecksumsSaysWhatWasVerified(t *testing.T) {
	ca := xrootdtest.NewCA(t)
	src := xrootdtest.Start(t, xrootdtest.Options{TPC: true, CA: ca})
	dst := xrootdtest.Start(t, xrootdtest.Options{TPC: true, CA: ca})
	data := bytes.Repeat([]byte("no checksums kept here "), 10000)
	src.WriteFile(t, "/f", data)
	sum := func() string { h, _ := checksum.New("adler32"); h.Write(data); return checksum.Format("adler32", h) }()
	tests := []struct {
		name, expected, unverified, source string
		readBack                           bool
	}{
		{"the job expects a checksum: the copy is read back", sum, "", dtr.ChecksumFromStream, true},
		{"the job expects none: nothing is compared, and the DTR says so", "", "the destination storage gives no adler32 checksum and the job expects none", "", false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ct := &counter{base: ca.Client().Transport}
			s := New(Config{Client: transfer.New(&http.Client{Transport: ct}).WithGuard(loopback(t))}, nil, slog.New(slog.DiscardHandler))
			d := dtr.DTR{ID: uuid.New(), Source: src.HTTPS + "/f", Destination: fmt.Sprintf("%s/g%d", dst.HTTPS, i), Size: int64(len(data)),
				TransferGrant: uuid.NewString() + ".1", Options: dtr.Options{Checksum: tt.expected}}
			res := s.Handle(context.Background(), api.Grant{DTR: &d}, func(int64, int64) {})
			if res.Error != nil {
				t.Fatal(res.Error)
			}
			if res.TransferMethod != dtr.TransferPull || res.ChecksumUnverified != tt.unverified || res.ChecksumSource != tt.source {
				t.Errorf("method %q, unverified %q, source %q; want a pull, %q, %q", res.TransferMethod, res.ChecksumUnverified, res.ChecksumSource, tt.unverified, tt.source)
			}
			if tt.readBack && res.Checksum != sum {
				t.Errorf("checksum %q, want %s read back", res.Checksum, sum)
			}
			// Only a read back moves the file's bytes through the deliverer.
			if n := ct.n.Load(); tt.readBack != (n >= int64(len(data))) {
				t.Errorf("%d bytes passed through the deliverer", n)
			}
		})
	}
}
