package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/spf13/cobra"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// as is who the client commands speak as (clientConn sets it): the user
// whose own subjects they use (SLUICE_AS_USER; empty: the operator's plain
// subjects) and the bearer token they send, if any (BEARER_TOKEN or the
// file BEARER_TOKEN_FILE names, as WLCG's bearer token discovery has it).
var as struct{ user, token string }

// speakAs reads who the client commands speak as from cfg and the
// environment.
func speakAs(cfg *Config) error {
	as.user, as.token = cfg.User, strings.TrimSpace(os.Getenv("BEARER_TOKEN"))
	if as.user != "" && !auth.ValidUser(as.user) {
		return fmt.Errorf("SLUICE_AS_USER %q is not a NATS subject token (no '.', '*', '>' or space)", as.user)
	}
	if f := os.Getenv("BEARER_TOKEN_FILE"); as.token == "" && f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("BEARER_TOKEN_FILE: %w", err)
		}
		as.token = strings.TrimSpace(string(b))
	}
	return nil
}

// request sends a request to a Sluice API subject (its plain form; it goes
// to the user's own, as above) and decodes the JSON answer; a service error
// comes back as an error with its text.
func request(ctx context.Context, nc *nats.Conn, m *nats.Msg, v any) error {
	m.Subject = api.UserSubject(m.Subject, as.user)
	if as.token != "" {
		if m.Header == nil {
			m.Header = nats.Header{}
		}
		m.Header.Set("Authorization", "Bearer "+as.token)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	reply, err := nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("%s: no service answers (is sluice running at %s?): %w", m.Subject, nc.ConnectedUrlRedacted(), err)
		}
		if errors.Is(err, nats.ErrMaxPayload) {
			return fmt.Errorf("%s: the request is %d bytes, more than the %d the NATS server at %s takes in one message (its max_payload); nothing was sent: split the job into smaller ones: %w",
				m.Subject, len(m.Data), nc.MaxPayload(), nc.ConnectedUrlRedacted(), err)
		}
		if last := nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) {
			return fmt.Errorf("%s: refused: %w", m.Subject, last)
		}
		return fmt.Errorf("%s: %w", m.Subject, err)
	}
	if e := reply.Header.Get(micro.ErrorHeader); e != "" {
		return &apiError{code: reply.Header.Get(micro.ErrorCodeHeader), text: e}
	}
	if err := json.Unmarshal(reply.Data, v); err != nil {
		return fmt.Errorf("%s answer: %w", m.Subject, err)
	}
	return nil
}

type apiError struct{ code, text string }

func (e *apiError) Error() string { return e.text }

func clientConn(cfg *Config) (*nats.Conn, error) {
	if err := speakAs(cfg); err != nil {
		return nil, err
	}
	opts, err := cfg.NATSOptions()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(cfg.NATSURL, append(opts, nats.Name("sluice-cli"))...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", app.Redact(cfg.NATSURL), app.ExplainConnectError(err))
	}
	return nc, nil
}

// submitCommand sends a job description to the generator.
func submitCommand(cfg *Config) *cobra.Command {
	var o submitOptions
	c := &cobra.Command{
		Use:   "submit [flags] JOBFILE",
		Short: "Submit a job description (JSON or xRSL); --wait follows it to the end",
		Long: "Submit a job description (JSON or xRSL, docs/job-description.md; - reads standard input).\n" +
			"With --wait, follow the job until every DTR is final, showing its progress and each DTR that\n" +
			"waits for a retry, then print its statistics; the exit status is 3 if the job failed.",
		Args: exactArgs(1, "submit needs one job description file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := readJobFile(cmd, args[0])
			if err != nil {
				return err
			}
			return submit(cmd, cfg, data, o)
		},
	}
	clientFlags(c, cfg)
	fs := c.Flags()
	fs.BoolVar(&o.wait, "wait", false, "wait until every DTR of the job is final, showing progress, and print the statistics")
	fs.StringVar(&o.session, "session-dir", "", "session directory of an xRSL job (inputs are fetched into it, outputs sent from it)")
	fs.StringVar(&o.dn, "dn", "", "owner DN of an xRSL job (taken from the operator and trusted users only; a user's job is their own)")
	fs.StringArrayVar(&o.fqans, "fqan", nil, "owner VOMS FQAN of an xRSL job, e.g. /atlas/Role=production (repeatable; as --dn)")
	o.json = jsonFlag(c)
	return c
}

type submitOptions struct {
	wait        bool
	session, dn string
	fqans       []string
	json        *bool
}

func readJobFile(cmd *cobra.Command, name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(cmd.InOrStdin())
	}
	return os.ReadFile(name)
}

// submit sends a job description and, with o.wait, follows the job.
func submit(cmd *cobra.Command, cfg *Config, data []byte, o submitOptions) error {
	ctx, stdout := cmd.Context(), cmd.OutOrStdout()
	nc, err := clientConn(cfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	m := nats.NewMsg(api.SubjectJobSubmit)
	m.Data = data
	if o.session != "" {
		abs, err := filepath.Abs(o.session)
		if err != nil {
			return err
		}
		m.Header.Set(api.HeaderSessionDir, abs)
	}
	if o.dn != "" {
		m.Header.Set(api.HeaderDN, o.dn)
	}
	for _, f := range o.fqans {
		m.Header.Add(api.HeaderFQAN, f)
	}
	var reply api.SubmitReply
	if err := request(ctx, nc, m, &reply); err != nil {
		return err
	}
	if !o.wait {
		if *o.json {
			return printJSON(stdout, reply)
		}
		fmt.Fprintf(stdout, "job %s submitted: %d DTRs\n", reply.JobID, len(reply.DTRs))
		return nil
	}
	return follow(ctx, nc, reply, cmd, *o.json)
}

// follow waits for a submitted job to end, showing its progress, and
// prints its statistics; a job that did not finish (a file that had to be
// done was not) is an error with exit status 3.
func follow(ctx context.Context, nc *nats.Conn, reply api.SubmitReply, cmd *cobra.Command, jsonOut bool) error {
	stdout := cmd.OutOrStdout()
	// Progress goes where people look: standard output, or with --json
	// standard error, and there only when it is a terminal.
	var p *progress
	if !jsonOut {
		p = newProgress(stdout)
		fmt.Fprintf(stdout, "job %s submitted: %d DTRs\n", reply.JobID, len(reply.DTRs))
	} else if isTerminal(cmd.ErrOrStderr()) {
		p = newProgress(cmd.ErrOrStderr())
	}
	retries := retryWatch{job: reply.JobID, shown: map[uuid.UUID]int{}, progress: p}
	ev, err := waitJob(ctx, nc, reply.JobID, func(ev api.JobEvent) {
		retries.show(ctx, nc)
		p.update(ev, retries.waiting)
	})
	if err != nil {
		p.end(nil)
		return err
	}
	p.end(&ev)
	if jsonOut {
		if err := printJSON(stdout, ev); err != nil {
			return err
		}
	} else {
		printJob(stdout, ev, nil)
	}
	if ev.State != api.JobFinished {
		return &exitError{exitJobEnded, fmt.Errorf("job %s %s: %d of %d files done", ev.Job.ID, ev.State, ev.Done, ev.Total)}
	}
	return nil
}

func jobStatus(ctx context.Context, nc *nats.Conn, jobID string) (api.JobEvent, error) {
	var ev api.JobEvent
	m := nats.NewMsg(api.SubjectJobStatus)
	m.Data = []byte(jobID)
	return ev, request(ctx, nc, m, &ev)
}

func dtrStatus(ctx context.Context, nc *nats.Conn, id uuid.UUID) (dtr.DTR, error) {
	var r api.DTRReply
	m := nats.NewMsg(api.SubjectDTR)
	m.Data = []byte(id.String())
	return r.DTR, request(ctx, nc, m, &r)
}

// statusCommand shows a job and its DTRs, or one DTR.
func statusCommand(cfg *Config) *cobra.Command {
	var jsonOut *bool
	c := &cobra.Command{
		Use:   "status JOB_OR_DTR",
		Short: "Show a job and its DTRs, or one DTR",
		Args:  exactArgs(1, "status needs a job or DTR id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return status(cmd.Context(), cfg, args[0], *jsonOut, cmd.OutOrStdout())
		},
	}
	clientFlags(c, cfg)
	jsonOut = jsonFlag(c)
	return c
}

// jobStatusJSON is what status --json prints for a job: the job's state and
// the current state of its unfinished DTRs (up to 200 of them).
type jobStatusJSON struct {
	api.JobEvent
	Current []dtr.DTR `json:"current,omitempty"`
}

func status(ctx context.Context, cfg *Config, id string, jsonOut bool, stdout io.Writer) error {
	nc, err := clientConn(cfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	ev, err := jobStatus(ctx, nc, id)
	var ae *apiError
	if errors.As(err, &ae) && ae.code == "404" {
		u, perr := uuid.Parse(id)
		if perr != nil {
			return &exitError{exitNotFound, fmt.Errorf("no job %q, and it is not a DTR id", id)}
		}
		var r api.DTRReply
		m := nats.NewMsg(api.SubjectDTR)
		m.Data = []byte(u.String())
		if err := request(ctx, nc, m, &r); err != nil {
			return err
		}
		if jsonOut {
			return printJSON(stdout, r)
		}
		printDTR(stdout, r.DTR, r.TraceID)
		if r.Why != nil {
			printWhy(stdout, *r.Why)
		}
		return nil
	}
	if err != nil {
		return err
	}
	current := map[uuid.UUID]dtr.DTR{}
	out := jobStatusJSON{JobEvent: ev}
	for i, ref := range ev.Pending {
		if i == 200 {
			break
		}
		if d, err := dtrStatus(ctx, nc, ref.DTR); err == nil {
			current[ref.DTR] = d
			out.Current = append(out.Current, d)
		}
	}
	if jsonOut {
		return printJSON(stdout, out)
	}
	printJob(stdout, ev, current)
	return nil
}

// checksumSourceText says, after a DTR's checksum, what it was checked
// against (dtr.DTR.ChecksumSource).
var checksumSourceText = map[string]string{
	dtr.ChecksumFromStorage: " (confirmed by the storage's own)",
	dtr.ChecksumFromStream:  " (computed on the stream only: the storage stated none)",
}

func printDTR(w io.Writer, d dtr.DTR, traceID string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintf(tw, "DTR\t%s\n", d.ID)
	if d.JobID != "" {
		fmt.Fprintf(tw, "job\t%s\n", d.JobID)
	}
	fmt.Fprintf(tw, "state\t%s\n", d.State)
	fmt.Fprintf(tw, "source\t%s\n", d.Source)
	fmt.Fprintf(tw, "destination\t%s\n", d.Destination)
	fmt.Fprintf(tw, "share\t%s\n", d.Share)
	fmt.Fprintf(tw, "priority\t%d\n", d.Priority)
	fmt.Fprintf(tw, "attempts\t%d of %d\n", d.Attempts, d.MaxAttempts)
	fmt.Fprintf(tw, "bytes\t%d\n", d.Bytes)
	if d.Checksum != "" {
		fmt.Fprintf(tw, "checksum\t%s%s\n", d.Checksum, checksumSourceText[d.ChecksumSource])
	}
	if d.ChecksumUnverified != "" {
		fmt.Fprintf(tw, "checksum unverified\t%s\n", d.ChecksumUnverified)
	}
	if d.TransferMethod != "" {
		fmt.Fprintf(tw, "transfer\t%s\n", d.TransferMethod)
	}
	if !d.NextProcess.IsZero() {
		fmt.Fprintf(tw, "retry at\t%s\n", d.NextProcess.Format(time.RFC3339))
	}
	if d.Error != nil {
		fmt.Fprintf(tw, "error\t%s in %s: %s\n", d.Error.Kind, d.Error.State, d.Error.Text)
	}
	if traceID != "" {
		fmt.Fprintf(tw, "trace\t%s\n", traceID)
	}
	fmt.Fprintf(tw, "updated\t%s\n", d.Updated.Format(time.RFC3339Nano))
}

func printJob(w io.Writer, ev api.JobEvent, current map[uuid.UUID]dtr.DTR) {
	fmt.Fprintf(w, "job %s (%s) %s: %d files, %d done, %d failed, %d cancelled, %d pending\n",
		ev.Job.ID, ev.Job.Name, ev.State, ev.Total, ev.Done, ev.Failed, ev.Cancelled, ev.Total-ev.Final())
	for _, f := range ev.Failures {
		fmt.Fprintln(w, "  "+f)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "DTR\tDIR\tSTATE\tSIZE\tTRIES\tTRACE\tDESTINATION\tERROR")
	for _, f := range ev.Files {
		e := ""
		if f.Error != nil {
			e = string(f.Error.Kind) + ": " + f.Error.Text
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", f.DTR, f.Direction, f.State, f.Size, f.Attempts, f.TraceID, f.Destination, e)
	}
	for _, ref := range ev.Pending {
		state, e := "pending", ""
		if d, ok := current[ref.DTR]; ok {
			state = d.State.String()
			if d.Error != nil {
				e = "last try: " + string(d.Error.Kind) + ": " + d.Error.Text
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t\t\t%s\t%s\t%s\n", ref.DTR, ref.Direction, state, ref.TraceID, ref.Destination, e)
	}
}

// sharesCommand prints the per-share table.
func sharesCommand(cfg *Config) *cobra.Command {
	var jsonOut *bool
	c := &cobra.Command{
		Use:   "shares",
		Short: "Show running/pending per share (like ARC's gm-jobs -s) and each share's slots",
		Args:  exactArgs(0, "shares takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, err := clientConn(cfg)
			if err != nil {
				return err
			}
			defer nc.Close()
			var r api.SharesReply
			if err := request(cmd.Context(), nc, nats.NewMsg(api.SubjectShares), &r); err != nil {
				return err
			}
			if *jsonOut {
				return printJSON(cmd.OutOrStdout(), r)
			}
			printShares(cmd.OutOrStdout(), r)
			printSilent(cmd.OutOrStdout(), r.Silent, time.Now())
			printStuck(cmd.OutOrStdout(), r.Stuck, time.Now())
			return nil
		},
	}
	clientFlags(c, cfg)
	jsonOut = jsonFlag(c)
	return c
}

// printShares prints ARC's gm-jobs -s table (running = transferring, pending
// = any other state; -download shares under Preparing, the rest under
// Finishing), then the slots of each share in each state.
func printShares(w io.Writer, r api.SharesReply) {
	type rp struct{ running, pending int }
	per := map[string]*rp{}
	var names []string
	get := func(n string) *rp {
		if per[n] == nil {
			per[n] = &rp{}
			names = append(names, n)
		}
		return per[n]
	}
	for _, s := range r.Shares {
		x := get(s.Share)
		if s.State == dtr.Transfer {
			x.running += s.Running
			x.pending += s.Queued
		} else {
			x.pending += s.Queued + s.Running
		}
	}
	for n, c := range r.Retrying {
		get(n).pending += c
	}
	sort.Strings(names)
	for _, section := range []string{"Preparing", "Finishing"} {
		fmt.Fprintf(w, " %s/Pending files\tTransfer share\n", section)
		for _, n := range names {
			if strings.HasSuffix(n, "-download") == (section == "Preparing") {
				fmt.Fprintf(w, "         %d/%d\t\t\t%s\n", per[n].running, per[n].pending, n)
			}
		}
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	// RESERVED: the state's slots held for the share's DTRs by chained
	// QUERY_REPLICA grants (PRE_CLEAN's), which count running there.
	fmt.Fprintln(tw, "SHARE\tPRIORITY\tWEIGHT\tSTATE\tRUNNING\tRESERVED\tQUEUED\tSLOTS")
	for _, s := range r.Shares {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%d\t%d\t%d\n", s.Share, s.Priority, s.Weight, s.State, s.Running, s.Reserved, s.Queued, s.Slots)
	}
	if len(r.Shares) == 0 {
		fmt.Fprintln(tw, "(no DTRs queued or running)")
	}
	if r.Reading {
		unread := 0
		for _, s := range r.Shares {
			unread += s.Unread
		}
		fmt.Fprintf(tw, "(restarted: still reading its stored DTRs, about %d of those queued not yet read; new submissions wait, and changes are refused until it has read them all)\n", unread)
	}
	printActivityLimits(tw, r.ActivityLimits)
}

// printActivityLimits lists the per-activity limits, one line per limit
// and endpoint where its transfers run.
func printActivityLimits(tw io.Writer, limits []api.ActivityLimitUse) {
	if len(limits) == 0 {
		return
	}
	fmt.Fprintln(tw, "\nACTIVITY\tAT\tENDPOINT\tMAX\tRUNNING")
	for _, l := range limits {
		at, limit := "destination", l.Destination
		if l.Source != "" {
			at, limit = "source", l.Source
		}
		if len(l.Running) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t0\n", l.Activity, at, limit, l.Max)
		}
		for _, ep := range slices.Sorted(maps.Keys(l.Running)) {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\n", l.Activity, at, ep, l.Max, l.Running[ep])
		}
	}
}

// jobsCommand lists jobs, the latest first.
func jobsCommand(cfg *Config) *cobra.Command {
	var req api.JobListRequest
	var jsonOut *bool
	c := &cobra.Command{
		Use:   "jobs [flags]",
		Short: "List jobs, the latest first: running, finished, failed",
		Long: "List the jobs the generator keeps (SLUICE_RETENTION bounds them), the latest first: yours, or\n" +
			"every job for the operator and administrators.",
		Args: exactArgs(0, "jobs takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, err := clientConn(cfg)
			if err != nil {
				return err
			}
			defer nc.Close()
			m := nats.NewMsg(api.SubjectJobList)
			if m.Data, err = json.Marshal(req); err != nil {
				return err
			}
			var r api.JobListReply
			if err := request(cmd.Context(), nc, m, &r); err != nil {
				return err
			}
			if *jsonOut {
				return printJSON(cmd.OutOrStdout(), r)
			}
			printJobs(cmd.OutOrStdout(), r)
			return nil
		},
	}
	clientFlags(c, cfg)
	c.Flags().StringVar(&req.State, "state", "", "only jobs in this state: running, finished, failed, or ended (either end)")
	completeValues(c, "state", api.JobRunning, api.JobFinished, api.JobFailed, "ended")
	c.Flags().IntVar(&req.Limit, "limit", api.DefaultJobList, fmt.Sprintf("list at most this many (up to %d)", api.MaxJobList))
	jsonOut = jsonFlag(c)
	return c
}

func printJobs(w io.Writer, r api.JobListReply) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "JOB\tNAME\tSTATE\tFILES\tDONE\tFAILED\tCANCELLED\tCREATED\tENDED")
	for _, j := range r.Jobs {
		ended := ""
		if !j.Ended.IsZero() {
			ended = j.Ended.Local().Format("2006-01-02 15:04:05 MST")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", j.Job.ID, oneLine(j.Job.Name, 40), j.State, j.Total, j.Done, j.Failed, j.Cancelled,
			j.Created.Local().Format("2006-01-02 15:04:05 MST"), ended)
	}
	if len(r.Jobs) == 0 {
		fmt.Fprintln(tw, "(no jobs)")
	}
	if r.More {
		fmt.Fprintln(tw, "(more: --limit to see them)")
	}
}
