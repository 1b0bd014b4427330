package delivery

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/scitag"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// headerRecorder is an HTTP storage server on loopback that serves GET
// with 1000 bytes, takes PUT, and records the SciTag header of every
// request as "METHOD tag".
type headerRecorder struct {
	mu   sync.Mutex
	seen []string
}

func (h *headerRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.seen = append(h.seen, r.Method+" "+r.Header.Get(transfer.HeaderSciTag))
	h.mu.Unlock()
	switch r.Method {
	case http.MethodGet:
		w.Write(make([]byte, 1000))
	case http.MethodPut:
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

func (h *headerRecorder) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.seen
	h.seen = nil
	return out
}

func TestATransfersRequestsCarryTheSciTagOfItsOwnersVOAndActivity(t *testing.T) {
	rec := &headerRecorder{}
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	tags, err := scitag.New(scitag.Config{Experiments: "atlas=2,cms=3", Activities: "default=1,Production Input=2"})
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{Client: transfer.New(nil).WithGuard(loopback(t)), SciTags: tags}, nil, slog.New(slog.DiscardHandler))
	for _, tt := range []struct {
		name     string
		fqans    []string
		activity string
		chosen   int
		want     string
	}{
		{"cms production input", []string{"/cms/Role=production"}, "Production Input", 0, "194"}, // 3<<6 | 2
		{"atlas with no activity is atlas default", []string{"/atlas"}, "", 0, "129"},            // 2<<6 | 1
		{"a tag its trusted submitter chose", []string{"/lhcb"}, "", 5<<6 | 9, "329"},
		{"an unmapped VO sends none", []string{"/lhcb"}, "Production Input", 0, ""},
		{"no FQAN sends none", nil, "Production Input", 0, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// Streamed (tpc never): a third-party copy's COPY carries the
			// tag too (TestAThirdPartyCopyCarriesTheTransfersSciTag...).
			d := dtr.DTR{ID: uuid.New(), Source: srv.URL + "/in", Destination: srv.URL + "/out",
				Owner: dtr.Identity{DN: "/CN=x", FQANs: tt.fqans}, Options: dtr.Options{Activity: tt.activity, SciTag: tt.chosen, TPC: dtr.TPCNever},
				TransferGrant: uuid.NewString() + ".1"}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if res := s.Handle(ctx, api.Grant{DTR: &d}, func(int64, int64) {}); res.Error != nil {
				t.Fatalf("transfer failed: %+v", res.Error)
			}
			got := rec.take()
			want := []string{"GET " + tt.want, "PUT " + tt.want}
			if !slices.Equal(got, want) {
				t.Fatalf("storage saw %q, want %q", strings.Join(got, "; "), strings.Join(want, "; "))
			}
		})
	}
}
