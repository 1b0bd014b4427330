package processor

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func cacheService(t *testing.T) *Service {
	t.Helper()
	return New(Config{CacheDir: t.TempDir(), CacheLockTimeout: time.Minute}, nil, slog.New(slog.DiscardHandler))
}

func TestCacheCheckFindsHitsLocksAndStaleLocks(t *testing.T) {
	const src = "https://storage.example/f"
	old := time.Now().Add(-time.Hour)
	tests := []struct {
		name  string
		setup func(entry string)
		want  string
	}{
		{"an absent entry is this DTR's to download", func(string) {}, dtr.CacheDownload},
		{"a present entry is a hit", func(e string) { write(t, e, "data") }, dtr.CacheHit},
		{"a fresh lock: another DTR downloads it", func(e string) { write(t, e+".lock", "g") }, dtr.CacheLocked},
		{"an old lock with no download going on is stale and broken", func(e string) {
			write(t, e+".lock", "g")
			touch(t, e+".lock", old)
		}, dtr.CacheDownload},
		{"an old lock whose download still writes is kept", func(e string) {
			write(t, e+".lock", "g")
			touch(t, e+".lock", old)
			write(t, filepath.Join(filepath.Dir(e), "."+filepath.Base(e)+".sluice-x.1.part"), "partial")
		}, dtr.CacheLocked},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := cacheService(t)
			entry := s.cacheEntry(src)
			if err := os.MkdirAll(filepath.Dir(entry), 0o755); err != nil {
				t.Fatal(err)
			}
			tt.setup(entry)
			res, err := s.checkCache(api.Grant{ID: "g.1", DTR: &dtr.DTR{Source: src}})
			if err != nil || res.Cache != tt.want {
				t.Fatalf("cache %q, %v; want %q", res.Cache, err, tt.want)
			}
			if tt.want == dtr.CacheDownload {
				if _, err := os.Stat(entry + ".lock"); err != nil {
					t.Fatal("the downloader holds no lock")
				}
			}
		})
	}
}

func TestCacheCleaningKeepsRecentLockedAndLinkedFiles(t *testing.T) {
	s := cacheService(t)
	s.cfg.CacheMaxBytes, s.cfg.CacheMinAge = 10, time.Minute
	old := time.Now().Add(-time.Hour)
	oldA, oldB := s.cacheEntry("a"), s.cacheEntry("b")
	recent, locked := s.cacheEntry("c"), s.cacheEntry("d")
	for _, e := range []string{oldA, oldB, recent, locked} {
		_ = os.MkdirAll(filepath.Dir(e), 0o755)
		write(t, e, "0123456789")
	}
	touch(t, oldA, old.Add(-time.Hour)) // least recently used
	touch(t, oldB, old)
	touch(t, locked, old)
	write(t, locked+".lock", "g")
	link := filepath.Join(t.TempDir(), "job-file")
	if err := os.Link(oldA, link); err != nil {
		t.Fatal(err)
	}
	s.cleanCache()
	for e, want := range map[string]bool{oldA: false, oldB: false, recent: true, locked: true} {
		if _, err := os.Stat(e); (err == nil) != want {
			t.Errorf("%s present %v, want %v", filepath.Base(e), err == nil, want)
		}
	}
	if b, err := os.ReadFile(link); err != nil || string(b) != "0123456789" {
		t.Fatalf("a job's link to a cleaned entry lost its data: %v", err)
	}
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func touch(t *testing.T, p string, at time.Time) {
	t.Helper()
	if err := os.Chtimes(p, at, at); err != nil {
		t.Fatal(err)
	}
}

// Two processors that find the same stale lock break it once: the second,
// which saw the stale lock before the first took the entry afresh, leaves
// the fresh lock in place.
func TestAStaleLockIsBrokenOnceAndAFreshOneIsNotTaken(t *testing.T) {
	lock := filepath.Join(t.TempDir(), "entry.lock")
	if err := os.WriteFile(lock, []byte("gone\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hourAgo := time.Now().Add(-time.Hour)
	if err := os.Chtimes(lock, hourAgo, hourAgo); err != nil {
		t.Fatal(err)
	}
	stale, err := os.Stat(lock)
	if err != nil {
		t.Fatal(err)
	}
	if !breakLock(lock, stale) {
		t.Fatal("the first breaker did not break the stale lock")
	}
	// The first breaker takes the entry: a fresh lock at the same path.
	if err := os.WriteFile(lock, []byte("fresh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if breakLock(lock, stale) {
		t.Fatal("the second breaker broke the fresh lock")
	}
	if b, err := os.ReadFile(lock); err != nil || string(b) != "fresh\n" {
		t.Fatalf("the fresh lock: %q, %v", b, err)
	}
	if es, _ := os.ReadDir(filepath.Dir(lock)); len(es) != 1 {
		t.Fatalf("left beside the lock: %v", es)
	}
}
