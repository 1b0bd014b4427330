package transfer_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/transfer"
	"github.com/sluice-dtr/sluice/pkg/transfer/xrootdtest"
)

// BenchmarkThirdPartyPullBetweenRealXrootdServers measures a pull of one
// large file between two real xrootd servers on loopback made by Sluice
// (ThirdPartyCopy of a file whose adler32 the job gives, as Rucio's jobs
// do: the COPY, then a HEAD of the destination with Want-Digest, whose
// answer the size and checksum are checked against) and by the grid's own
// client doing the same (davix-cp --copy-mode pull, then davix-http -X
// HEAD with Want-Digest), interleaved: each iteration makes one copy with
// each, in alternating order. It reports both throughputs, their ratio, and
// the median of the ratios of each iteration's pair. The file is SLUICE_TPC_BENCH_BYTES
// long (1 GiB by default); run it with TMPDIR=/dev/shm to keep the
// servers' directories in memory:
//
//	TMPDIR=/dev/shm go test -run '^$' -bench ThirdPartyPull -benchtime 6x ./pkg/transfer/
func BenchmarkThirdPartyPullBetweenRealXrootdServers(b *testing.B) {
	davix, err := exec.LookPath("davix-cp")
	davixHTTP, err2 := exec.LookPath("davix-http")
	if err != nil || err2 != nil {
		b.Skip("davix-cp or davix-http is missing: install davix")
	}
	size := int64(1 << 30)
	if s := os.Getenv("SLUICE_TPC_BENCH_BYTES"); s != "" {
		if size, err = strconv.ParseInt(s, 10, 64); err != nil {
			b.Fatalf("SLUICE_TPC_BENCH_BYTES: %v", err)
		}
	}
	ca := xrootdtest.NewCA(b)
	src := xrootdtest.Start(b, xrootdtest.Options{TPC: true, CA: ca, Checksum: "adler32"})
	dst := xrootdtest.Start(b, xrootdtest.Options{TPC: true, CA: ca, Checksum: "adler32"})
	sum := writeLarge(b, src.Path("/f"), size)
	dst.MkdirAll(b, "/out")
	capath := hashedCADir(b, ca)
	c, _ := caClient(ca)
	ctx := context.Background()

	sluice := func(i int) time.Duration {
		start := time.Now()
		_, err := c.ThirdPartyCopy(ctx, src.HTTPS+"/f", fmt.Sprintf("%s/out/sluice-%d", dst.HTTPS, i), transfer.ThirdPartyOptions{
			ExpectedSize: size, Checksum: sum})
		if err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	grid := func(i int) time.Duration {
		start := time.Now()
		to := fmt.Sprintf("%s/out/davix-%d", dst.HTTPS, i)
		out, err := exec.Command(davix, "--capath", capath, "--copy-mode", "pull", src.HTTPS+"/f", to).CombinedOutput()
		if err != nil {
			b.Fatalf("davix-cp: %v: %s", err, out)
		}
		out, err = exec.Command(davixHTTP, "--capath", capath, "-X", "HEAD", "-H", "Want-Digest: adler32", "--trace", "header", to).CombinedOutput()
		if err != nil || !strings.Contains(strings.ToLower(string(out)), "digest: adler32="+strings.TrimPrefix(sum, "adler32:")) {
			b.Fatalf("davix-http HEAD: %v: %s", err, out)
		}
		return time.Since(start)
	}
	var tSluice, tGrid time.Duration
	var ratios []float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var ds, dg time.Duration
		if i%2 == 0 {
			ds = sluice(i)
			dg = grid(i)
		} else {
			dg = grid(i)
			ds = sluice(i)
		}
		tSluice, tGrid = tSluice+ds, tGrid+dg
		ratios = append(ratios, dg.Seconds()/ds.Seconds())
		b.StopTimer()
		os.Remove(dst.Path(fmt.Sprintf("/out/sluice-%d", i)))
		os.Remove(dst.Path(fmt.Sprintf("/out/davix-%d", i)))
		b.StartTimer()
	}
	mb := float64(size) * float64(b.N) / 1e6
	b.ReportMetric(mb/tSluice.Seconds(), "sluice-MB/s")
	b.ReportMetric(mb/tGrid.Seconds(), "davix-MB/s")
	b.ReportMetric(tGrid.Seconds()/tSluice.Seconds(), "ratio")
	// The median of each pair's ratio: a burst of load from elsewhere on
	// the machine slows one pair, not the figure.
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "median-pair-ratio")
}

// writeLarge writes size bytes (a random MiB, repeated) to path, owned
// by the owner of its directory (the server's user, who may then keep its
// checksum in an extended attribute, as a storage does for its files), and
// returns their adler32.
func writeLarge(b *testing.B, path string, size int64) string {
	b.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	block := make([]byte, 1<<20)
	rand.Read(block)
	h, _ := checksum.New("adler32")
	for n := int64(0); n < size; n += int64(len(block)) {
		part := block[:min(int64(len(block)), size-n)]
		h.Write(part)
		if _, err := f.Write(part); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	if st, err := os.Stat(filepath.Dir(path)); err == nil {
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			os.Chown(path, int(sys.Uid), int(sys.Gid))
		}
	}
	return checksum.Format("adler32", h)
}

// hashedCADir is a directory holding ca under its OpenSSL subject-hash
// name, as davix's --capath wants.
func hashedCADir(b *testing.B, ca *xrootdtest.CA) string {
	b.Helper()
	dir := b.TempDir()
	pem := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(pem, ca.PEM, 0o644); err != nil {
		b.Fatal(err)
	}
	out, err := exec.Command("openssl", "x509", "-hash", "-noout", "-in", pem).Output()
	if err != nil {
		b.Skipf("openssl is missing or failed (%v): it names the CA for davix-cp", err)
	}
	if err := os.Rename(pem, filepath.Join(dir, strings.TrimSpace(string(out))+".0")); err != nil {
		b.Fatal(err)
	}
	return dir
}
