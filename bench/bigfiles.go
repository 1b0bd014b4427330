package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/job"
	"github.com/sluice-dtr/sluice/services/delivery"
)

// bigFileRuns is how many times each big-file row is timed, Sluice and
// its baseline in turn; the medians are reported.
const bigFileRuns = 3

// smallBigFile is the size of each file of the many-files row.
const smallBigFile = 10 << 20

// BigFiles measures Sluice's line rate on big files, end to end (submit to
// the job's end, every role in this process, 10 slots per state), each row
// against a baseline timed in turn with it: one file of size bytes
// file→file without a checksum against `cp`, http→file (a loopback HTTP
// server) against `curl -o`, file→file checking an expected adler32 and
// sha256 against `cp` plus the same hash computed by a bare Go loop reading
// the file, and many 10 MiB files file→file (Sluice at its defaults, and
// with no checksum) against `cp -r`. A baseline whose program is missing is reported so.
func BigFiles(ctx context.Context, dir string, size int64, many int) ([]Figure, error) {
	src := filepath.Join(dir, "in", "big")
	if err := randomFile(src, size); err != nil {
		return nil, err
	}
	base, stopSrc, err := fileServer(filepath.Join(dir, "in"))
	if err != nil {
		return nil, err
	}
	defer stopSrc()
	cfg := config(10)
	cfg.Delivery.Checksum = delivery.NoChecksum
	s, err := start(ctx, filepath.Join(dir, "none"), cfg, "", nil, process{roles: app.Roles})
	if err != nil {
		return nil, err
	}
	defer s.stop()

	out := filepath.Join(dir, "out")
	runs := 0
	// sluice times one job of the files from → to, removing what it wrote.
	sluice := func(s *system, files []job.File) (time.Duration, error) {
		runs++
		j := &job.Job{Name: "big" + strconv.Itoa(runs)}
		for i, f := range files {
			f.Destination = "file://" + filepath.Join(out, strconv.Itoa(runs), strconv.Itoa(i))
			j.Inputs = append(j.Inputs, f)
		}
		defer os.RemoveAll(filepath.Join(out, strconv.Itoa(runs)))
		begin := time.Now()
		ev, err := s.run(ctx, j)
		if err != nil {
			return 0, err
		}
		if ev.Done != len(files) {
			return 0, fmt.Errorf("big files: %d of %d done: %+v", ev.Done, len(files), ev.Files[0].Error)
		}
		return s.ended.Sub(begin), nil
	}
	// command times a program, removing what it wrote at dst.
	command := func(dst string, name string, args ...string) (time.Duration, error) {
		defer os.RemoveAll(dst)
		begin := time.Now()
		if b, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
			return 0, fmt.Errorf("big files: %s: %w: %s", name, err, b)
		}
		return time.Since(begin), nil
	}
	cp, _ := exec.LookPath("cp")
	curl, _ := exec.LookPath("curl")
	mib := float64(size) / (1 << 20)
	rate := func(d time.Duration, bytes float64) string {
		return fmt.Sprintf("%.2f s (%.0f MiB/s)", d.Seconds(), bytes/(1<<20)/d.Seconds())
	}
	var figs []Figure
	// row times Sluice and the baseline in turn and adds their medians.
	row := func(what, baseline string, target float64, bytes float64, sluiceRun, baseRun func() (time.Duration, error)) error {
		var ts, tb []time.Duration
		for range bigFileRuns {
			t, err := sluiceRun()
			if err != nil {
				return err
			}
			ts = append(ts, t)
			if baseRun != nil {
				if t, err = baseRun(); err != nil {
					return err
				}
				tb = append(tb, t)
			}
		}
		f := Figure{What: what, Value: "Sluice " + rate(median(ts), bytes)}
		if target > 0 {
			f.Target = fmt.Sprintf("≥ %.1f× %s", target, baseline)
		}
		if baseRun == nil {
			f.Value += "; no " + baseline + " on this machine"
		} else {
			r := median(tb).Seconds() / median(ts).Seconds()
			f.Value += fmt.Sprintf("; %s %s = %s", baseline, rate(median(tb), bytes), times(r))
			if target > 0 {
				f.Met = met(r >= target)
			}
		}
		figs = append(figs, f)
		return nil
	}
	one := []job.File{{Source: "file://" + src}}
	if err := row(fmt.Sprintf("One %.0f MiB file, file:// → file://, no checksum (SLUICE_DELIVERY_CHECKSUM=none: copy_file_range), end to end", mib),
		"`cp`", 0.9, float64(size), func() (time.Duration, error) { return sluice(s, one) },
		orNil(cp, func() (time.Duration, error) {
			return command(filepath.Join(out, "cp"), cp, src, filepath.Join(out, "cp"))
		})); err != nil {
		return nil, err
	}
	web := []job.File{{Source: base + "/big"}}
	if err := row(fmt.Sprintf("One %.0f MiB file, http:// (loopback, Go's file server) → file://, no checksum, end to end", mib),
		"`curl -o`", 0.9, float64(size), func() (time.Duration, error) { return sluice(s, web) },
		orNil(curl, func() (time.Duration, error) {
			return command(filepath.Join(out, "curl"), curl, "-sSf", "-o", filepath.Join(out, "curl"), base+"/big")
		})); err != nil {
		return nil, err
	}
	for _, typ := range []string{"adler32", "sha256"} {
		want, _, err := hashFile(src, typ)
		if err != nil {
			return nil, err
		}
		sum := []job.File{{Source: "file://" + src, Checksum: want}}
		// The baseline: cp, then the bare hash.
		bare := func() (time.Duration, error) {
			t, err := command(filepath.Join(out, "cp"), cp, src, filepath.Join(out, "cp"))
			if err != nil {
				return 0, err
			}
			_, h, err := hashFile(src, typ)
			return t + h, err
		}
		if err := row(fmt.Sprintf("One %.0f MiB file, file:// → file://, checking an expected %s (one pass: read, hash and write each buffer)", mib, typ),
			"(`cp` + "+typ+" by a bare Go loop)", 0.8, float64(size), func() (time.Duration, error) { return sluice(s, sum) }, orNil(cp, bare)); err != nil {
			return nil, err
		}
	}
	if many > 0 {
		// Sluice at its defaults (adler32 computed on the stream), and
		// with no checksum.
		d, err := start(ctx, filepath.Join(dir, "defaults"), config(10), "", nil, process{roles: app.Roles})
		if err != nil {
			return nil, err
		}
		defer d.stop()
		j, err := files(filepath.Join(dir, "many"), "m", many, smallBigFile, nil)
		if err != nil {
			return nil, err
		}
		cpr := orNil(cp, func() (time.Duration, error) {
			return command(filepath.Join(out, "cpr"), cp, "-r", filepath.Join(dir, "many", "in"), filepath.Join(out, "cpr"))
		})
		for _, c := range []struct {
			how string
			s   *system
		}{{"Sluice's defaults (adler32 on the stream)", d}, {"no checksum", s}} {
			if err := row(fmt.Sprintf("%d files of 10 MiB, file:// → file://, 10 slots per state, %s", many, c.how),
				"`cp -r`", 0, float64(many*smallBigFile), func() (time.Duration, error) { return sluice(c.s, j.Inputs) }, cpr); err != nil {
				return nil, err
			}
		}
	}
	return figs, nil
}

// orNil is run, or nil if the program it runs is missing.
func orNil(program string, run func() (time.Duration, error)) func() (time.Duration, error) {
	if program == "" {
		return nil
	}
	return run
}

// median is the middle of durations (the upper one of an even count).
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// randomFile writes size random bytes at path.
func randomFile(path string, size int64) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.CopyN(f, rand.Reader, size); err != nil {
		f.Close()
		return fmt.Errorf("big files: %w", err)
	}
	return f.Close()
}

// hashFile is the checksum of typ of a file, computed by a bare loop of
// 1 MiB reads, and how long it took.
func hashFile(path, typ string) (string, time.Duration, error) {
	begin := time.Now()
	h, err := checksum.New(typ)
	if err != nil {
		return "", 0, err
	}
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	if _, err := io.CopyBuffer(struct{ hash.Hash }{h}, struct{ io.Reader }{f}, make([]byte, 1<<20)); err != nil {
		return "", 0, err
	}
	return checksum.Format(typ, h), time.Since(begin), nil
}

// fileServer serves dir over HTTP on loopback.
func fileServer(dir string) (base string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.FileServer(http.Dir(dir))}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return
		}
	}()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}
