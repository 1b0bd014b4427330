package main

import (
	"fmt"
	"io"
	"os"
	"slices"
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
		Use:   "simulate [flags] WORKLOAD.csv | --example",
		Short: "Replay a workload through the scheduler under one or more policies",
		Long: "Replay a workload through the scheduler core (no NATS, a virtual clock) under one or more\n" +
			"policies and print what each group of users got; --svg draws the slots each group held.\n\n" +
			"The workload is CSV with a header: at (seconds),dn,fqan,bytes,priority,direction (see docs/simulate.md).",
		Args: maxArgs(1, "simulate takes one workload file, or --example"),
		RunE: func(cmd *cobra.Command, args []string) error {
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
	policies, writeExample, svg string
	example                     bool
	json                        *bool
}

func simulateRun(cfg *Config, o simulateOptions, args []string, stdout io.Writer) error {
	opt, policies, example, writeExample, svg := o.Options, &o.policies, &o.example, &o.writeExample, &o.svg
	if opt.Slots == 0 {
		opt.Slots = cfg.MaxDelivery
	}
	if *writeExample != "" {
		f, err := os.Create(*writeExample)
		if err != nil {
			return err
		}
		if err := simulate.WriteWorkload(f, simulate.Example()); err != nil {
			f.Close()
			return fmt.Errorf("write %s: %w", *writeExample, err)
		}
		return f.Close()
	}
	var work []simulate.Arrival
	switch {
	case *example && len(args) == 0:
		work = simulate.Example()
	case !*example && len(args) == 1:
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

// simulateExample says whether args ask simulate for the example workload.
func simulateExample(args []string) bool {
	return slices.ContainsFunc(args, func(a string) bool { return a == "-example" || a == "--example" })
}

// setExampleSettings puts the settings of the comparison of
// docs/scheduling.md (Policies) in the environment, where it does not say
// otherwise, before the environment is read.
func setExampleSettings() {
	for k, v := range simulate.ExampleSettings {
		if _, set := os.LookupEnv(k); !set {
			os.Setenv(k, v)
		}
	}
}
