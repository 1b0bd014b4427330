package core

// Per-host limits: how many transfers run against each storage endpoint.

import "net/url"

// setHosts notes the storage endpoints of a DTR's ends.
func (c *Core) setHosts(e *entry) {
	for i, u := range [2]string{e.d.Source, e.d.Destination} {
		e.hosts[i] = 0
		if h := endpointOf(u); h != "" {
			e.hosts[i] = uint32(c.nameID(h)) + 1
		}
	}
}

// endpointOf returns the storage endpoint of a remote URL ("host:port" as
// written), "" for a local file.
func endpointOf(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.Scheme == "file" {
		return ""
	}
	return p.Host
}

// hostFull returns an endpoint of e that has MaxPerHost transfers running
// (1 + its number in the names table), or 0 if both have room.
func (c *Core) hostFull(e *entry) uint32 {
	for _, h := range e.hosts {
		if h != 0 && c.hostBusy[h] >= c.cfg.MaxPerHost {
			return h
		}
	}
	return 0
}

// busy counts a transfer in or out of its endpoints.
func (c *Core) busy(e *entry, n int) {
	for i, h := range e.hosts {
		if h == 0 || (i == 1 && h == e.hosts[0]) {
			continue
		}
		if c.hostBusy[h] += n; c.hostBusy[h] <= 0 {
			delete(c.hostBusy, h)
		}
	}
}
