package core

import (
	"net/url"
	"strings"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// SortReplicas orders a file's source URLs by ARC's preferredpattern:
// patterns separated by "|" are matched against each URL's host; a URL
// matching an earlier pattern comes first, URLs matching none keep their
// order after those that match; a pattern ending in "$" must match the end
// of the host, and a pattern starting with "!" drops the URLs it matches
// (unless that would drop them all). Duplicates are dropped.
func SortReplicas(urls []string, pattern string) []string {
	var pats []string
	for _, p := range strings.Split(pattern, "|") {
		if p = strings.TrimSpace(p); p != "" {
			pats = append(pats, p)
		}
	}
	matches := func(u, p string) bool {
		h := ""
		if pu, err := url.Parse(u); err == nil {
			h = pu.Hostname()
		}
		if end, ok := strings.CutSuffix(p, "$"); ok {
			return strings.HasSuffix(h, end)
		}
		return strings.Contains(h, p)
	}
	seen := map[string]bool{}
	var kept []string
	for _, u := range urls {
		if seen[u] {
			continue
		}
		seen[u] = true
		excluded := false
		for _, p := range pats {
			if ex, ok := strings.CutPrefix(p, "!"); ok && matches(u, ex) {
				excluded = true
			}
		}
		if !excluded {
			kept = append(kept, u)
		}
	}
	if len(kept) == 0 {
		return SortReplicas(dedupe(urls), "") // every one excluded: keep them all
	}
	var out []string
	placed := map[string]bool{}
	for _, p := range pats {
		if strings.HasPrefix(p, "!") {
			continue
		}
		for _, u := range kept {
			if !placed[u] && matches(u, p) {
				out = append(out, u)
				placed[u] = true
			}
		}
	}
	for _, u := range kept {
		if !placed[u] {
			out = append(out, u)
		}
	}
	return out
}

func dedupe(urls []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, u := range urls {
		if !seen[u] {
			seen[u] = true
			out = append(out, u)
		}
	}
	return out
}

// nextReplica moves a DTR whose source failed to its next replica, if it
// has one, and reports whether it did. A failure at the destination, one
// whose end is not known (a lost worker: its partial file is cleaned up
// first), or of the last replica, is left to the retry.
func (c *Core) nextReplica(e *entry) bool {
	d := e.d
	if d.Error == nil || d.Error.Location != dtr.LocationSource || d.Replica+1 >= len(d.Replicas) {
		return false
	}
	d.Replica++
	d.Source = d.Replicas[d.Replica]
	d.Error = nil
	d.TransferGrant, d.TURL = "", ""
	c.setHosts(e)
	return true
}
