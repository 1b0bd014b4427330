package transfer

import (
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// Storages that keep no checksums. Sluice asks for the stored checksum of
// what it reads (Want-Digest, RFC 3230) on every GET and HEAD. Some
// storages refuse the whole request for it: Debian's xrootd 5.5 over HTTP
// without xrootd.chksum configured answers 405 to a HEAD or GET of an
// existing file that carries Want-Digest, and 500 ("failed to calculate
// checksum") to a GET of a missing one, which is really a 404. So a
// request refused that way is sent again once without Want-Digest, and
// its answer is the one that counts; the checksum is then only the one
// computed on the stream (CopyResult.SourceChecksum stays empty, and the
// DTR's checksum_source says "stream").
//
// A host that refused Want-Digest, while the same request without it was
// answered otherwise, is remembered for wantDigestMemory (at most
// wantDigestHosts hosts), so that its later requests go without the
// header and take one round trip, not two. A 500 only causes the retry:
// a storage that computes checksums can still fail to for one file.

// wantDigestRefusals are the statuses of a storage that does not take the
// Want-Digest header (bad request, method not allowed, not implemented),
// against wantDigestRetried, those retried without it but not remembered.
var (
	wantDigestRefusals = map[int]bool{http.StatusBadRequest: true, http.StatusMethodNotAllowed: true, http.StatusNotImplemented: true}
	wantDigestRetried  = map[int]bool{http.StatusInternalServerError: true}
)

const (
	// wantDigestMemory is how long a host that refused Want-Digest is
	// sent none: a storage configured to keep checksums meanwhile is asked
	// again after it.
	wantDigestMemory = time.Hour
	// wantDigestHosts bounds the hosts remembered; the one remembered
	// longest ago makes room for a new one.
	wantDigestHosts = 1024
)

// hostMemory is a bounded set of hosts ("scheme://host:port"), each
// remembered for a while. It is safe for concurrent use.
type hostMemory struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu    sync.Mutex
	hosts map[string]time.Time // when each was remembered
}

func newHostMemory(ttl time.Duration, maxHosts int) *hostMemory {
	return &hostMemory{ttl: ttl, max: maxHosts, now: time.Now, hosts: map[string]time.Time{}}
}

// hostKey is the scheme, host and port of u.
func hostKey(u *url.URL) string {
	return u.Scheme + "://" + net.JoinHostPort(u.Hostname(), portOf(u))
}

// has reports whether u's host is remembered, forgetting it if its time
// is up.
func (m *hostMemory) has(u *url.URL) bool {
	key := hostKey(u)
	m.mu.Lock()
	defer m.mu.Unlock()
	at, ok := m.hosts[key]
	if ok && m.now().Sub(at) >= m.ttl {
		delete(m.hosts, key)
		return false
	}
	return ok
}

// add remembers u's host.
func (m *hostMemory) add(u *url.URL) {
	key := hostKey(u)
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.hosts[key]; !ok && len(m.hosts) >= m.max {
		oldest, first := "", time.Time{}
		for k, at := range m.hosts {
			if oldest == "" || at.Before(first) {
				oldest, first = k, at
			}
		}
		delete(m.hosts, oldest)
	}
	m.hosts[key] = m.now()
}

// len is how many hosts are remembered.
func (m *hostMemory) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.hosts)
}
