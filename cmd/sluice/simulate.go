package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/services/scheduler/simulate"
)

// simulateCommand replays a workload through the scheduler core under one
// or more policies and prints what each group got; --svg draws the slots.
func simulateCommand(cfg *Config) *cobra.Command {
	var o simulateOptions
	c := &cobra.Command{
		Use:   "simulate [flags] WORKLOAD.csv | --example | --scale-example | --links LINKS.csv | --links-example",
		Short: "Replay a workload through the scheduler under one or more policies",
		Long: "Replay a workload through the scheduler core (no NATS, a virtual clock) under one or more\n" +
			"policies and print what each group of users got; --svg draws the slots each group held.\n\n" +
			"The workload is CSV with a header: at (seconds),dn,fqan,bytes,priority,direction (see docs/simulate.md).\n\n" +
			"--shards N splits the shares between N cores with slot budgets from a global allocator and\n" +
			"prints the realised split against the configured one and the decision capacity; a list\n" +
			"(--shards 1,2,4) prints the comparison (see docs/scale.md).\n\n" +
			"--links LINKS.csv (or --links-example) simulates storage links instead: Sluice's per-link optimizer\n" +
			"and FTS3's rule on the same links, with how long each took to reach 90% of what a link could\n" +
			"carry after each change; --svg draws both controllers' limits and throughput, --csv writes the\n" +
			"samples (see docs/simulate.md).",
		Args: maxArgs(1, "simulate takes one workload file, or --example"),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.sharded = cmd.Flags().Changed("shards")
			return simulateRun(cfg, o, args, cmd.OutOrStdout())
		},
	}
	fs := c.Flags()
	serveFlags(fs, "scheduler", cfg)
	fs.StringVar(&o.policies, "policies", cfg.Policy, "policies to compare, comma-separated: "+strings.Join(app.Policies(), ", ")+" (each configured by its SLUICE_* settings)")
	fs.BoolVar(&o.example, "example", false, "replay the built-in example workload with the policy settings of docs/scheduling.md (environment wins)")
	fs.StringVar(&o.writeExample, "write-example", "", "write the example workload to this CSV file and stop")
	fs.IntVar(&o.Slots, "slots", 0, "transfer slots (default: --maxdelivery, SLUICE_MAXDELIVERY)")
	fs.Float64Var(&o.SlotRate, "rate", 100e6, "bytes per second one transfer moves")
	fs.DurationVar(&o.Overhead, "overhead", time.Second, "time added to every transfer")
	fs.DurationVar(&o.Step, "step", 100*time.Millisecond, "virtual tick")
	fs.DurationVar(&o.Sample, "sample", 10*time.Second, "how often the picture samples the slots")
	fs.StringVar(&o.svg, "svg", "", "write an SVG picture of the slots each group held over time to this file")
	fs.BoolVar(&o.scaleExample, "scale-example", false, "replay the built-in workload of docs/scale.md (twelve VOs on 200 slots) with its settings (environment wins)")
	fs.StringVar(&o.shards, "shards", "1", "split the shares between this many schedulers' cores, each with a slot budget from a global allocator; a list (1,2,4) compares them")
	fs.StringVar(&o.shardBy, "shard-by", string(simulate.ShardByLoad), "how shares are assigned to shards: load (an explicit map, heaviest share to the lightest shard) or hash (FNV-1a of the share's name)")
	fs.DurationVar(&o.budgetPeriod, "budget-period", time.Second, "how often the allocator leases the shards their slot budgets")
	fs.IntVar(&o.capacityRuns, "capacity-runs", 3, "runs of the decision capacity measurement with --shards (the fastest counts)")
	linkSimFlags(fs, &o.linkSim)
	o.json = jsonFlag(c)
	completeSchedulerFlags(c)
	_ = c.RegisterFlagCompletionFunc("policies", func(_ *cobra.Command, _ []string, typed string) ([]string, cobra.ShellCompDirective) {
		// A comma-separated list: offer each policy after what is typed.
		head := typed[:strings.LastIndex(typed, ",")+1]
		var out []string
		for _, p := range app.Policies() {
			out = append(out, head+p)
		}
		return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
	})
	return c
}

type simulateOptions struct {
	simulate.Options
	policies, writeExample, svg, shards, shardBy string
	example, scaleExample, sharded               bool
	budgetPeriod                                 time.Duration
	capacityRuns                                 int
	json                                         *bool
	linkSim                                      linkSimOptions
}

func simulateRun(cfg *Config, o simulateOptions, args []string, stdout io.Writer) error {
	opt, policies, writeExample, svg := o.Options, &o.policies, &o.writeExample, &o.svg
	if o.linkSim.example || o.linkSim.links != "" {
		if len(args) > 0 || o.example || o.scaleExample {
			return usageErrorf("--links and --links-example simulate links, not a workload: give no workload")
		}
		return simulateLinks(cfg, o.linkSim, o.svg, o.json != nil && *o.json, stdout)
	}
	if opt.Slots == 0 {
		opt.Slots = cfg.MaxDelivery
	}
	example := simulate.Example
	if o.scaleExample {
		example = simulate.ScaleExample
	}
	if *writeExample != "" {
		f, err := os.Create(*writeExample)
		if err != nil {
			return err
		}
		if err := simulate.WriteWorkload(f, example()); err != nil {
			f.Close()
			return fmt.Errorf("write %s: %w", *writeExample, err)
		}
		return f.Close()
	}
	var work []simulate.Arrival
	switch {
	case o.example && o.scaleExample:
		return usageErrorf("give --example or --scale-example, not both")
	case (o.example || o.scaleExample) && len(args) == 0:
		work = example()
	case !o.example && !o.scaleExample && len(args) == 1:
		f, err := os.Open(args[0])
		if err != nil {
			return err
		}
		defer f.Close()
		if work, err = simulate.ReadWorkload(f); err != nil {
			return fmt.Errorf("%s: %w", args[0], err)
		}
	default:
		return usageErrorf("give one workload file, or --example")
	}
	if o.sharded {
		return simulateShards(cfg, o, opt, work, stdout)
	}
	var results []simulate.Result
	for _, p := range strings.Split(*policies, ",") {
		c := cfg.Config
		c.Policy = strings.TrimSpace(p)
		cc, err := c.CoreConfig()
		if err != nil {
			return err
		}
		r, err := simulate.Run(cc, work, opt)
		if err != nil {
			return err
		}
		results = append(results, r)
		if o.json != nil && *o.json {
			continue
		}
		if err := r.Table(stdout); err != nil {
			return err
		}
		fmt.Fprintln(stdout)
	}
	if *svg != "" {
		f, err := os.Create(*svg)
		if err != nil {
			return err
		}
		if err := simulate.SVG(f, results, opt.Slots); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		if o.json == nil || !*o.json {
			fmt.Fprintf(stdout, "wrote %s\n", *svg)
		}
	}
	if o.json != nil && *o.json {
		return printJSON(stdout, results)
	}
	return nil
}

// simulateExampleSettings returns the settings of the built-in workload
// that args ask simulate for, nil if none.
func simulateExampleSettings(args []string) map[string]string {
	flag := func(name string) func(string) bool {
		return func(a string) bool { return a == "-"+name || a == "--"+name }
	}
	switch {
	case slices.ContainsFunc(args, flag("example")):
		return simulate.ExampleSettings
	case slices.ContainsFunc(args, flag("scale-example")):
		return simulate.ScaleSettings
	}
	return nil
}

// setExampleSettings puts the settings of a built-in workload (the
// comparison of docs/scheduling.md (Policies), or docs/scale.md's) in the
// environment, where it does not say otherwise, before the environment is
// read.
func setExampleSettings(settings map[string]string) {
	for k, v := range settings {
		if _, set := os.LookupEnv(k); !set {
			os.Setenv(k, v)
		}
	}
}

// shardedRun is one policy's run split between shards, and the decision
// capacity of those shards.
type shardedRun struct {
	simulate.ShardedResult
	Capacity simulate.Capacity `json:"capacity"`
}

// simulateShards runs the workload with each number of shards of
// --shards under each policy and prints the split and the capacity: one
// run in full, several as a comparison.
func simulateShards(cfg *Config, o simulateOptions, opt simulate.Options, work []simulate.Arrival, stdout io.Writer) error {
	var counts []int
	for _, f := range strings.Split(o.shards, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return usageErrorf("--shards %q: want numbers ≥ 1, comma-separated", o.shards)
		}
		counts = append(counts, n)
	}
	if o.capacityRuns < 1 {
		return usageErrorf("--capacity-runs %d: want 1 or more", o.capacityRuns)
	}
	jsonOut := o.json != nil && *o.json
	var all []shardedRun
	var results []simulate.Result
	for _, p := range strings.Split(o.policies, ",") {
		c := cfg.Config
		c.Policy = strings.TrimSpace(p)
		cc, err := c.CoreConfig()
		if err != nil {
			return err
		}
		var runs []shardedRun
		for _, n := range counts {
			sh := simulate.Sharding{Shards: n, By: simulate.ShardBy(o.shardBy), Period: o.budgetPeriod}
			r, err := simulate.RunSharded(cc, work, opt, sh)
			if err != nil {
				return fmt.Errorf("%d shards: %w", n, err)
			}
			capacity, err := simulate.MeasureCapacity(cc, work, opt, sh, o.capacityRuns)
			if err != nil {
				return err
			}
			runs = append(runs, shardedRun{ShardedResult: r, Capacity: capacity})
			results = append(results, r.Result)
		}
		all = append(all, runs...)
		if jsonOut {
			continue
		}
		if len(runs) == 1 {
			err = shardedTable(stdout, runs[0])
		} else {
			err = shardComparison(stdout, runs, len(work), opt.Slots)
		}
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout)
	}
	if o.svg != "" {
		f, err := os.Create(o.svg)
		if err != nil {
			return err
		}
		if err := simulate.SVG(f, results, opt.Slots); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		if !jsonOut {
			fmt.Fprintf(stdout, "wrote %s\n", o.svg)
		}
	}
	if jsonOut {
		return printJSON(stdout, all)
	}
	return nil
}

// shardedTable prints one sharded run: what each group got, each share's
// split, and the decision capacity.
func shardedTable(w io.Writer, r shardedRun) error {
	if err := r.Table(w); err != nil {
		return err
	}
	if len(r.Split) == 0 {
		fmt.Fprintf(w, "%d shards (shares by %s, budgets every %s): no moment when every share had files waiting, no split to measure\n", r.Shards, r.By, r.Period)
	} else {
		fmt.Fprintf(w, "%d shards (shares by %s, budgets every %s): the split of transfer slot-time over the %s every share had files waiting\n",
			r.Shards, r.By, r.Period, r.Saturated.Round(time.Second))
		fmt.Fprintf(w, "%-24s %5s %8s %10s %9s %9s\n", "SHARE", "SHARD", "PRIORITY", "CONFIGURED", "REALISED", "ERROR")
		for _, s := range r.Split {
			fmt.Fprintf(w, "%-24s %5d %8d %9.2f%% %8.2f%% %+6.2f pp\n", s.Share, s.Shard, s.Priority, s.Configured, s.Realised, s.ErrorPP)
		}
		fmt.Fprintf(w, "largest error %.2f pp\n", r.MaxErrorPP)
	}
	c := r.Capacity
	_, err := fmt.Fprintf(w, "decision capacity (transfers taking no time, every file queued at the start; fastest of %d): %d decisions for %d DTRs in %s: %.0f decisions/s, %.0f DTRs/s; critical path (each shard timed alone): %.0f decisions/s\n",
		c.Runs, c.Decisions, c.DTRs, c.Wall.Round(time.Millisecond), c.DecisionsPerSecond, c.DTRsPerSecond, c.DecisionsPerSecondCriticalPath)
	return err
}

// shardComparison prints runs of one policy with different numbers of
// shards side by side: the largest split error and the decision capacity
// against the first run's, then each share's realised split.
func shardComparison(w io.Writer, runs []shardedRun, files, slots int) error {
	first := runs[0]
	fmt.Fprintf(w, "policy %s: %d files on %d transfer slots, shares by %s, budgets every %s; capacity with transfers taking no time (fastest of %d)\n",
		first.Policy, files, slots, first.By, first.Period, first.Capacity.Runs)
	fmt.Fprintf(w, "%6s %10s %10s %13s %8s %15s %8s %10s\n", "SHARDS", "MAX ERROR", "SATURATED", "DECISIONS/S", "×FIRST", "CRITICAL PATH/S", "×FIRST", "DTRS/S")
	for _, r := range runs {
		c := r.Capacity
		maxError := fmt.Sprintf("%7.2f pp", r.MaxErrorPP)
		if len(r.Split) == 0 {
			maxError = "-" // no moment when every share had files waiting
		}
		fmt.Fprintf(w, "%6d %10s %10s %13.0f %7.2f× %15.0f %7.2f× %10.0f\n", r.Shards, maxError, r.Saturated.Round(time.Second),
			c.DecisionsPerSecond, c.DecisionsPerSecond/first.Capacity.DecisionsPerSecond,
			c.DecisionsPerSecondCriticalPath, c.DecisionsPerSecondCriticalPath/first.Capacity.DecisionsPerSecondCriticalPath, c.DTRsPerSecond)
	}
	fmt.Fprintf(w, "%-24s %8s %10s", "SHARE", "PRIORITY", "CONFIGURED")
	for _, r := range runs {
		name := fmt.Sprintf("%d SHARDS", r.Shards)
		if r.Shards == 1 {
			name = "1 SHARD"
		}
		fmt.Fprintf(w, " %16s", name)
	}
	fmt.Fprintln(w)
	for i, s := range first.Split {
		fmt.Fprintf(w, "%-24s %8d %9.2f%%", s.Share, s.Priority, s.Configured)
		for _, r := range runs {
			if i < len(r.Split) && r.Split[i].Share == s.Share {
				fmt.Fprintf(w, " %7.2f%% %+6.2f", r.Split[i].Realised, r.Split[i].ErrorPP)
			} else {
				fmt.Fprintf(w, " %16s", "-")
			}
		}
		fmt.Fprintln(w)
	}
	_, err := fmt.Fprintln(w, "(realised % of the transfer slot-time while every share had files waiting, and its error in pp)")
	return err
}
