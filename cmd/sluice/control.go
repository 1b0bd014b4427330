package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/sluice-dtr/sluice/pkg/api"
)

// control sends a control request to the scheduler.
func control(ctx context.Context, cfg *Config, subject string, req, reply any) error {
	nc, err := clientConn(cfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	m := nats.NewMsg(subject)
	if m.Data, err = json.Marshal(req); err != nil {
		return err
	}
	return request(ctx, nc, m, reply)
}

// priorityCommand changes a DTR's priority.
func priorityCommand(cfg *Config) *cobra.Command {
	var jsonOut *bool
	c := &cobra.Command{
		Use:   "priority DTR N",
		Short: "Change a DTR's priority (1–100)",
		Args:  exactArgs(2, "priority needs a DTR id and a priority 1–100"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := uuid.Parse(args[0])
			if err != nil {
				return usageErrorf("DTR id %q: %w", args[0], err)
			}
			p, err := strconv.Atoi(args[1])
			if err != nil {
				return usageErrorf("priority %q is not a number", args[1])
			}
			var r api.DTRReply
			if err := control(cmd.Context(), cfg, api.SubjectPriority, api.PriorityRequest{DTR: id, Priority: p}, &r); err != nil {
				return err
			}
			if *jsonOut {
				return printJSON(cmd.OutOrStdout(), r)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "DTR %s (%s, share %s) now has priority %d\n", r.DTR.ID, r.DTR.State, r.DTR.Share, r.DTR.Priority)
			return nil
		},
	}
	clientFlags(c, cfg)
	jsonOut = jsonFlag(c)
	return c
}

// cancelCommand cancels a DTR or a whole job.
func cancelCommand(cfg *Config) *cobra.Command {
	var jsonOut *bool
	c := &cobra.Command{
		Use:   "cancel DTR_OR_JOB",
		Short: "Cancel a DTR, or every unfinished DTR of a job",
		Args:  exactArgs(1, "cancel needs a DTR or job id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cancel(cmd.Context(), cfg, args[0], *jsonOut, cmd.OutOrStdout())
		},
	}
	clientFlags(c, cfg)
	jsonOut = jsonFlag(c)
	return c
}

func cancel(ctx context.Context, cfg *Config, id string, jsonOut bool, stdout io.Writer) error {
	var r api.CancelReply
	var err error
	if u, perr := uuid.Parse(id); perr == nil {
		err = control(ctx, cfg, api.SubjectCancel, api.CancelRequest{DTR: u}, &r)
		var ae *apiError
		if !errors.As(err, &ae) || ae.code != "404" {
			if err != nil {
				return err
			}
			if jsonOut {
				return printJSON(stdout, r)
			}
			fmt.Fprintf(stdout, "DTR %s cancelled\n", id)
			return nil
		}
	}
	if err = control(ctx, cfg, api.SubjectCancel, api.CancelRequest{Job: id}, &r); err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.code == "404" {
			// Neither a DTR the scheduler holds nor a job with one
			// unfinished: most likely finished, or not yet taken in.
			return &exitError{exitNotFound, fmt.Errorf("nothing cancelled: %s has no unfinished DTR you may cancel (one still on its way to the scheduler is not known yet; cancel again once it is)", id)}
		}
		return err
	}
	if jsonOut {
		return printJSON(stdout, r)
	}
	fmt.Fprintf(stdout, "job %s: %d unfinished DTRs cancelled\n", id, r.Cancelled)
	return nil
}

// reconfigureCommand replaces the share priorities of the running
// scheduler.
func reconfigureCommand(cfg *Config) *cobra.Command {
	var jsonOut *bool
	c := &cobra.Command{
		Use:   "reconfigure SHARE=P,...",
		Short: "Set the share priorities of the running scheduler (until it restarts)",
		Args:  exactArgs(1, "reconfigure needs share priorities, e.g. atlas=80,cms=20"),
		RunE: func(cmd *cobra.Command, args []string) error {
			prios, err := api.ParseSharePriorities(args[0])
			if err != nil {
				return usageErrorf("%w", err)
			}
			var r api.SharesReply
			if err := control(cmd.Context(), cfg, api.SubjectReconfigure, api.ReconfigureRequest{SharePriority: prios}, &r); err != nil {
				return err
			}
			if *jsonOut {
				return printJSON(cmd.OutOrStdout(), r)
			}
			for _, w := range r.Warnings {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
			}
			fmt.Fprintln(cmd.OutOrStdout(), "share priorities set; the split now:")
			printShares(cmd.OutOrStdout(), r)
			return nil
		},
	}
	clientFlags(c, cfg)
	jsonOut = jsonFlag(c)
	return c
}

// whyCommand says why a DTR waits.
func whyCommand(cfg *Config) *cobra.Command {
	var jsonOut *bool
	c := &cobra.Command{
		Use:   "why DTR",
		Short: "Say why a DTR waits: its share, its place, the slots and its estimated start",
		Args:  exactArgs(1, "why needs a DTR id"),
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
			var r api.DTRReply
			m := nats.NewMsg(api.SubjectDTR)
			m.Data = []byte(id.String())
			if err := request(cmd.Context(), nc, m, &r); err != nil {
				return err
			}
			stdout := cmd.OutOrStdout()
			if *jsonOut {
				return printJSON(stdout, r)
			}
			if r.Why == nil {
				fmt.Fprintf(stdout, "DTR %s is %s: it waits for nothing\n", id, r.DTR.State)
			} else {
				printWhy(stdout, *r.Why)
			}
			if r.TraceID != "" {
				fmt.Fprintf(stdout, "  trace %s\n", r.TraceID)
			}
			return nil
		},
	}
	clientFlags(c, cfg)
	jsonOut = jsonFlag(c)
	return c
}

func printWhy(w io.Writer, y api.Why) {
	fmt.Fprintf(w, "DTR %s is %s in share %s at priority %d\n  %s\n", y.DTR, y.State, y.Share, y.Priority, y.Reason)
	if y.State.IsQueue() {
		fmt.Fprintf(w, "  %d of its share's DTRs are ahead of it; the share has %d queued and %d running on %d slots; the state has %d of %d slots busy\n",
			y.Position, y.Queued, y.Running, y.Slots, y.Busy, y.Limit)
	}
	if !y.EstimatedStart.IsZero() {
		fmt.Fprintf(w, "  estimated start: %s (in %s)\n", y.EstimatedStart.Format(time.RFC3339), time.Until(y.EstimatedStart).Round(time.Second))
	}
}
