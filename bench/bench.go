// Package bench measures Sluice against the machine's limits in one run
// and writes the figures as BENCHMARKS.md (`sluice bench`). Every speed is
// set against a baseline measured in the same run on the same machine: the
// bare JetStream pipeline for Sluice's throughput, one deliverer for
// scale-out.
package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// Options say how much to measure.
type Options struct {
	// Dir is the work directory (a new temporary one if empty).
	Dir string
	// Files is the number of 1 KiB files of a throughput run, ARCFiles
	// of the run with a site's defaults, ARC's 10 slots per state.
	Files, ARCFiles int
	// Exe is the sluice binary, to run the roles as separate processes;
	// empty skips that run.
	Exe string
	// Queued is the number of DTRs held for the memory figure, Restart the
	// number stored for the restart figure, Depth the number stored in
	// 1,000 shares for the depth figure (0: not measured).
	Queued, Restart, Depth int
	// Latency is the number of DTRs timed one by one on an idle system.
	Latency int
	// Failover is the number of DTRs queued when the leading scheduler is
	// lost (0: not measured).
	Failover int
	// Saturate is the number of 200 ms downloads per share of the
	// saturated run, ScalePerReplica the number of 100 ms downloads per
	// delivery replica of the scale-out runs.
	Saturate, ScalePerReplica int
	// Load is the number of DTRs of the load run, LoadBad the malformed
	// ones among them; NATSCLI, if set, is the NATS CLI (`nats`) that
	// publishes LoadCLI more.
	Load, LoadBad, LoadCLI int
	NATSCLI                string
	// BigFile is the size of the one big file of the line-rate rows, and
	// BigFiles the number of 10 MiB files of the many-files row (0: not
	// measured).
	BigFile  int64
	BigFiles int
	// Progress, if set, hears what is being measured.
	Progress io.Writer
}

// Quick are options for a run of a minute or two.
func Quick() Options {
	return Options{Files: 1000, ARCFiles: 1000, Queued: 100_000, Restart: 10_000, Depth: 200_000, Latency: 50, Saturate: 150, ScalePerReplica: 100,
		Load: 50_000, LoadBad: 100, LoadCLI: 1000, Failover: 100_000, BigFile: 256 << 20, BigFiles: 20}
}

// Full are the options of the figures in BENCHMARKS.md.
func Full() Options {
	return Options{Files: 5000, ARCFiles: 5000, Queued: 1_000_000, Restart: 100_000, Depth: 10_000_000, Latency: 200, Saturate: 300, ScalePerReplica: 200,
		Load: 1_000_000, LoadBad: 1000, LoadCLI: 1000, Failover: 1_000_000, BigFile: 2 << 30, BigFiles: 200}
}

// Figure is one measured line of the report.
type Figure struct {
	What   string
	Value  string
	Target string
	// Met is "yes", "no" or "" (no target).
	Met string
	// Command, if set, measures this figure alone (a Go benchmark, say);
	// the report names the run's command for a figure without one.
	Command string
}

// Report is one run's machine and figures.
type Report struct {
	Machine string
	// Storage is where the files and JetStream stores were, and on what.
	Storage  string
	Started  time.Time
	Took     time.Duration
	Options  Options
	Figures  []Figure
	Warnings []string
}

// ms writes a short time in milliseconds.
func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

// times writes a ratio to two places, rounded down: 0.998 is "0.99×",
// never a "1.00×" that misses a target of 1.0.
func times(r float64) string {
	return fmt.Sprintf("%.2f×", math.Floor(r*100)/100)
}

func met(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

// Run measures everything, one thing at a time.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "sluice-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		o.Dir = d
	}
	r := &Report{Machine: machine(), Storage: storage(o.Dir), Started: time.Now(), Options: o}
	say := func(format string, args ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, format+"\n", args...)
		}
	}
	dir := func(name string) string {
		d, err := subdir(o.Dir, name)
		if err != nil {
			panic(err) // the work directory was just made
		}
		return d
	}

	// Memory first, while the heap holds nothing else.
	var queued *DepthResult // the restart over o.Queued, when run in a scheduler process
	if o.Exe != "" {
		say("scheduler process memory per queued DTR, %d queued…", o.Queued)
		q, err := Depth(ctx, dir("queued"), o.Queued, o.Exe)
		if err != nil {
			return nil, err
		}
		queued = &q
		per := float64(q.RSS) / float64(max(q.Held, 1))
		r.Figures = append(r.Figures, Figure{What: fmt.Sprintf("Scheduler process RSS per queued DTR, %d queued in 1,000 shares (`sluice scheduler` alone, restarted over them)", o.Queued),
			Value:  fmt.Sprintf("%.0f bytes (%.0f MiB settled, peak %.0f MiB while loading)", per, float64(q.RSS)/(1<<20), float64(q.PeakRSS)/(1<<20)),
			Target: "≤ 512 bytes", Met: met(per <= 512 && q.Held == o.Queued)})
	} else {
		say("memory per queued DTR, %d queued…", o.Queued)
		mem := MemoryPerQueued(o.Queued)
		r.Figures = append(r.Figures, Figure{What: fmt.Sprintf("Scheduler heap per queued DTR, %d queued in 1,000 shares (the core's live heap only: no sluice binary to run the scheduler process)", o.Queued),
			Value: fmt.Sprintf("%.0f bytes", mem), Target: "≤ 512 bytes", Met: met(mem <= 512)})
	}

	say("bare 4-stage JetStream pipeline, %d items…", o.Files)
	bare, err := BarePipeline(ctx, dir("bare"), o.Files, false)
	if err != nil {
		return nil, err
	}
	r.Figures = append(r.Figures, Figure{What: "Baseline: bare 4-stage JetStream consume→publish pipeline, one message at a time (publish, wait until stored, acknowledge), loopback TCP, one process",
		Value: fmt.Sprintf("%.0f items/s", bare), Command: fmt.Sprintf("go test -run XXX -bench 'BarePipeline$' -benchtime %dx ./bench/", o.Files)})
	var bareSep float64
	if o.Exe != "" {
		say("the same pipeline, each stage its own process…")
		if bareSep, err = BarePipelineSeparate(ctx, dir("bare-separate"), o.Files, o.Exe); err != nil {
			return nil, err
		}
		r.Figures = append(r.Figures, Figure{What: "Baseline: the same pipeline, each of its 4 stages its own process (as Sluice's roles below)",
			Value: fmt.Sprintf("%.0f items/s", bareSep), Command: fmt.Sprintf("go test -run XXX -bench BarePipelineSeparate -benchtime %dx ./bench/", o.Files)})
	}

	say("cp of %d files of 1 KiB…", o.Files)
	cp, err := CopyBaseline(ctx, dir("cp"), o.Files, 1024)
	if err != nil {
		return nil, err
	}
	if cp > 0 {
		r.Figures = append(r.Figures, Figure{What: "Baseline: `cp -r` of the same number of 1 KiB files (the file system alone, one process)",
			Value: fmt.Sprintf("%.0f files/s", cp)})
	}
	say("batched 4-stage JetStream pipeline, %d items…", o.Files)
	batched, err := BatchedPipeline(ctx, dir("batched"), o.Files, false)
	if err != nil {
		return nil, err
	}
	r.Figures = append(r.Figures, Figure{What: fmt.Sprintf("Baseline: the same pipeline batched as Sluice is (each stage takes up to %d messages at once, publishes them asynchronously and acknowledges them once all are stored), one process", batchedPull),
		Value:   fmt.Sprintf("%.0f items/s = %s the bare pipeline", batched, times(batched/bare)),
		Command: fmt.Sprintf("go test -run XXX -bench 'BatchedPipeline$' -benchtime %dx ./bench/", o.Files)})
	var batchedSep float64
	if o.Exe != "" {
		say("the batched pipeline, each stage its own process…")
		if batchedSep, err = BatchedPipelineSeparate(ctx, dir("batched-separate"), o.Files, o.Exe); err != nil {
			return nil, err
		}
		r.Figures = append(r.Figures, Figure{What: "Baseline: the batched pipeline, each of its 4 stages its own process",
			Value:   fmt.Sprintf("%.0f items/s = %s the bare pipeline of that shape", batchedSep, times(batchedSep/bareSep)),
			Command: fmt.Sprintf("go test -run XXX -bench BatchedPipelineSeparate -benchtime %dx ./bench/", o.Files)})
	}
	ofCp := func(rate float64) string {
		if cp <= 0 {
			return ""
		}
		return fmt.Sprintf(", %.2f× cp", rate/cp)
	}

	say("Sluice end to end, %d files of 1 KiB, all roles in one process, %d slots per state…", o.Files, ThroughputSlots)
	one, oneCPU, err := throughput(ctx, dir("one"), o.Files, ThroughputSlots, "")
	if err != nil {
		return nil, err
	}
	r.Figures = append(r.Figures, Figure{What: fmt.Sprintf("Sluice end to end, 1 KiB file:// files, all roles in one process, %d slots per state", ThroughputSlots),
		Value:  fmt.Sprintf("%.0f DTR/s = %s the batched pipeline, %s the bare one%s", one, times(one/batched), times(one/bare), ofCp(one)),
		Target: "≥ 2,000 DTR/s and ≥ 1.0× the batched pipeline", Met: met(one >= 2000 && one >= batched),
		Command: fmt.Sprintf("go test -run XXX -bench 'Throughput$/slots=%d$' -benchtime %dx ./bench/", ThroughputSlots, o.Files)})
	var sepCPU map[string]time.Duration
	if o.Exe != "" {
		say("Sluice end to end, %d files, roles as separate processes, %d slots per state…", o.Files, ThroughputSlots)
		sep, cpu, err := throughput(ctx, dir("separate"), o.Files, ThroughputSlots, o.Exe)
		if err != nil {
			return nil, err
		}
		sepCPU = cpu
		r.Figures = append(r.Figures, Figure{What: fmt.Sprintf("Sluice end to end, 1 KiB file:// files, each role its own process, %d slots per state", ThroughputSlots),
			Value: fmt.Sprintf("%.0f DTR/s = %s the batched pipeline with its stages as separate processes, %s the bare one of that shape, %s the batched one in one process%s",
				sep, times(sep/batchedSep), times(sep/bareSep), times(sep/batched), ofCp(sep)),
			Target: "≥ 2,000 DTR/s and ≥ 1.0× the batched pipeline of the same shape", Met: met(sep >= 2000 && sep >= batchedSep),
			Command: fmt.Sprintf("go test -run XXX -bench 'ThroughputSeparate$' -benchtime %dx ./bench/", o.Files)})
	}
	r.Figures = append(r.Figures, cpuFigure(o.Files, oneCPU[ThisProcess], sepCPU))
	// ARC's slot counts, with everything else at a site's defaults too:
	// bound by each slot's turnaround, not by batches.
	if o.ARCFiles > 0 {
		say("Sluice end to end, %d files, all roles in one process, %d slots per state (ARC's defaults)…", o.ARCFiles, ARCSlots)
		rate, err := ThroughputAtDefaults(ctx, dir("arc"), o.ARCFiles)
		if err != nil {
			return nil, err
		}
		r.Figures = append(r.Figures, Figure{What: fmt.Sprintf("Sluice end to end, 1 KiB file:// files, all roles in one process, %d slots per state (ARC's defaults; every other setting a site's default too)", ARCSlots),
			Value:  fmt.Sprintf("%.0f DTR/s = %s the %d-slot figure above", rate, times(rate/one), ThroughputSlots),
			Target: fmt.Sprintf("≥ 5,000 DTR/s or ≥ 0.7× the %d-slot figure", ThroughputSlots), Met: met(rate >= 5000 || rate >= 0.7*one),
			Command: fmt.Sprintf("go test -run XXX -bench 'ThroughputARCDefaults$' -benchtime %dx ./bench/", o.ARCFiles)})
	}

	// Why a DTR costs more at ARC's slot counts: fewer DTRs in each
	// message, so more messages through the server for each.
	if o.ARCFiles > 0 {
		say("NATS messages per DTR, %d and %d slots per state…", ARCSlots, ThroughputSlots)
		arcTotal, arcKinds, err := MessagesPerDTR(ctx, dir("messages-arc"), o.ARCFiles, 0)
		if err != nil {
			return nil, err
		}
		total, kinds, err := MessagesPerDTR(ctx, dir("messages"), o.Files, ThroughputSlots)
		if err != nil {
			return nil, err
		}
		r.Figures = append(r.Figures, Figure{What: "NATS messages through the server per DTR, 1 KiB file:// files, all roles in one process (every message a client publishes and every one the server sends to a client's inbox; counted by a subscription to every subject)",
			Value: fmt.Sprintf("%d slots per state (ARC's defaults): %s; %d slots per state: %s", ARCSlots, messagesValue(arcTotal, arcKinds), ThroughputSlots, messagesValue(total, kinds))})
	}

	if o.BigFile > 0 {
		say("big files: one of %d MiB, file→file, http→file, with checksums; %d of 10 MiB…", o.BigFile>>20, o.BigFiles)
		bd := dir("big")
		big, err := BigFiles(ctx, bd, o.BigFile, o.BigFiles)
		_ = os.RemoveAll(bd) // gigabytes, in memory on a tmpfs, before the depth figure needs it
		if err != nil {
			return nil, err
		}
		r.Figures = append(r.Figures, big...)
	}

	say("submit→transfer-start latency, %d DTRs one at a time…", o.Latency)
	lat, err := Latency(ctx, dir("latency"), o.Latency)
	if err != nil {
		return nil, err
	}
	p50, p99 := Percentile(lat, 50), Percentile(lat, 99)
	r.Figures = append(r.Figures, Figure{What: fmt.Sprintf("Submit→transfer-start latency on an idle system (%d DTRs, plain JSON on dtr.submit)", len(lat)),
		Value:  fmt.Sprintf("p50 %s, p99 %s", p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond)),
		Target: "p50 ≤ 5 ms, p99 ≤ 20 ms", Met: met(p50 <= 5*time.Millisecond && p99 <= 20*time.Millisecond)})

	say("saturated run: two shares, 10 transfer slots, 200 ms transfers…")
	sat, err := Saturate(ctx, dir("saturate"), o.Saturate, 200*time.Millisecond)
	if err != nil {
		return nil, err
	}
	r.Figures = append(r.Figures, Figure{What: fmt.Sprintf("Slot utilisation, saturated (10 transfer slots, 2×%d downloads of 200 ms; %d s with both shares waiting)", o.Saturate, sat.Seconds),
		Value: fmt.Sprintf("%.1f%% of slots granted; %.2f%% of slot-time moving bytes while the slots were saturated (all busy first to last transfer start), %.2f%% over the whole run; "+
			"a slot's turnaround, p50 (p90): %s (%s) from a transfer's end to the decision on its result, %s (%s) from a grant's decision to its transfer's start",
			100*sat.Utilisation, 100*sat.Transferring, 100*sat.TransferringAll,
			ms(Percentile(sat.ToDecision, 50)), ms(Percentile(sat.ToDecision, 90)), ms(Percentile(sat.ToStart, 50)), ms(Percentile(sat.ToStart, 90))),
		Target: "≥ 99.5% of slot-time moving bytes", Met: met(sat.Transferring >= 0.995)})
	r.Figures = append(r.Figures, Figure{What: "Realised transfer split against the configured one (atlas=60, cms=40)",
		Value: fmt.Sprintf("atlas %.1f%% (configured %.0f%%), cms %.1f%% (configured %.0f%%)",
			100*sat.Split["atlas-download"], 100*sat.Configured["atlas-download"], 100*sat.Split["cms-download"], 100*sat.Configured["cms-download"])})

	say("scheduler restart to first grant, %d stored…", o.Restart)
	rs, err := RestartToFirstGrant(ctx, dir("restart"), o.Restart)
	if err != nil {
		return nil, err
	}
	r.Figures = append(r.Figures, Figure{What: fmt.Sprintf("Scheduler restart to first grant, %d DTRs stored as queued", o.Restart),
		Value: fmt.Sprintf("%.2f s", rs.Seconds()), Target: "≤ 2 s", Met: met(rs <= 2*time.Second)})
	if o.Depth > 0 {
		var d DepthResult
		var depthErr error
		if queued != nil && o.Depth == o.Queued {
			d = *queued // measured above, the same restart
		} else {
			say("%d DTRs queued in 1,000 shares: held, restart to first grant…", o.Depth)
			dd := dir("depth")
			d, depthErr = Depth(ctx, dd, o.Depth, o.Exe)
			_ = os.RemoveAll(dd) // gigabytes, in memory on a tmpfs
			if depthErr != nil && ctx.Err() != nil {
				return nil, depthErr
			}
		}
		held := fmt.Sprintf("held %d", d.Held)
		if d.RSS > 0 {
			held += fmt.Sprintf(", process RSS %.0f MiB = %.0f bytes per DTR (peak %.0f MiB)", float64(d.RSS)/(1<<20), float64(d.RSS)/float64(max(d.Held, 1)), float64(d.PeakRSS)/(1<<20))
		}
		value := fmt.Sprintf("%s; restarted after a kill, first grant %.2f s after its start; (first start, over a store with no restart index: first grant %.2f s, all loaded %.2f s)",
			held, d.Restart.Seconds(), d.FirstGrant.Seconds(), d.Loaded.Seconds())
		if depthErr != nil {
			// Said in the report, so that one failed figure does not
			// lose the run's others.
			value = "failed: " + depthErr.Error()
		}
		r.Figures = append(r.Figures, Figure{What: fmt.Sprintf("%d DTRs queued in 1,000 shares: held (RSS per DTR), restart to first grant", o.Depth),
			Value: value, Target: "all held, restart to first grant ≤ 5 s", Met: met(depthErr == nil && d.Held == o.Depth && d.Restart > 0 && d.Restart <= 5*time.Second)})
	}

	for _, cutOff := range []bool{false, true} {
		if o.Failover <= 0 {
			break
		}
		how, name := "killed (its connection gone, the process stopped)", "failover-killed"
		if cutOff {
			how, name = "cut off from NATS (it runs on, and steps down by itself)", "failover-cut"
		}
		say("failover: the leading scheduler %s with %d queued…", how, o.Failover)
		f, err := Failover(ctx, dir(name), o.Failover, cutOff)
		if err != nil {
			return nil, err
		}
		r.Figures = append(r.Figures, Figure{What: fmt.Sprintf("Failover: %d DTRs queued, the leading scheduler %s, a warm standby (SLUICE_LEADER_TTL %s)", o.Failover, how, FailoverTTL),
			Value: fmt.Sprintf("first grant of the standby %.2f s after the loss; standby ready %.1f s after its start (the leader's restart index read); %d held + %d final of %d, %d granted twice",
				f.Gap.Seconds(), f.Warm.Seconds(), f.Held, f.Final, o.Failover, f.Twice),
			Target: "≤ 5 s, none lost or granted twice", Met: met(f.Gap <= 5*time.Second && f.Held+f.Final >= o.Failover && f.Twice == 0)})
	}

	var rates []float64
	for _, n := range []int{1, 2, 4} {
		say("scale-out: %d delivery replicas, 100 ms transfers…", n)
		rate, err := ScaleOut(ctx, dir(fmt.Sprintf("scale%d", n)), n, 5, o.ScalePerReplica, 100*time.Millisecond)
		if err != nil {
			return nil, err
		}
		rates = append(rates, rate)
	}
	r.Figures = append(r.Figures, Figure{What: "Scale-out: 100 ms transfers, 5 per delivery replica, 1 / 2 / 4 replicas",
		Value:  fmt.Sprintf("%.0f / %.0f / %.0f files/s = 1 / %.2f× / %.2f×", rates[0], rates[1], rates[2], rates[1]/rates[0], rates[2]/rates[0]),
		Target: "≥ 3.5× at 4", Met: met(rates[2]/rates[0] >= 3.5)})
	if o.Load > 0 {
		if o.NATSCLI == "" {
			o.LoadCLI = 0
		}
		say("load: %d DTRs on dtr.submit (%d malformed), %d more with nats pub…", o.Load, o.LoadBad, o.LoadCLI)
		l, err := Load(ctx, dir("load"), o.Load, o.LoadBad, o.Exe, o.NATSCLI, o.LoadCLI)
		if err != nil {
			return nil, err
		}
		how := "a Go publisher"
		if l.CLI > 0 {
			how += fmt.Sprintf(", %d more with `nats pub`", l.CLI)
		} else {
			r.Warnings = append(r.Warnings, "The load run published nothing with the NATS CLI: no `nats` on PATH.")
		}
		mem := "the scheduler ran in this process"
		if l.PeakRSS > 0 {
			mem = fmt.Sprintf("scheduler peak RSS %.0f MiB = %.0f bytes per held DTR", float64(l.PeakRSS)/(1<<20), float64(l.PeakRSS)/float64(max(l.Held, 1)))
		}
		r.Figures = append(r.Figures, Figure{What: fmt.Sprintf("Load: %d DTRs on dtr.submit (%s), %d of them malformed; scheduler only, so they stay queued", l.Published, how, l.Bad),
			Value: fmt.Sprintf("published at %.0f/s (JetStream acknowledgements: the publisher's backpressure); the scheduler took in %.0f/s; it holds %d, rejected %d; %s",
				l.PublishRate, l.IntakeRate, l.Held, l.Rejected, mem),
			Target: "none lost, only bad input rejected", Met: met(l.Held == l.Published-l.Bad && l.Rejected == l.Bad)})
	}
	r.Took = time.Since(r.Started)
	return r, nil
}

// cpuFigure is the CPU time per DTR of the 500-slot runs of n DTRs: end to
// end with the roles in one process (one: that process's CPU), and by role
// with each role its own process (separate, if measured: throughput's).
func cpuFigure(n int, one time.Duration, separate map[string]time.Duration) Figure {
	perDTR := func(t time.Duration) float64 { return float64(t.Microseconds()) / float64(n) }
	f := Figure{What: fmt.Sprintf("CPU per DTR, %d slots: end to end with the roles in one process; by role with each its own process", ThroughputSlots),
		Value: fmt.Sprintf("one process %.0f µs", perDTR(one)), Target: "≤ 150 µs in one process", Met: met(perDTR(one) <= 150)}
	if separate == nil {
		return f
	}
	var all time.Duration
	for _, t := range separate {
		all += t
	}
	f.Value = fmt.Sprintf("scheduler %.0f µs, processor %.0f µs, delivery %.0f µs, generator %.0f µs, NATS server + harness %.0f µs; end to end %.0f µs (separate processes), %s",
		perDTR(separate["scheduler"]), perDTR(separate["processor"]), perDTR(separate["delivery"]), perDTR(separate["generator"]),
		perDTR(separate[ThisProcess]), perDTR(all), f.Value)
	f.Target = "scheduler ≤ 25 µs; " + f.Target
	f.Met = met(perDTR(separate["scheduler"]) <= 25 && perDTR(one) <= 150)
	return f
}

// Markdown writes the report as BENCHMARKS.md.
func (r *Report) Markdown(w io.Writer, command string) error {
	b := bufio.NewWriter(w)
	fmt.Fprintf(b, "# Benchmarks\n\nWritten by `%s` on %s in %s.\n\n", command, r.Started.UTC().Format("2006-01-02 15:04 MST"), r.Took.Round(time.Second))
	fmt.Fprintf(b, "Machine: %s.\n\n", r.Machine)
	fmt.Fprintln(b, "The machine is shared and noisy: speeds are set against a baseline measured in the same run.")
	fmt.Fprintf(b, "Every Sluice here runs on an embedded NATS server; its JetStream store and the files are in %s.\n", r.Storage)
	fmt.Fprintln(b)
	fmt.Fprintf(b, "Every figure is from this run of `%s`. The last column names the command that measures a figure alone, "+
		"where there is one (a Go benchmark in bench/, run from the repository's root; it collects garbage at Go's defaults, "+
		"where `sluice bench` collects as `sluice all` does).\n", command)
	fmt.Fprintln(b)
	fmt.Fprintln(b, "| What | Figure | Target | Met | Command |")
	fmt.Fprintln(b, "|---|---|---|---|---|")
	for _, f := range r.Figures {
		cmd := "`sluice bench` (this run)"
		if f.Command != "" {
			cmd = "`" + f.Command + "`"
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", f.What, f.Value, f.Target, f.Met, cmd)
	}
	for _, wn := range r.Warnings {
		fmt.Fprintf(b, "\n%s\n", wn)
	}
	return b.Flush()
}

// storage describes the file system of dir.
func storage(dir string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return dir
	}
	kinds := map[int64]string{0x01021994: "tmpfs, in memory", 0xEF53: "ext4", 0x58465342: "xfs", 0x9123683E: "btrfs", 0x794c7630: "overlayfs"}
	kind, ok := kinds[int64(st.Type)]
	if !ok {
		kind = fmt.Sprintf("file system type %#x", st.Type)
	}
	return fmt.Sprintf("%s (%s)", filepath.Dir(dir), kind)
}

// machine describes the CPU, cores, memory and Go.
func machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				cpu = strings.TrimSpace(line[strings.IndexByte(line, ':')+1:])
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			mem = fmt.Sprintf(", %.0f GiB", float64(kb)/(1<<20))
		}
	}
	return fmt.Sprintf("%s, %d cores%s, %s %s/%s", cpu, runtime.NumCPU(), mem, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
