package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/httpstore"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// throttledStore serves dir like a storage behind a link: every download's
// bytes pass one shared budget of capacity bytes a second and a budget of
// perTransfer of their own, each answer waits latency first, and while
// failing is set every second GET is refused with 503.
type throttledStore struct {
	h                     http.Handler
	capacity, perTransfer float64
	latency               time.Duration
	failing               atomic.Bool
	gets                  atomic.Int64
	mu                    sync.Mutex
	next                  time.Time // when the shared budget has room again
}

func (s *throttledStore) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	time.Sleep(s.latency)
	if r.Method == http.MethodGet {
		if s.gets.Add(1)%2 == 0 && s.failing.Load() {
			http.Error(w, "storage overloaded", http.StatusServiceUnavailable)
			return
		}
		w = &pacedWriter{ResponseWriter: w, store: s, next: time.Now()}
	}
	s.h.ServeHTTP(w, r)
}

// reserve returns when n more bytes may go under the shared budget.
func (s *throttledStore) reserve(n int) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := time.Now()
	if s.next.After(at) {
		at = s.next
	}
	s.next = at.Add(time.Duration(float64(n) / s.capacity * float64(time.Second)))
	return at
}

// pacedWriter sends one download's bytes no faster than both budgets.
type pacedWriter struct {
	http.ResponseWriter
	store *throttledStore
	next  time.Time // when this download's own budget has room again
}

func (p *pacedWriter) Write(b []byte) (int, error) {
	written := 0
	for len(b) > 0 {
		n := min(len(b), 16<<10)
		at := p.store.reserve(n)
		if p.next.After(at) {
			at = p.next
		}
		p.next = at.Add(time.Duration(float64(n) / p.store.perTransfer * float64(time.Second)))
		time.Sleep(time.Until(at))
		m, err := p.ResponseWriter.Write(b[:n])
		written += m
		if err != nil {
			return written, err
		}
		b = b[n:]
	}
	return written, nil
}

// link asks the scheduler for the link from source.
func (s *system) link(source string) (api.LinkStatus, bool) {
	s.t.Helper()
	var r api.LinksReply
	body, _ := json.Marshal(api.LinksRequest{History: true})
	if err := s.request(api.SubjectLinks, body, nil, &r); err != nil {
		s.t.Fatal(err)
	}
	for _, l := range r.Links {
		if l.Source == source {
			return l, true
		}
	}
	return api.LinkStatus{}, false
}

// TestOptimizerRaisesALinksLimitAndHalvesItOnFailures runs the whole of
// Sluice against a storage whose link carries 8 MB/s, 0.5 MB/s per
// download: from 2 transfers the optimizer raises the link's limit while
// each transfer keeps its rate, and once the storage refuses every second
// download it cuts the limit. Only directions are asserted: rates on a
// loaded machine vary.
func TestOptimizerRaisesALinksLimitAndHalvesItOnFailures(t *testing.T) {
	cfg := testConfig()
	cfg.Optimizer, cfg.OptimizerMin, cfg.OptimizerMax, cfg.OptimizerStart = "on", 1, 16, 2
	cfg.OptimizerInterval = 3 * time.Second
	cfg.Lease = 6 * time.Second // workers report progress every 2 s
	cfg.MaxDelivery = 20
	cfg.Delivery.Workers = 20
	s := start(t, cfg)
	remote := filepath.Join(s.dir, "remote")
	store := &throttledStore{h: httpstore.Handler(remote), capacity: 8e6, perTransfer: 0.5e6, latency: 20 * time.Millisecond}
	base := httpServer(t, store)
	source := strings.TrimPrefix(base, "http://")

	j := &job.Job{Name: "links", Owner: dtr.Identity{DN: "/CN=alice"}}
	for i := 0; i < 150; i++ {
		writeFile(t, filepath.Join(remote, fmt.Sprintf("f%03d", i)), 1<<20, i)
		j.Inputs = append(j.Inputs, job.File{Source: fmt.Sprintf("%s/f%03d", base, i),
			Destination: fileURL(filepath.Join(s.dir, "session", fmt.Sprintf("f%03d", i)))})
	}
	s.submit(j)

	highest := 0
	deadline := time.Now().Add(40 * time.Second)
	for highest < 4 {
		if time.Now().After(deadline) {
			l, _ := s.link(source)
			t.Fatalf("the link's limit never rose from 2 to 4 in 40 s (highest %d): %+v", highest, l.History)
		}
		time.Sleep(500 * time.Millisecond)
		if l, ok := s.link(source); ok {
			highest = max(highest, l.Limit)
		}
	}

	store.failing.Store(true)
	deadline = time.Now().Add(40 * time.Second)
	for {
		l, _ := s.link(source)
		if l.Limit < highest && l.Last != nil && strings.Contains(l.Last.Reason, "failed") {
			for _, h := range l.History {
				t.Logf("%s running %.1f, %.1f MB/s, %d/%d failed, %d → %d: %s", h.At.Format(time.TimeOnly), h.Running, h.Throughput/1e6, h.Failed, h.Ended, h.From, h.Limit, h.Reason)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("with every second download refused the link's limit stayed at %d (highest %d): %+v", l.Limit, highest, l.History)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
