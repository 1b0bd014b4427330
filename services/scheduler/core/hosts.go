package core

// Per-host limits: how many transfers run against each storage endpoint.

import (
	"math"
	"net/url"
	"strings"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// setHosts notes the storage endpoints of a DTR's ends.
func (c *Core) setHosts(e *entry) {
	for i, u := range [2]string{e.d.Source, e.d.Destination} {
		e.hosts[i] = 0
		if h := endpointOf(u); h != "" {
			e.hosts[i] = uint32(c.nameID(h)) + 1
		}
	}
}

// endpointOf returns the storage endpoint of a remote URL in its normal
// form (normalEndpoint), "" for a local file.
func endpointOf(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.Scheme == "file" || p.Host == "" {
		return ""
	}
	return normalEndpoint(p.Scheme, p.Host)
}

// EndpointOf is the storage endpoint of a remote URL as the scheduler
// names it (in sluice links, limits and metrics), "" for a local file.
func EndpointOf(u string) string { return endpointOf(u) }

// normalEndpoint is "host:port" with the host lower-cased and without a
// trailing dot, and the port the scheme's default (dtr.SchemeTable:
// https and davs 443, http and dav 80, root 1094, ...) when the URL
// gives none: https://SE.example.org./f and https://se.example.org:443/g
// are one endpoint. A host of a scheme without a default port stays a
// host alone.
func normalEndpoint(scheme, hostport string) string {
	u := url.URL{Host: hostport}
	host, port := strings.TrimSuffix(strings.ToLower(u.Hostname()), "."), u.Port()
	if port == "" {
		if s, ok := dtr.SchemeOf(strings.ToLower(scheme)); ok {
			port = s.DefaultPort
		}
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port == "" {
		return host
	}
	return host + ":" + port
}

// hostLoad counts the grants running per storage endpoint, in the states
// whose slot class is perHost (TRANSFER). Endpoints are 1 + their number
// in the core's names table, as in entry.hosts. Its invariant: an
// endpoint is in running exactly while it has a grant running, and a DTR
// whose two ends are on one endpoint counts once.
type hostLoad struct {
	running map[uint32]int
	// max is MaxPerHost; 0 means no limit.
	max int
	// links are the per-link limits (links.go), nil when the optimizer is
	// off; they are counted and enforced with the per-host ones.
	links *linkSet
}

// limited reports whether there is a per-host or per-link limit.
func (l *hostLoad) limited() bool { return l.max > 0 || l.links != nil }

// full returns an endpoint of e that has max grants running, or 0 if both
// have room; a DTR whose link is at its limit returns linkFull, and marks
// the link as wanted beyond it (for a grant: Explain uses blocked).
func (l *hostLoad) full(e *entry) uint32 {
	h := l.blocked(e)
	if h == linkFull {
		l.links.want(e)
	}
	return h
}

// blocked is full without marking anything.
func (l *hostLoad) blocked(e *entry) uint32 {
	if l.links.atLimit(e) {
		return linkFull
	}
	if l.max <= 0 {
		return 0
	}
	for _, h := range e.hosts {
		if h != 0 && l.running[h] >= l.max {
			return h
		}
	}
	return 0
}

// linkFull is what full returns for a DTR whose link is at its limit.
const linkFull = math.MaxUint32

// add counts a grant of e in (n = 1) or out (n = -1) at its endpoints.
func (l *hostLoad) add(e *entry, n int) {
	l.links.add(e, n)
	for i, h := range e.hosts {
		if h == 0 || (i == 1 && h == e.hosts[0]) {
			continue
		}
		if l.running[h] += n; l.running[h] <= 0 {
			delete(l.running, h)
		}
	}
}
