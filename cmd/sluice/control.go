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

// priority changes a DTR's priority.
func priority(ctx context.Context, cfg *Config, args []string, stdout io.Writer) error {
	fs := clientFlags("priority", cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return errors.New("priority needs a DTR id and a priority 1–100")
	}
	id, err := uuid.Parse(fs.Arg(0))
	if err != nil {
		return fmt.Errorf("DTR id %q: %w", fs.Arg(0), err)
	}
	p, err := strconv.Atoi(fs.Arg(1))
	if err != nil {
		return fmt.Errorf("priority %q is not a number", fs.Arg(1))
	}
	var r api.DTRReply
	if err := control(ctx, cfg, api.SubjectPriority, api.PriorityRequest{DTR: id, Priority: p}, &r); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "DTR %s (%s, share %s) now has priority %d\n", r.DTR.ID, r.DTR.State, r.DTR.Share, r.DTR.Priority)
	return nil
}

// cancel cancels a DTR or a whole job.
func cancel(ctx context.Context, cfg *Config, args []string, stdout io.Writer) error {
	fs := clientFlags("cancel", cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("cancel needs a DTR or job id")
	}
	id := fs.Arg(0)
	var r api.CancelReply
	var err error
	if u, perr := uuid.Parse(id); perr == nil {
		err = control(ctx, cfg, api.SubjectCancel, api.CancelRequest{DTR: u}, &r)
		var ae *apiError
		if !errors.As(err, &ae) || ae.code != "404" {
			if err == nil {
				fmt.Fprintf(stdout, "DTR %s cancelled\n", id)
			}
			return err
		}
	}
	if err = control(ctx, cfg, api.SubjectCancel, api.CancelRequest{Job: id}, &r); err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.code == "404" {
			// Neither a DTR the scheduler holds nor a job with one
			// unfinished: most likely finished, or not yet taken in.
			return fmt.Errorf("nothing cancelled: %s has no unfinished DTR you may cancel (one still on its way to the scheduler is not known yet; cancel again once it is)", id)
		}
		return err
	}
	fmt.Fprintf(stdout, "job %s: %d unfinished DTRs cancelled\n", id, r.Cancelled)
	return nil
}

// reconfigure replaces the share priorities of the running scheduler.
func reconfigure(ctx context.Context, cfg *Config, args []string, stdout io.Writer) error {
	fs := clientFlags("reconfigure", cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("reconfigure needs share priorities, e.g. atlas=80,cms=20")
	}
	prios, err := api.ParseSharePriorities(fs.Arg(0))
	if err != nil {
		return err
	}
	var r api.SharesReply
	if err := control(ctx, cfg, api.SubjectReconfigure, api.ReconfigureRequest{SharePriority: prios}, &r); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "share priorities set; the split now:")
	printShares(stdout, r)
	return nil
}

// why says why a DTR waits.
func why(ctx context.Context, cfg *Config, args []string, stdout io.Writer) error {
	fs := clientFlags("why", cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("why needs a DTR id")
	}
	id, err := uuid.Parse(fs.Arg(0))
	if err != nil {
		return fmt.Errorf("DTR id %q: %w", fs.Arg(0), err)
	}
	nc, err := clientConn(cfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	var r api.DTRReply
	m := nats.NewMsg(api.SubjectDTR)
	m.Data = []byte(id.String())
	if err := request(ctx, nc, m, &r); err != nil {
		return err
	}
	if r.Why == nil {
		fmt.Fprintf(stdout, "DTR %s is %s: it waits for nothing\n", id, r.DTR.State)
		return nil
	}
	printWhy(stdout, *r.Why)
	return nil
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
