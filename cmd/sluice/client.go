package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

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

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// submit sends a job description to the generator.
func submit(ctx context.Context, cfg *Config, args []string, stdout io.Writer) error {
	fs := clientFlags("submit", cfg)
	wait := fs.Bool("wait", false, "wait until every DTR of the job is final and print the statistics")
	session := fs.String("session-dir", "", "session directory of an xRSL job (inputs are fetched into it, outputs sent from it)")
	dn := fs.String("dn", "", "owner DN of an xRSL job (taken from the operator and trusted users only; a user's job is their own)")
	var fqans multiFlag
	fs.Var(&fqans, "fqan", "owner VOMS FQAN of an xRSL job, e.g. /atlas/Role=production (repeatable; as -dn)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("submit needs one job description file")
	}
	data, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		return err
	}
	nc, err := clientConn(cfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	m := nats.NewMsg(api.SubjectJobSubmit)
	m.Data = data
	if *session != "" {
		abs, err := filepath.Abs(*session)
		if err != nil {
			return err
		}
		m.Header.Set(api.HeaderSessionDir, abs)
	}
	if *dn != "" {
		m.Header.Set(api.HeaderDN, *dn)
	}
	for _, f := range fqans {
		m.Header.Add(api.HeaderFQAN, f)
	}
	var reply api.SubmitReply
	if err := request(ctx, nc, m, &reply); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "job %s submitted: %d DTRs\n", reply.JobID, len(reply.DTRs))
	if !*wait {
		return nil
	}
	retries := retryWatch{job: reply.JobID, shown: map[uuid.UUID]int{}}
	ev, err := waitJob(ctx, nc, reply.JobID, func() { retries.show(ctx, nc, stdout) })
	if err != nil {
		return err
	}
	printJob(stdout, ev, nil)
	if ev.State != api.JobFinished {
		return fmt.Errorf("job %s %s", ev.Job.ID, ev.State)
	}
	return nil
}

// waitJob polls a job's status until it has ended; each poll is passed to
// tick, if set.
func waitJob(ctx context.Context, nc *nats.Conn, jobID string, tick func()) (api.JobEvent, error) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		ev, err := jobStatus(ctx, nc, jobID)
		if err != nil {
			return ev, err
		}
		if ev.Announced {
			return ev, nil
		}
		if tick != nil {
			tick()
		}
		select {
		case <-ctx.Done():
			return ev, ctx.Err()
		case <-t.C:
		}
	}
}

// retryWatch shows a job's DTRs that wait for a retry, one line for each
// when it starts waiting and again after each further failed attempt. The
// generator knows only finished DTRs: the scheduler answers which wait
// (sluice.api.retrying). When it does not answer (restarting, an older
// one, a user who may not ask), --wait waits on and asks again later.
type retryWatch struct {
	job   string
	shown map[uuid.UUID]int // the attempts of the last line shown
	after time.Time         // ask no sooner: the scheduler did not answer
	noted bool              // that it did not has been said
}

func (w *retryWatch) show(ctx context.Context, nc *nats.Conn, out io.Writer) {
	if time.Now().Before(w.after) {
		return
	}
	ask, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var r api.RetryingReply
	m := nats.NewMsg(api.SubjectRetrying)
	m.Data = []byte(w.job)
	if err := request(ask, nc, m, &r); err != nil {
		if ctx.Err() != nil {
			return
		}
		w.after = time.Now().Add(30 * time.Second)
		if !w.noted {
			w.noted = true
			fmt.Fprintf(out, "(retries are not shown for now: %v)\n", err)
		}
		return
	}
	for _, d := range r.DTRs {
		if d.Error == nil || w.shown[d.ID] == d.Attempts {
			continue
		}
		w.shown[d.ID] = d.Attempts
		fmt.Fprintf(out, "retrying %s: attempt %d of %d failed: %s: %s; next try at %s (in %s)\n",
			d.Destination, d.Attempts, d.MaxAttempts, d.Error.Kind, oneLine(d.Error.Text, 200),
			d.NextProcess.Local().Format("15:04:05"), max(0, time.Until(d.NextProcess)).Round(time.Second))
	}
}

// oneLine returns the first line of s, at most n characters of it: a longer
// line keeps its start and its end, where an error's cause is.
func oneLine(s string, n int) string {
	s, _, _ = strings.Cut(s, "\n")
	r := []rune(strings.TrimSpace(s))
	if len(r) <= n {
		return string(r)
	}
	head := n / 3
	return string(r[:head]) + "…" + string(r[len(r)-(n-head-1):])
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

// status shows a job and its DTRs, or one DTR.
func status(ctx context.Context, cfg *Config, args []string, stdout io.Writer) error {
	fs := clientFlags("status", cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("status needs a job or DTR id")
	}
	id := fs.Arg(0)
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
			return fmt.Errorf("no job %q, and it is not a DTR id", id)
		}
		var r api.DTRReply
		m := nats.NewMsg(api.SubjectDTR)
		m.Data = []byte(u.String())
		if err := request(ctx, nc, m, &r); err != nil {
			return err
		}
		printDTR(stdout, r.DTR)
		if r.Why != nil {
			printWhy(stdout, *r.Why)
		}
		return nil
	}
	if err != nil {
		return err
	}
	current := map[uuid.UUID]dtr.DTR{}
	for i, ref := range ev.Pending {
		if i == 200 {
			break
		}
		if d, err := dtrStatus(ctx, nc, ref.DTR); err == nil {
			current[ref.DTR] = d
		}
	}
	printJob(stdout, ev, current)
	return nil
}

func printDTR(w io.Writer, d dtr.DTR) {
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
		fmt.Fprintf(tw, "checksum\t%s\n", d.Checksum)
	}
	if !d.NextProcess.IsZero() {
		fmt.Fprintf(tw, "retry at\t%s\n", d.NextProcess.Format(time.RFC3339))
	}
	if d.Error != nil {
		fmt.Fprintf(tw, "error\t%s in %s: %s\n", d.Error.Kind, d.Error.State, d.Error.Text)
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
	fmt.Fprintln(tw, "DTR\tDIR\tSTATE\tSIZE\tTRIES\tDESTINATION\tERROR")
	for _, f := range ev.Files {
		e := ""
		if f.Error != nil {
			e = string(f.Error.Kind) + ": " + f.Error.Text
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", f.DTR, f.Direction, f.State, f.Size, f.Attempts, f.Destination, e)
	}
	for _, ref := range ev.Pending {
		state, e := "pending", ""
		if d, ok := current[ref.DTR]; ok {
			state = d.State.String()
			if d.Error != nil {
				e = "last try: " + string(d.Error.Kind) + ": " + d.Error.Text
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t\t\t%s\t%s\n", ref.DTR, ref.Direction, state, ref.Destination, e)
	}
}

// shares prints the per-share table.
func shares(ctx context.Context, cfg *Config, args []string, stdout io.Writer) error {
	fs := clientFlags("shares", cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	nc, err := clientConn(cfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	var r api.SharesReply
	if err := request(ctx, nc, nats.NewMsg(api.SubjectShares), &r); err != nil {
		return err
	}
	printShares(stdout, r)
	printSilent(stdout, r.Silent, time.Now())
	return nil
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
	fmt.Fprintln(tw, "SHARE\tPRIORITY\tWEIGHT\tSTATE\tRUNNING\tQUEUED\tSLOTS")
	for _, s := range r.Shares {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%d\t%d\n", s.Share, s.Priority, s.Weight, s.State, s.Running, s.Queued, s.Slots)
	}
	if len(r.Shares) == 0 {
		fmt.Fprintln(tw, "(no DTRs queued or running)")
	}
}
