package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dtr/sluice/services/scheduler/simulate"
)

// simulateCmd replays a workload through the scheduler core under one or
// more policies and prints what each group got; -svg draws the slots.
func simulateCmd(cfg *Config, args []string, stdout io.Writer) error {
	fs := serveFlags("scheduler", cfg)
	policies := fs.String("policies", cfg.Policy, "policies to compare, comma-separated: arc, dirac, sam, enstore (each configured by its SLUICE_* settings)")
	example := fs.Bool("example", false, "replay the built-in example workload with the policy settings of docs/scheduling.md (environment wins)")
	writeExample := fs.String("write-example", "", "write the example workload to this CSV file and stop")
	opt := simulate.Options{}
	fs.IntVar(&opt.Slots, "slots", 0, "transfer slots (default: -maxdelivery, SLUICE_MAXDELIVERY)")
	fs.Float64Var(&opt.SlotRate, "rate", 100e6, "bytes per second one transfer moves")
	fs.DurationVar(&opt.Overhead, "overhead", time.Second, "time added to every transfer")
	fs.DurationVar(&opt.Step, "step", 100*time.Millisecond, "virtual tick")
	fs.DurationVar(&opt.Sample, "sample", 10*time.Second, "how often the picture samples the slots")
	svg := fs.String("svg", "", "write an SVG picture of the slots each group held over time to this file")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: sluice simulate [flags] WORKLOAD.csv | -example\n\nThe workload is CSV with a header: at (seconds),dn,fqan,bytes,priority,direction (see docs/simulate.md).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
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
	case *example && fs.NArg() == 0:
		work = simulate.Example()
	case !*example && fs.NArg() == 1:
		f, err := os.Open(fs.Arg(0))
		if err != nil {
			return err
		}
		defer f.Close()
		if work, err = simulate.ReadWorkload(f); err != nil {
			return fmt.Errorf("%s: %w", fs.Arg(0), err)
		}
	default:
		fs.Usage()
		return fmt.Errorf("give one workload file, or -example")
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
		if err := r.Table(stdout); err != nil {
			return err
		}
		fmt.Fprintln(stdout)
		results = append(results, r)
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
		fmt.Fprintf(stdout, "wrote %s\n", *svg)
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
