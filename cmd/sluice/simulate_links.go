package main

// sluice simulate --links: the per-link optimizer and FTS3's rule on
// simulated links.

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/sluice-dtr/sluice/services/scheduler/simulate"
)

type linkSimOptions struct {
	links, controllers, csv string
	example                 bool
	simulate.LinkOptions
}

func linkSimFlags(fs *pflag.FlagSet, o *linkSimOptions) {
	fs.StringVar(&o.links, "links", "", "simulate the links of this CSV file (source,at,capacity,per_transfer,... see docs/simulate.md) instead of a workload")
	fs.BoolVar(&o.example, "links-example", false, "simulate the built-in links of docs/simulate.md (one whose capacity steps, one that fails for a while)")
	fs.StringVar(&o.controllers, "controllers", "sluice,fts3", "with --links: the link controllers to compare, comma-separated: sluice, fts3")
	fs.StringVar(&o.csv, "csv", "", "with --links: write every sample (controller, link, time, limit, running, throughput) to this CSV file")
	fs.DurationVar(&o.Duration, "duration", time.Hour, "with --links: how long to simulate")
	fs.Int64Var(&o.FileSize, "file-size", 1e9, "with --links: the mean file size in bytes (each file is half to one and a half times it)")
}

// simulateLinks runs each controller over the links and prints how long
// each took to reach 90% of what the links could carry.
func simulateLinks(cfg *Config, o linkSimOptions, svg string, jsonOut bool, stdout io.Writer) error {
	var models []simulate.LinkModel
	switch {
	case o.example && o.links != "":
		return usageErrorf("give --links FILE or --links-example, not both")
	case o.example:
		models = simulate.LinkExample()
	default:
		f, err := os.Open(o.links)
		if err != nil {
			return err
		}
		defer f.Close()
		if models, err = simulate.ReadLinks(f); err != nil {
			return fmt.Errorf("%s: %w", o.links, err)
		}
	}
	if o.Duration <= 0 {
		return usageErrorf("--duration %s: want a time above 0", o.Duration)
	}
	cc, err := cfg.Config.CoreConfig()
	if err != nil {
		return err
	}
	cc.Optimizer.Enabled = true
	var results []simulate.LinkResult
	for _, name := range strings.Split(o.controllers, ",") {
		name = strings.TrimSpace(name)
		ctl, ok := simulate.LinkControllers[name]
		if !ok {
			return usageErrorf("--controllers: %q is neither sluice nor fts3", name)
		}
		c := cc
		c.Optimizer.Controller = ctl
		if name == "fts3" {
			// FTS3 starts a link with no range of its own at the minimum.
			c.Optimizer.Start = c.Optimizer.Min
		}
		r, err := simulate.RunLinks(name, c, models, o.LinkOptions)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		results = append(results, r)
	}
	if jsonOut {
		return printJSON(stdout, results)
	}
	if err := simulate.LinksTable(stdout, results); err != nil {
		return err
	}
	for _, out := range []struct {
		path  string
		write func(io.Writer) error
	}{
		{svg, func(w io.Writer) error { return simulate.LinksSVG(w, results, models) }},
		{o.csv, func(w io.Writer) error { return simulate.WriteLinksCSV(w, results) }},
	} {
		if out.path == "" {
			continue
		}
		f, err := os.Create(out.path)
		if err != nil {
			return err
		}
		if err := out.write(f); err != nil {
			f.Close()
			return fmt.Errorf("write %s: %w", out.path, err)
		}
		if err := f.Close(); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", out.path)
	}
	return nil
}
