package core

// The cache: which DTR downloads each source into the processors' cache,
// and the DTRs that wait for it.

import (
	"container/heap"
	"strings"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// cacheable reports whether a DTR goes through the cache: a cache is kept,
// the source is remote, the destination local, and the job did not say no.
func (c *Core) cacheable(d *dtr.DTR) bool {
	return c.cfg.Cache && !d.Options.NoCache && !d.Options.Stage &&
		!strings.HasPrefix(d.Source, "file:") && strings.HasPrefix(d.Destination, "file:")
}

// waitForCache parks a DTR in CACHE_WAIT while h downloads the same file,
// and gives h the waiter's priority if it is higher (ARC does the same).
func (c *Core) waitForCache(now time.Time, e, h *entry) {
	e.d.NextProcess = now.Add(c.cfg.CacheWait)
	heap.Push(&c.delayed, e)
	if p := c.peekEntry(e).Priority; p > c.peekEntry(h).Priority {
		hd := c.unpackEntry(h)
		hd.Priority, hd.Updated = p, now
		if hd.State.IsQueue() && h.index >= 0 {
			h.home().fix(h)
		}
		c.markDirty(h)
	}
}

// cacheDownloads holds, per source URL, the DTR downloading it into the
// cache. Its invariant: an entry is in it under its key in Core.cacheKeys,
// or not at all (no key there).
type cacheDownloads map[string]*entry

// of returns the DTR downloading a source into the cache, nil if none.
func (m cacheDownloads) of(source string) *entry { return m[source] }

// cacheAs records that a DTR downloads its source into the cache.
func (c *Core) cacheAs(e *entry) {
	c.cacheKeys[e] = e.d.Source
	c.caching[e.d.Source] = e
}

// uncache forgets that a DTR downloads into the cache.
func (c *Core) uncache(e *entry) {
	key, ok := c.cacheKeys[e]
	if !ok {
		return
	}
	if c.caching[key] == e {
		delete(c.caching, key)
	}
	delete(c.cacheKeys, e)
}
