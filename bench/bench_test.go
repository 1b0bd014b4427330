package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBenchMeasuresEveryFigureAndWritesThem runs every measurement small:
// each must finish, give a plausible figure and land in the report.
func TestBenchMeasuresEveryFigureAndWritesThem(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real services for about half a minute")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	o := Options{Dir: t.TempDir(), Files: 200, ARCFiles: 200, Queued: 20_000, Restart: 2000, Depth: 3000, Latency: 10, Saturate: 40, ScalePerReplica: 20,
		Load: 3000, LoadBad: 10}
	r, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Figures) != 15 {
		t.Fatalf("%d figures, want 15 (no separate processes): %+v", len(r.Figures), r.Figures)
	}
	if cp := r.Figures[2]; !strings.Contains(cp.What, "cp -r") || !strings.HasSuffix(cp.Value, "files/s") {
		t.Errorf("the cp baseline: %+v", cp)
	}
	if load := r.Figures[len(r.Figures)-1]; load.Met != "yes" {
		t.Errorf("load: %s", load.Value)
	}
	for _, f := range r.Figures {
		if f.Value == "" || strings.Contains(f.Value, "NaN") || strings.Contains(f.Value, "Inf") {
			t.Errorf("%s: %q", f.What, f.Value)
		}
	}
	for _, f := range r.Figures {
		t.Logf("%s: %s (target %s, met %s)", f.What, f.Value, f.Target, f.Met)
	}
	var md bytes.Buffer
	if err := r.Markdown(&md, "sluice bench -test"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# Benchmarks", "cores", "| What | Figure | Target | Met | Command |", "bare pipeline", "batched pipeline",
		"p50", "restart", "NATS messages through the server per DTR", "this run of `sluice bench -test`", "| `sluice bench` (this run) |", "-bench 'BatchedPipeline$' -benchtime 200x ./bench/` |"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, md.String())
		}
	}
}

// TestSeparateProcessesMoveEveryItem runs both throughput figures of
// separate processes small: the bare pipeline with each stage a child
// process, and Sluice with each role one.
func TestSeparateProcessesMoveEveryItem(t *testing.T) {
	if testing.Short() {
		t.Skip("builds sluice and runs it as child processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	exe := buildSluice(t)
	rate, err := BarePipelineSeparate(ctx, t.TempDir(), 300, exe)
	if err != nil || rate <= 0 {
		t.Fatalf("bare pipeline as separate processes: %v items/s, %v", rate, err)
	}
	rate, err = BatchedPipelineSeparate(ctx, t.TempDir(), 300, exe)
	if err != nil || rate <= 0 {
		t.Fatalf("batched pipeline as separate processes: %v items/s, %v", rate, err)
	}
	rate, roles, err := throughput(ctx, t.TempDir(), 300, 50, exe)
	if err != nil || rate <= 0 {
		t.Fatalf("Sluice as separate processes: %v DTR/s, %v", rate, err)
	}
	if len(roles) != 5 || roles["scheduler"] <= 0 && roles["processor"] <= 0 || roles[ThisProcess] <= 0 {
		t.Errorf("CPU by role: %v, want the four roles and this process, some CPU used", roles)
	}
	if err := RunPipelineStage(ctx, "nats://127.0.0.1:1", 4); err == nil || !strings.Contains(err.Error(), "no stage 4") {
		t.Errorf("stage 4 of 4: %v, want no such stage", err)
	}
}

// TestPipelinesMoveEveryItem runs each baseline pipeline in this process
// over loopback TCP and nats.go's in-process connection: each returns only
// once every item has come out of its last stage.
func TestPipelinesMoveEveryItem(t *testing.T) {
	for _, tt := range []struct {
		name string
		run  func(context.Context, string, int, bool) (float64, error)
	}{
		{"bare", BarePipeline},
		{"batched", BatchedPipeline},
	} {
		for _, inProcess := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/in-process=%v", tt.name, inProcess), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				// More than a batch, and not a multiple of one.
				rate, err := tt.run(ctx, t.TempDir(), 3*batchedPull+17, inProcess)
				if err != nil || rate <= 0 {
					t.Fatalf("%v items/s, %v", rate, err)
				}
			})
		}
	}
}

func TestArrivalsCountEachItemOnceAndOnlyKnownOnes(t *testing.T) {
	item := func(i uint64) []byte {
		b := make([]byte, 16)
		binary.BigEndian.PutUint64(b, i)
		return b
	}
	a := newArrivals(3)
	for _, data := range [][]byte{item(0), item(0), item(7), {1, 2}, item(2)} {
		a.add(data)
	}
	select {
	case <-a.all:
		t.Fatal("all arrived after items 0 and 2 of 3 (0 twice, 7 and a short one besides)")
	default:
	}
	a.add(item(1))
	select {
	case <-a.all:
	default:
		t.Fatal("not all arrived after items 0, 1 and 2 of 3")
	}
	a.add(item(1)) // after the end: counted nowhere, closes nothing twice
}

func TestMemoryPerQueuedIsAPlausibleSize(t *testing.T) {
	if b := MemoryPerQueued(50_000); b < 100 || b > 5000 {
		t.Fatalf("%.0f bytes per queued DTR: not a heap size", b)
	}
}

func TestPercentileTakesTheValueAtThatRank(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		var out []time.Duration
		for _, v := range n {
			out = append(out, time.Duration(v)*time.Millisecond)
		}
		return out
	}
	for _, tt := range []struct {
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{nil, 50, 0},
		{ms(7), 99, 7 * time.Millisecond},
		{ms(1, 2, 3, 4, 5), 50, 3 * time.Millisecond},
		{ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 99, 9 * time.Millisecond},
		{ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 100, 10 * time.Millisecond},
	} {
		if got := Percentile(tt.in, tt.p); got != tt.want {
			t.Errorf("Percentile(%v, %v) = %v, want %v", tt.in, tt.p, got, tt.want)
		}
	}
}

// BenchmarkThroughput is Throughput with all roles in this process, for
// profiling: go test -run XXX -bench Throughput -cpuprofile cpu.out ./bench/
// Besides DTR/s it reports the CPU time of the whole process per DTR
// (user and system), which varies less than the rate on a shared machine.
// It runs with ThroughputSlots slots per state and with the 50 that the
// figures before 2026-11-24 12:00 used.
func BenchmarkThroughput(b *testing.B) {
	for _, slots := range []int{ThroughputSlots, 50} {
		b.Run(fmt.Sprintf("slots=%d", slots), func(b *testing.B) {
			n := max(b.N, 100)
			before := cpuTime()
			rate, err := Throughput(context.Background(), b.TempDir(), n, slots, "")
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(rate, "DTR/s")
			b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(n), "cpu-µs/DTR")
		})
	}
}

// BenchmarkThroughputSeparate is Throughput with each role its own process
// of a sluice binary built for it (the NATS server stays in this process),
// as `sluice bench` measures it. Its CPU per DTR is this process's and its
// children's; it also reports each role's CPU per DTR during the job (from
// /proc; the rest is this process: the NATS server and the harness):
// go test -run XXX -bench 'Separate|BarePipeline' ./bench/
func BenchmarkThroughputSeparate(b *testing.B) {
	exe := buildSluice(b)
	n := max(b.N, 100)
	before := cpuTime() + childrenCPUTime()
	rate, roles, err := throughput(context.Background(), b.TempDir(), n, ThroughputSlots, exe)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(rate, "DTR/s")
	b.ReportMetric(float64((cpuTime()+childrenCPUTime()-before).Microseconds())/float64(n), "cpu-µs/DTR")
	for role, t := range roles {
		b.ReportMetric(float64(t.Microseconds())/float64(n), role+"-cpu-µs/DTR")
	}
}

// buildSluice builds the sluice binary for benchmarks that run it.
func buildSluice(t testing.TB) string {
	exe := filepath.Join(t.TempDir(), "sluice")
	if out, err := exec.Command("go", "build", "-o", exe, "../cmd/sluice").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return exe
}

// cpuTime is the user and system CPU time this process has used.
func cpuTime() time.Duration { return processCPU() }

// childrenCPUTime is the CPU time of this process's children that ended
// and were waited for.
func childrenCPUTime() time.Duration { return rusage(syscall.RUSAGE_CHILDREN) }

// BenchmarkBarePipeline is the baseline of BenchmarkThroughput, measured
// the same way: go test -run XXX -bench 'Throughput$|BarePipeline' ./bench/
func BenchmarkBarePipeline(b *testing.B) {
	n := max(b.N, 100)
	before := cpuTime()
	rate, err := BarePipeline(context.Background(), b.TempDir(), n, false)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(rate, "items/s")
	b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(n), "cpu-µs/item")
}

// BenchmarkBarePipelineSeparate is the baseline of
// BenchmarkThroughputSeparate: the bare pipeline with each stage its own
// process.
func BenchmarkBarePipelineSeparate(b *testing.B) {
	exe := buildSluice(b)
	n := max(b.N, 100)
	before := cpuTime() + childrenCPUTime()
	rate, err := BarePipelineSeparate(context.Background(), b.TempDir(), n, exe)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(rate, "items/s")
	b.ReportMetric(float64((cpuTime()+childrenCPUTime()-before).Microseconds())/float64(n), "cpu-µs/item")
}

func TestTheReportNamesTheMachineAndEachFiguresCommand(t *testing.T) {
	r := &Report{Machine: "a CPU, 2 cores", Storage: "/dev/shm (tmpfs, in memory)", Started: time.Date(2026, 11, 26, 14, 0, 0, 0, time.UTC),
		Took: 90 * time.Second, Figures: []Figure{
			{What: "alone", Value: "1 DTR/s", Target: "≥ 1", Met: "yes", Command: "go test -bench X ./bench/"},
			{What: "only in the run", Value: "2 s"},
		}}
	var md bytes.Buffer
	if err := r.Markdown(&md, "sluice bench --quick"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Written by `sluice bench --quick` on 2026-11-26 14:00 UTC in 1m30s.",
		"Machine: a CPU, 2 cores.",
		"/dev/shm (tmpfs, in memory)",
		"Every figure is from this run of `sluice bench --quick`.",
		"| What | Figure | Target | Met | Command |\n|---|---|---|---|---|\n",
		"| alone | 1 DTR/s | ≥ 1 | yes | `go test -bench X ./bench/` |\n",
		"| only in the run | 2 s |  |  | `sluice bench` (this run) |\n",
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, md.String())
		}
	}
}

func TestTimesRoundsDownSoThatARatioBelowOneNeverReadsOne(t *testing.T) {
	for r, want := range map[float64]string{0.998: "0.99×", 1.0: "1.00×", 1.004: "1.00×", 1.27: "1.27×", 0.5: "0.50×"} {
		if got := times(r); got != want {
			t.Errorf("times(%v) = %q, want %q", r, got, want)
		}
	}
}

func TestFailoverGrantsAgainWithNothingLostOrGrantedTwice(t *testing.T) {
	for _, cutOff := range []bool{false, true} {
		r, err := Failover(context.Background(), t.TempDir(), 20000, cutOff)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("cut off %v: warm in %s, first grant %s after the leader was lost; held %d, final %d, granted twice %d",
			cutOff, r.Warm, r.Gap, r.Held, r.Final, r.Twice)
		if r.Held+r.Final < 20000 {
			t.Errorf("cut off %v: the new leader holds %d and %d are final, of 20000", cutOff, r.Held, r.Final)
		}
		if r.Twice != 0 {
			t.Errorf("cut off %v: %d DTR states granted twice", cutOff, r.Twice)
		}
	}
}

// BenchmarkBatchedPipeline is the batched baseline of BenchmarkThroughput,
// measured the same way:
// go test -run XXX -bench 'Throughput$|BatchedPipeline$' ./bench/
func BenchmarkBatchedPipeline(b *testing.B) {
	n := max(b.N, 100)
	before := cpuTime()
	rate, err := BatchedPipeline(context.Background(), b.TempDir(), n, false)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(rate, "items/s")
	b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(n), "cpu-µs/item")
}

// BenchmarkBatchedPipelineSeparate is the batched baseline of
// BenchmarkThroughputSeparate: each stage its own process.
func BenchmarkBatchedPipelineSeparate(b *testing.B) {
	exe := buildSluice(b)
	n := max(b.N, 100)
	before := cpuTime() + childrenCPUTime()
	rate, err := BatchedPipelineSeparate(context.Background(), b.TempDir(), n, exe)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(rate, "items/s")
	b.ReportMetric(float64((cpuTime()+childrenCPUTime()-before).Microseconds())/float64(n), "cpu-µs/item")
}

func TestCPUFigureGivesEachRolePerDTRAndJudgesBothTargets(t *testing.T) {
	ms := time.Millisecond
	roles := func(sched time.Duration) map[string]time.Duration {
		return map[string]time.Duration{"scheduler": sched, "processor": 40 * ms, "delivery": 30 * ms, "generator": 10 * ms, ThisProcess: 20 * ms}
	}
	for _, tt := range []struct {
		name     string
		one      time.Duration
		separate map[string]time.Duration
		value    string
		met      string
	}{
		{"one process only, met", 100 * ms, nil, "one process 100 µs", "yes"},
		{"one process only, missed", 151 * ms, nil, "one process 151 µs", "no"},
		{"both met", 150 * ms, roles(25 * ms),
			"scheduler 25 µs, processor 40 µs, delivery 30 µs, generator 10 µs, NATS server + harness 20 µs; end to end 125 µs (separate processes), one process 150 µs", "yes"},
		{"scheduler missed", 150 * ms, roles(26 * ms), "scheduler 26 µs,", "no"},
	} {
		f := cpuFigure(1000, tt.one, tt.separate)
		if !strings.Contains(f.Value, tt.value) || f.Met != tt.met {
			t.Errorf("%s: %q met %q, want %q met %q", tt.name, f.Value, f.Met, tt.value, tt.met)
		}
		if tt.separate != nil && !strings.Contains(f.Target, "scheduler ≤ 25 µs") {
			t.Errorf("%s: target %q", tt.name, f.Target)
		}
	}
}

func TestBigFilesGivesEveryRowWithItsBaseline(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 100 MiB a few times")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	figs, err := BigFiles(ctx, t.TempDir(), 8<<20, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(figs) != 6 {
		t.Fatalf("%d rows, want 6: %+v", len(figs), figs)
	}
	for _, f := range figs {
		if !strings.Contains(f.Value, "Sluice ") || !strings.Contains(f.Value, "MiB/s") {
			t.Errorf("row %q: %q", f.What, f.Value)
		}
	}
}

// BenchmarkBigFiles prints the big-file rows of Quick (256 MiB, 20 files
// of 10 MiB): go test -run XXX -bench BigFiles -benchtime 1x ./bench/
func BenchmarkBigFiles(b *testing.B) {
	o := Quick()
	for range b.N {
		figs, err := BigFiles(context.Background(), b.TempDir(), o.BigFile, o.BigFiles)
		if err != nil {
			b.Fatal(err)
		}
		for _, f := range figs {
			b.Logf("%s | %s | %s | %s", f.What, f.Value, f.Target, f.Met)
		}
	}
}

// TestDepthHoldsEveryStoredDTR starts a scheduler over a few thousand DTRs
// stored in 1,000 shares: it grants and holds them all, and grants again
// when it is killed and started over them.
func TestDepthHoldsEveryStoredDTR(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a scheduler over stored DTRs")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := Depth(ctx, t.TempDir(), 5000, "")
	if err != nil {
		t.Fatal(err)
	}
	if r.Held != 5000 || r.FirstGrant <= 0 || r.Loaded < r.FirstGrant || r.Restart <= 0 {
		t.Errorf("held %d of 5000, first grant after %s, all held after %s, first grant after the restart %s", r.Held, r.FirstGrant, r.Loaded, r.Restart)
	}
}

// BenchmarkDepth stores b.N DTRs queued in 1,000 shares (-benchtime
// 10000000x for the ten million) and starts a `sluice scheduler`
// process over them: the time to its first grant and until it holds them
// all, its settled resident memory per DTR, and the time to its first
// grant when it is killed and started again. The store needs about
// 650 bytes per DTR where the test's temporary directory is (TMPDIR).
func BenchmarkDepth(b *testing.B) {
	exe := buildSluice(b)
	r, err := Depth(context.Background(), b.TempDir(), b.N, exe)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.FirstGrant.Seconds(), "first-grant-s")
	b.ReportMetric(r.Loaded.Seconds(), "all-held-s")
	b.ReportMetric(float64(r.RSS)/float64(max(r.Held, 1)), "RSS-B/DTR")
	b.ReportMetric(float64(r.Held), "held")
	b.ReportMetric(r.Restart.Seconds(), "restart-first-grant-s")
}
