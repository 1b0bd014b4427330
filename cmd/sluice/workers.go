package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/sluice-dtr/sluice/pkg/api"
)

// workersCommand lists the worker processes the scheduler hears from.
func workersCommand(cfg *Config) *cobra.Command {
	var jsonOut *bool
	c := &cobra.Command{
		Use:   "workers",
		Short: "List the processors and deliverers: grants held, last heartbeat, silent ones' lease ends",
		Long: "List the processor and delivery processes the scheduler hears from (operators and administrators\n" +
			"only): role, host, pid, version, grants held, last heartbeat; a worker silent for three heartbeat\n" +
			"intervals (SLUICE_HEARTBEAT) is marked, with when its grants' leases end, and its grants listed.",
		Args: exactArgs(0, "workers takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return printWorkers(cmd.Context(), cfg, *jsonOut, cmd.OutOrStdout())
		},
	}
	clientFlags(c, cfg)
	jsonOut = jsonFlag(c)
	return c
}

// printWorkers asks the scheduler for the worker processes it hears from
// (sluice.api.workers: operators and administrators only) and prints them
// as a table, or with jsonOut the scheduler's answer as indented JSON.
func printWorkers(ctx context.Context, cfg *Config, jsonOut bool, stdout io.Writer) error {
	nc, err := clientConn(cfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	var raw json.RawMessage
	if err := request(ctx, nc, nats.NewMsg(api.SubjectWorkers), &raw); err != nil {
		return err
	}
	if jsonOut {
		var b bytes.Buffer
		if err := json.Indent(&b, raw, "", "  "); err != nil {
			return err
		}
		b.WriteByte('\n')
		_, err := b.WriteTo(stdout)
		return err
	}
	var r api.WorkersReply
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Errorf("%s answer: %w", api.SubjectWorkers, err)
	}
	writeWorkers(stdout, r, time.Now())
	return nil
}

// writeWorkers prints one line per worker process (each stage's pool of a
// processor is one), then the grants of the silent ones with when their
// leases end.
func writeWorkers(w io.Writer, r api.WorkersReply, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tROLE\tSTAGE\tHOST\tPID\tVERSION\tUP\tGRANTS\tLAST HEARTBEAT\tSTATUS")
	var silent []api.Worker
	for _, wk := range r.Workers {
		status := "ok"
		if wk.Silent {
			silent = append(silent, wk)
			status = "SILENT"
			if !wk.LeaseEnds.IsZero() {
				status += fmt.Sprintf(": its leases end by %s", clock(wk.LeaseEnds, now))
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d/%d\t%s ago\t%s\n", wk.ID, wk.Role, wk.Stage, wk.Host, wk.PID, wk.Version,
			since(wk.Started, now), len(wk.Grants), wk.Workers, since(wk.LastHeartbeat, now), status)
	}
	if len(r.Workers) == 0 {
		fmt.Fprintln(tw, "(no worker heard from: none runs, or none has sent a heartbeat yet)")
	}
	_ = tw.Flush()
	if len(silent) == 0 {
		return
	}
	fmt.Fprintf(w, "\nGrants held by silent workers (no heartbeat for %d intervals); each is granted again when its lease ends:\n", 3)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DTR\tGRANT\tSTATE\tWORKER\tLEASE ENDS")
	for _, wk := range silent {
		for _, g := range wk.Grants {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s@%s (pid %d)\t%s\n", g.DTR, g.Grant, g.State, wk.Role, wk.Host, wk.PID, clock(g.LeaseEnds, now))
		}
	}
	_ = tw.Flush()
}

// printSilent prints, under the shares table, the grants it counts as
// running whose worker has stopped heartbeating.
func printSilent(w io.Writer, silent []api.SilentGrant, now time.Time) {
	if len(silent) == 0 {
		return
	}
	byWorker := map[string]int{}
	var order []api.Holder
	last := time.Time{}
	for _, g := range silent {
		if byWorker[g.Holder.Worker] == 0 {
			order = append(order, g.Holder)
		}
		byWorker[g.Holder.Worker]++
		if g.LeaseEnds.After(last) {
			last = g.LeaseEnds
		}
	}
	var names []string
	for _, h := range order {
		names = append(names, fmt.Sprintf("%s: %d", h, byWorker[h.Worker]))
	}
	fmt.Fprintf(w, "\n%d of the grants counted as running are held by silent workers (%s); their leases end by %s (sluice workers)\n",
		len(silent), strings.Join(names, ", "), clock(last, now))
}

// since says how long ago t was, to the second.
func since(t, now time.Time) string {
	if t.IsZero() {
		return "?"
	}
	return max(0, now.Sub(t)).Round(time.Second).String()
}

// clock gives a time as the hour and how far it is from now.
func clock(t, now time.Time) string {
	if t.IsZero() {
		return "?"
	}
	d := t.Sub(now).Round(time.Second)
	if d >= 0 {
		return fmt.Sprintf("%s (in %s)", t.Local().Format("15:04:05 MST"), d)
	}
	return fmt.Sprintf("%s (%s ago)", t.Local().Format("15:04:05 MST"), -d)
}
