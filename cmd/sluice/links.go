package main

// sluice links: each link's concurrency limit as the per-link optimizer
// set it.

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/sluice-dtr/sluice/pkg/api"
)

// linksCommand prints the links table, and with --history each link's
// decisions.
func linksCommand(cfg *Config) *cobra.Command {
	var jsonOut *bool
	var history bool
	c := &cobra.Command{
		Use:   "links [--history]",
		Short: "Show each link's transfer limit as the per-link optimizer set it, and why",
		Long: "Show each link (source endpoint → destination endpoint; \"local\" is this site's disk) with the\n" +
			"number of transfers it may run as the per-link optimizer (SLUICE_OPTIMIZER) set it, the\n" +
			"transfers it runs, the throughput and failure rate the last decision measured, and that\n" +
			"decision's reason; --history adds the decisions each link keeps (see docs/scheduling.md).",
		Args: exactArgs(0, "links takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, err := clientConn(cfg)
			if err != nil {
				return err
			}
			defer nc.Close()
			m := nats.NewMsg(api.SubjectLinks)
			if m.Data, err = json.Marshal(api.LinksRequest{History: history}); err != nil {
				return err
			}
			var r api.LinksReply
			if err := request(cmd.Context(), nc, m, &r); err != nil {
				return err
			}
			if *jsonOut {
				return printJSON(cmd.OutOrStdout(), r)
			}
			printLinks(cmd.OutOrStdout(), r, history)
			return nil
		},
	}
	c.Flags().BoolVar(&history, "history", false, "print each link's kept decisions (time, running, throughput, failure rate, limit before → after, reason)")
	clientFlags(c, cfg)
	jsonOut = jsonFlag(c)
	return c
}

// printLinks prints the links table, then each link's history if asked.
func printLinks(w io.Writer, r api.LinksReply, history bool) {
	if !r.Enabled {
		fmt.Fprintf(w, "the per-link optimizer is off (SLUICE_OPTIMIZER=off): links have no limit of their own")
		if r.MaxPerHost > 0 {
			fmt.Fprintf(w, "; at most %d transfers run per storage endpoint (SLUICE_MAXPERHOST)", r.MaxPerHost)
		}
		fmt.Fprintln(w)
		return
	}
	fmt.Fprintf(w, "per-link optimizer: limits %d–%d, a new link starts at %d", r.Min, r.Max, r.Start)
	if r.MaxPerHost > 0 {
		fmt.Fprintf(w, "; SLUICE_MAXPERHOST %d caps each endpoint", r.MaxPerHost)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tDESTINATION\tLIMIT\tRUNNING\tMB/S\tFAILED\tDECIDED\tREASON")
	for _, l := range r.Links {
		decided, reason := "-", "no decision yet"
		if l.Last != nil {
			decided, reason = l.Last.At.Local().Format(time.TimeOnly), l.Last.Reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.1f\t%.1f%%\t%s\t%s\n", l.Source, l.Destination, l.Limit, l.Running, l.Throughput/1e6, 100*l.ErrorRate, decided, reason)
	}
	if len(r.Links) == 0 {
		fmt.Fprintln(tw, "(no transfers between storage endpoints yet)")
	}
	tw.Flush()
	if !history {
		return
	}
	for _, l := range r.Links {
		fmt.Fprintf(w, "\n%s → %s\n", l.Source, l.Destination)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TIME\tRUNNING\tMB/S\tAVG MB/S\tENDED\tFAILED\tLIMIT\tREASON")
		for _, h := range l.History {
			fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%d\t%d\t%d → %d\t%s\n", h.At.Local().Format(time.TimeOnly), h.Running,
				h.Throughput/1e6, h.EMA/1e6, h.Ended, h.Failed, h.From, h.Limit, h.Reason)
		}
		tw.Flush()
	}
}
