package delivery

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// closeDelimited serves every GET with 200, no Content-Length and the
// bytes body writes, ended by closing the connection.
func closeDelimited(t *testing.T, body func(w io.Writer)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				if _, err := http.ReadRequest(bufio.NewReader(conn)); err != nil {
					return
				}
				io.WriteString(conn, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
				body(conn)
			}()
		}
	}()
	return "http://" + l.Addr().String() + "/f"
}

func TestDeliveryHoldsTheSourceToItsQueriedSizeAndTheMaximumFileSize(t *testing.T) {
	bytesOf := func(n int) func(io.Writer) {
		return func(w io.Writer) { w.Write(make([]byte, n)) }
	}
	endless := func(w io.Writer) {
		buf := make([]byte, 64<<10)
		for {
			if _, err := w.Write(buf); err != nil {
				return
			}
		}
	}
	tests := []struct {
		name    string
		body    func(io.Writer)
		queried int64 // d.Size, from QUERY_REPLICA
		max     int64 // SLUICE_DELIVERY_MAX_FILE_SIZE
		kind    dtr.ErrorKind
		text    string
	}{
		{"the size queried is delivered", bytesOf(1000), 1000, 1 << 20, "", ""},
		{"a size unknown is delivered", bytesOf(1000), 0, 1 << 20, "", ""},
		{"fewer bytes than queried", bytesOf(900), 1000, 1 << 20, dtr.ErrTemporaryRemote,
			"size changed: the source had 1000 bytes when queried, 900 were read"},
		{"more bytes than queried", bytesOf(1100), 1000, 1 << 20, dtr.ErrTemporaryRemote,
			"size changed: the source had 1000 bytes when queried, more were read"},
		{"an endless source past the maximum", endless, 0, 1 << 20, dtr.ErrPermanentRemote,
			"the source is larger than the maximum file size of 1048576 bytes"},
		{"a queried size past the maximum", bytesOf(1000), 1000, 999, dtr.ErrPermanentRemote,
			"the source has 1000 bytes, more than the maximum file size of 999 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			d := dtr.DTR{ID: uuid.New(), Source: closeDelimited(t, tt.body), Destination: "file://" + filepath.Join(dir, "f"),
				Size: tt.queried, TransferGrant: uuid.NewString() + ".1"}
			s := New(Config{MaxFileSize: tt.max, Client: transfer.New(nil).WithGuard(loopback(t))}, nil, slog.New(slog.DiscardHandler))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			res := s.Handle(ctx, api.Grant{DTR: &d}, func(int64, int64) {})
			tmp, _ := transfer.LocalPath(transfer.TempURLOf(&d))
			if tt.kind == "" {
				if res.Error != nil || res.Size != 1000 {
					t.Fatalf("result %+v, error %+v; want 1000 bytes delivered", res, res.Error)
				}
				return
			}
			if res.Error == nil || res.Error.Kind != tt.kind || !strings.Contains(res.Error.Text, tt.text) {
				t.Fatalf("error %+v; want %s saying %q", res.Error, tt.kind, tt.text)
			}
			// The source's fault: another replica is tried first.
			if res.Error.Location != dtr.LocationSource {
				t.Errorf("failure located at %q, want the source", res.Error.Location)
			}
			// A failed result carries no size: the scheduler would take
			// the bytes moved for the file's size and expect them next time.
			if res.Size != 0 {
				t.Errorf("a failed delivery reports size %d", res.Size)
			}
			if _, err := os.Stat(tmp); !os.IsNotExist(err) {
				t.Errorf("the temporary file is left: %v", err)
			}
		})
	}
}

func TestADTRWhoseSourceIsALoopbackPortFailsForGoodWithoutReachingIt(t *testing.T) {
	// A NATS monitoring port, as far as delivery can tell; loopback is not
	// allowed (no SLUICE_ALLOW_NETWORKS).
	var hits atomic.Int32
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, `{"connections":[]}`)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	src := "http://" + l.Addr().String() + "/connz"
	d := dtr.DTR{ID: uuid.New(), Source: src, Destination: "file://" + filepath.Join(t.TempDir(), "connz"),
		TransferGrant: uuid.NewString() + ".1"}
	res := New(Config{}, nil, slog.New(slog.DiscardHandler)).Handle(context.Background(), api.Grant{DTR: &d}, func(int64, int64) {})
	want := "copy " + src + ": connection to " + l.Addr().String() + " refused: it is loopback; SLUICE_ALLOW_NETWORKS does not allow it"
	if res.Error == nil || res.Error.Kind != dtr.ErrPermanentRemote || res.Error.Text != want || res.Error.Location != dtr.LocationSource {
		t.Fatalf("error %+v, want PERMANENT_REMOTE at the source saying %q", res.Error, want)
	}
	if res.Error.Kind.Retryable() {
		t.Fatal("a refused address is retried")
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the loopback server got %d requests", n)
	}
	tmp, _ := transfer.LocalPath(transfer.TempURLOf(&d))
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("a temporary file is left: %v", err)
	}
}

// loopback lets a test's servers, on loopback, be reached: the default
// Guard refuses loopback addresses.
func loopback(t *testing.T) *transfer.Guard {
	t.Helper()
	g, err := transfer.NewGuard("127.0.0.0/8", "::1")
	if err != nil {
		t.Fatal(err)
	}
	return g
}
