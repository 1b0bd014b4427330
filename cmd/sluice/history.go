package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/sluice-dtr/sluice/pkg/api"
)

// historyCommand prints a DTR's history.
func historyCommand(cfg *Config) *cobra.Command {
	var jsonOut *bool
	c := &cobra.Command{
		Use:   "history DTR",
		Short: "Print a DTR's timeline: each state it went through, what held it, its grants, workers and bytes",
		Long: `Print a DTR's timeline, one line per event: the time, the time since the event
before (+elapsed), the state, what happened or what held it there, the grant, the
worker that ran it and the bytes moved. The scheduler keeps the last 64 events of
each DTR, for as long as it keeps the DTR's record (SLUICE_RETENTION after it
ended). Only the DTR's owner and administrators may read it.`,
		Args: exactArgs(1, "history needs a DTR id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := uuid.Parse(args[0])
			if err != nil {
				return usageErrorf("DTR id %q: %w", args[0], err)
			}
			nc, err := clientConn(cfg)
			if err != nil {
				return err
			}
			defer nc.Close()
			var r api.HistoryReply
			m := nats.NewMsg(api.SubjectHistory)
			m.Data = []byte(id.String())
			if err := request(cmd.Context(), nc, m, &r); err != nil {
				return err
			}
			if *jsonOut {
				return printJSON(cmd.OutOrStdout(), r)
			}
			printHistory(cmd.OutOrStdout(), r)
			return nil
		},
	}
	clientFlags(c, cfg)
	jsonOut = jsonFlag(c)
	return c
}

// printHistory prints a timeline, one line per event.
func printHistory(w io.Writer, r api.HistoryReply) {
	fmt.Fprintf(w, "DTR %s is %s; %d events", r.DTR, r.State, len(r.Events))
	if r.Dropped > 0 {
		fmt.Fprintf(w, " (%d earlier ones dropped: the last 64 are kept)", r.Dropped)
	}
	fmt.Fprintln(w)
	if r.Missing != "" {
		fmt.Fprintln(w, r.Missing)
	}
	var prev time.Time
	for _, ev := range r.Events {
		elapsed := ""
		if !prev.IsZero() {
			elapsed = "+" + ev.Time.Sub(prev).Round(time.Millisecond).String()
		}
		prev = ev.Time
		fmt.Fprintf(w, "%s %10s  %-22s %s\n", ev.Time.UTC().Format("2006-01-02T15:04:05.000Z"), elapsed, ev.State, historyWhat(ev))
	}
}

// historyWhat says what an event is, in words.
func historyWhat(ev api.HistoryEvent) string {
	var parts []string
	switch {
	case ev.From == "":
		parts = append(parts, "submitted")
	case ev.From == ev.State.String():
		parts = append(parts, "still there")
	}
	if ev.Error != nil {
		parts = append(parts, fmt.Sprintf("error %s: %s", ev.Error.Kind, ev.Error.Text))
	}
	if ev.Ended != "" {
		s := "grant " + ev.Ended + " ended"
		if ev.Worker != "" {
			s += " (worker " + ev.Worker + ")"
		}
		parts = append(parts, s)
	}
	if words, ok := api.HoldWords[ev.Hold]; ok {
		if !ev.Until.IsZero() {
			words += " until " + ev.Until.UTC().Format(time.RFC3339)
		}
		parts = append(parts, words)
	}
	if ev.Grant != "" && ev.State.IsActive() {
		parts = append(parts, "grant "+ev.Grant)
	}
	if ev.Attempts > 0 {
		parts = append(parts, fmt.Sprintf("attempts %d", ev.Attempts))
	}
	if ev.Bytes > 0 {
		parts = append(parts, fmt.Sprintf("%d bytes", ev.Bytes))
	}
	return strings.Join(parts, "; ")
}

// printStuck prints, under the shares table, the DTRs the scheduler finds
// stuck: in their state past its deadline, waiting for nothing.
func printStuck(w io.Writer, stuck []api.StuckDTR, now time.Time) {
	if len(stuck) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%d DTRs are stuck: in their state past its deadline, waiting for nothing that will come (sluice history DTR)\n", len(stuck))
	for _, d := range stuck {
		words := api.HoldWords[d.Hold]
		if words == "" {
			words = d.Hold
		}
		fmt.Fprintf(w, "  %s  %s for %s (deadline %s): %s\n", d.DTR, d.State, now.Sub(d.Since).Round(time.Second), d.Deadline, words)
	}
}
