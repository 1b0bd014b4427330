package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-dtr/sluice/bench"
)

// benchCommand measures Sluice against the machine's limits and writes
// the figures to BENCHMARKS.md (or --out).
func benchCommand(cfg *Config) *cobra.Command {
	var o benchOptions
	c := &cobra.Command{
		Use:   "bench [flags]",
		Short: "Measure throughput, latency, slot use, memory, restart, failover and scale-out; write BENCHMARKS.md",
		Long: "Measure throughput, latency, slot use, memory, restart, failover to a standby scheduler and\n" +
			"scale-out on the same machine, Sluice's throughput against a 4-stage JetStream pipeline batched as\n" +
			"Sluice is (and against the same pipeline one message at a time), and write the figures, each with\n" +
			"its command, to BENCHMARKS.md (or --out).",
		Args: exactArgs(0, "bench takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var given []string
			cmd.Flags().Visit(func(f *pflag.Flag) {
				if f.Value.Type() == "bool" && f.Value.String() == "true" {
					given = append(given, "--"+f.Name)
				} else {
					given = append(given, "--"+f.Name, f.Value.String())
				}
			})
			return benchRun(cmd.Context(), cfg, o, given, cmd.OutOrStdout())
		},
	}
	fs := c.Flags()
	natsFlag(fs, cfg)
	fs.BoolVar(&o.quick, "quick", false, "smaller runs (a few minutes) instead of the full figures (many minutes, and GiBs of memory and /dev/shm or disk)")
	fs.StringVar(&o.out, "out", "BENCHMARKS.md", "file to write the report to; - for standard output")
	fs.BoolVar(&o.separate, "separate", true, "also run the roles as separate processes of this binary")
	fs.StringVar(&o.cli, "nats-cli", "", "the NATS CLI that publishes part of the load (default: nats on PATH, if any)")
	fs.StringVar(&o.dir, "dir", "", "where the files and JetStream stores go: a new directory under this one (default: $TMPDIR or /tmp); on a tmpfs such as /dev/shm the figures leave the disk out")
	fs.IntVar(&o.stage, "pipeline-stage", -1, "run only stage `N` (0-3) of the bare JetStream pipeline against --nats, until stopped: how the bench runs that baseline as separate processes")
	fs.BoolVar(&o.batched, "pipeline-batched", false, "with --pipeline-stage, run that stage of the batched pipeline (batches consumed, published asynchronously, acknowledged once stored)")
	return c
}

type benchOptions struct {
	quick, separate bool
	batched         bool
	out, cli, dir   string
	stage           int
}

func benchRun(ctx context.Context, cfg *Config, opts benchOptions, args []string, stdout io.Writer) error {
	quick, out, separate, cli, dir, stage := &opts.quick, &opts.out, &opts.separate, &opts.cli, &opts.dir, &opts.stage
	if *stage >= 0 {
		if opts.batched {
			return bench.RunBatchedPipelineStage(ctx, cfg.NATSURL, *stage)
		}
		return bench.RunPipelineStage(ctx, cfg.NATSURL, *stage)
	}
	// Measured as `sluice all` runs: the roles in this process collect
	// garbage as a serving process does.
	go collectLess(ctx, "bench")
	o := bench.Full()
	if *quick {
		o = bench.Quick()
	}
	o.Progress = stdout
	o.NATSCLI = *cli
	if *dir != "" {
		d, err := os.MkdirTemp(*dir, "sluice-bench-")
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer os.RemoveAll(d)
		o.Dir = d
	}
	if o.NATSCLI == "" {
		o.NATSCLI, _ = exec.LookPath("nats")
	}
	if *separate {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		o.Exe = exe
	}
	// Traced as `sluice all` is (spans with ids, recorded only when an
	// OTLP endpoint is set).
	var r *bench.Report
	if err := traced(ctx, "all", func() (err error) {
		r, err = bench.Run(ctx, o)
		return err
	}); err != nil {
		return err
	}
	command := "sluice " + strings.Join(append([]string{"bench"}, args...), " ")
	if *out == "-" {
		return r.Markdown(stdout, command)
	}
	// Sections that other commands measure (the fault gauntlet) are kept.
	kept := keptSections(*out)
	f, err := os.Create(*out)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := r.Markdown(f, command); err != nil {
		f.Close()
		return err
	}
	if _, err := f.WriteString(kept); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s\n", *out)
	return r.Markdown(stdout, command)
}

// keptHeading begins the part of BENCHMARKS.md that `sluice bench` does
// not write and keeps as it is: figures measured by other commands.
const keptHeading = "\n## Measured by other commands\n"

// keptSections returns the part of the report at path that a new report
// keeps: from keptHeading to the end, or nothing.
func keptSections(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if i := strings.Index(string(b), keptHeading); i >= 0 {
		return string(b[i:])
	}
	return ""
}
