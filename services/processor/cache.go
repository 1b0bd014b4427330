package processor

import (
	"cmp"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// The cache is ARC's (A-REX's cache of downloads): an entry is
// <cache>/data/<sha1[0:2]>/<sha1[2:]> of the source URL; while a DTR
// downloads into it, <entry>.lock names its grant. A lock older than
// CacheLockTimeout is stale (its downloader died) and is broken. Entries
// are hard-linked to destinations, so cleaning the cache to its size limit
// never touches a job's file.

// cacheEntry returns the path of the cache entry of a source URL.
func (s *Service) cacheEntry(source string) string {
	sum := sha1.Sum([]byte(source))
	h := hex.EncodeToString(sum[:])
	return filepath.Join(s.cfg.CacheDir, "data", h[:2], h[2:])
}

func fileURL(p string) string { return (&url.URL{Scheme: "file", Path: p}).String() }

// checkCache looks the source up in the cache: present (hit), being
// downloaded by another DTR (locked), or absent, in which case this DTR
// takes the lock and downloads into the entry.
func (s *Service) checkCache(g api.Grant) (api.Result, error) {
	if s.cfg.CacheDir == "" {
		return api.Result{}, &transfer.Error{Kind: dtr.ErrCache, Op: "check cache", URL: g.DTR.Source,
			Err: errors.New("this processor has no cache (SLUICE_CACHE_DIR)")}
	}
	entry := s.cacheEntry(g.DTR.Source)
	lock := entry + ".lock"
	res := api.Result{CacheFile: fileURL(entry)}
	if err := os.MkdirAll(filepath.Dir(entry), 0o755); err != nil {
		return res, &transfer.Error{Kind: dtr.ErrCache, Op: "check cache", URL: g.DTR.Source, Err: err}
	}
	s.checking.Lock()
	defer s.checking.Unlock()
	for try := 0; try < 3; try++ {
		if fi, err := os.Stat(lock); err == nil {
			if time.Since(lastActivity(entry, fi.ModTime())) < cmp.Or(s.cfg.CacheLockTimeout, defaultCacheLockTimeout) {
				res.Cache = dtr.CacheLocked
				return res, nil
			}
			// Stale: its downloader is gone. Break it and start over.
			if breakLock(lock, fi) {
				s.log.Warn("stale cache lock broken", "entry", entry, "age", time.Since(fi.ModTime()).Round(time.Second))
				_ = os.Remove(entry)
			}
			continue
		}
		if _, err := os.Stat(entry); err == nil {
			res.Cache = dtr.CacheHit
			now := time.Now()
			_ = os.Chtimes(entry, now, now) // recently used: cleaned last
			return res, nil
		}
		f, err := os.OpenFile(lock, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue // taken a moment ago
		}
		if err != nil {
			return res, &transfer.Error{Kind: dtr.ErrCache, Op: "check cache", URL: g.DTR.Source, Err: err}
		}
		fmt.Fprintln(f, g.ID)
		if err := f.Close(); err != nil {
			return res, &transfer.Error{Kind: dtr.ErrCache, Op: "check cache", URL: g.DTR.Source, Err: err}
		}
		res.Cache = dtr.CacheDownload
		return res, nil
	}
	res.Cache = dtr.CacheLocked
	return res, nil
}

// breakLock removes the stale lock that stat described, and reports
// whether it did. The lock is first moved aside (a rename is atomic, so one
// breaker wins); if what was moved is not the stale lock but one taken
// since (by a processor that broke it first), it is put back.
func breakLock(lock string, stale fs.FileInfo) bool {
	aside := fmt.Sprintf("%s.broken-%d", lock, time.Now().UnixNano())
	if err := os.Rename(lock, aside); err != nil {
		return false // another breaker moved it first
	}
	// (A file system may give the fresh lock the stale one's inode: its
	// modification time tells them apart.)
	if fi, err := os.Stat(aside); err == nil && (!os.SameFile(fi, stale) || !fi.ModTime().Equal(stale.ModTime())) {
		_ = os.Link(aside, lock) // a fresh lock: back in place (unless yet another is there)
		_ = os.Remove(aside)
		return false
	}
	_ = os.Remove(aside)
	return true
}

// lastActivity is the latest of the lock's time and the modification
// times of the entry's partial downloads (delivery writes
// ".<name>.sluice-<grant>.part" beside it): a long download keeps its
// lock fresh by writing.
func lastActivity(entry string, locked time.Time) time.Time {
	parts, _ := filepath.Glob(filepath.Join(filepath.Dir(entry), "."+filepath.Base(entry)+".sluice-*.part"))
	for _, p := range parts {
		if fi, err := os.Stat(p); err == nil && fi.ModTime().After(locked) {
			locked = fi.ModTime()
		}
	}
	return locked
}

// processCache puts a cached file in place, or cleans up after a failed or
// cancelled download into the cache; either way this DTR's lock goes. A
// hit skipped pre-cleaning and post-processing, so their checks are made
// here: an existing destination is refused without overwrite, and the
// entry must have the expected checksum (else it goes, and the retry
// downloads the file again). The result carries the checksum computed.
func (s *Service) processCache(ctx context.Context, g api.Grant) (api.Result, error) {
	d := *g.DTR
	entry := s.cacheEntry(d.Source)
	if d.Cache == dtr.CacheDownload {
		defer os.Remove(entry + ".lock")
	}
	if g.Cleanup {
		if d.Cache == dtr.CacheDownload {
			_ = os.Remove(entry)
		}
		return api.Result{}, nil
	}
	dst, err := transfer.LocalPath(d.Destination)
	if err != nil {
		return api.Result{}, err
	}
	if err := s.client.Files().MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return api.Result{}, &transfer.Error{Kind: dtr.ErrLocalFile, Op: "link from cache", URL: d.Destination, Err: err}
	}
	ei, err := os.Stat(entry)
	if errors.Is(err, fs.ErrNotExist) {
		// Cleaned away between the check and now: try again, which
		// downloads it.
		return api.Result{}, &transfer.Error{Kind: dtr.ErrInternalProcess, Op: "link from cache", URL: d.Destination,
			Err: fmt.Errorf("the cache entry of %s is gone (cleaned?)", transfer.Redact(d.Source))}
	}
	var res api.Result
	if d.Cache == dtr.CacheHit {
		if di, err := s.client.Files().Stat(dst); err == nil && !d.Options.Overwrite && !os.SameFile(di, ei) {
			return res, &transfer.Error{Kind: dtr.ErrPermanentRemote, Op: "link from cache", URL: d.Destination,
				Err: fmt.Errorf("destination exists and overwrite is not set")}
		}
		if want := d.Options.Checksum; want != "" {
			typ, _, _ := dtr.ParseChecksum(want)
			got, err := s.client.Checksum(ctx, fileURL(entry), typ)
			if err != nil {
				return res, err
			}
			if !checksum.Equal(want, got) {
				_ = os.Remove(entry) // a damaged entry, or another file now: downloaded again
				return res, &transfer.Error{Kind: dtr.ErrTransferSpeed, Op: "verify", URL: d.Destination,
					Err: fmt.Errorf("checksum mismatch: expected %s, the cached file has %s", want, got)}
			}
			res.Checksum = got
		}
	}
	// Linked (or copied) under a name of this grant's, then renamed over
	// the destination: an existing one (allowed above or by pre-cleaning)
	// is replaced, never deleted first, so a link that runs late (its
	// processor frozen past its lease) cannot remove a finished file.
	tmpURL := transfer.TempURL(d.Destination, g.ID)
	tmp, err := transfer.LocalPath(tmpURL)
	if err != nil {
		return res, err
	}
	if err := transfer.CheckFence(ctx, "link from cache", d.Destination); err != nil {
		return res, err
	}
	if err := s.client.Files().Link(entry, tmp); err != nil {
		// Another file system, or roots apart: copy instead.
		// Its checksum was checked above if the job gave one: the
		// kernel copies it.
		if _, err := s.client.Copy(ctx, fileURL(entry), tmpURL, transfer.CopyOptions{NoChecksum: true}); err != nil {
			return res, err
		}
	}
	if err := s.client.Rename(ctx, tmpURL, d.Destination); err != nil {
		_ = s.client.Delete(ctx, tmpURL)
		return res, err
	}
	return res, nil
}

// cleanCache deletes the least recently used entries not locked until the
// cache holds at most CacheMaxBytes.
func (s *Service) cleanCache() {
	if s.cfg.CacheDir == "" || s.cfg.CacheMaxBytes <= 0 {
		return
	}
	type file struct {
		path string
		size int64
		used time.Time
	}
	var files []file
	var total int64
	root := filepath.Join(s.cfg.CacheDir, "data")
	_ = filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() || filepath.Ext(p) == ".lock" {
			return nil
		}
		fi, err := de.Info()
		if err != nil {
			return nil
		}
		total += fi.Size()
		if _, err := os.Stat(p + ".lock"); err == nil {
			return nil // being downloaded
		}
		if time.Since(fi.ModTime()) < cmp.Or(s.cfg.CacheMinAge, 10*time.Minute) {
			return nil // used a moment ago: a DTR may be about to link it
		}
		files = append(files, file{p, fi.Size(), fi.ModTime()})
		return nil
	})
	if total <= s.cfg.CacheMaxBytes {
		return
	}
	sort.Slice(files, func(i, j int) bool { return files[i].used.Before(files[j].used) })
	for _, f := range files {
		if total <= s.cfg.CacheMaxBytes {
			break
		}
		if err := os.Remove(f.path); err == nil {
			total -= f.size
		}
	}
}

// keepCacheClean cleans the cache every interval until ctx ends.
func (s *Service) keepCacheClean(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.cleanCache()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
