package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"golang.org/x/term"

	"github.com/sluice-dtr/sluice/pkg/api"
)

// waitJob polls a job's status until it has ended; each poll is passed to
// tick, if set. A poll that gets no answer (the NATS server it was
// connected to died and the connection moves to another, the generator
// restarts, or answers that it cannot read the job now) is tried again,
// for up to waitLost; any other error the generator answers ends the wait.
func waitJob(ctx context.Context, nc *nats.Conn, jobID string, tick func(api.JobEvent)) (api.JobEvent, error) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	var lostSince time.Time
	for {
		ev, err := jobStatus(ctx, nc, jobID)
		var ae *apiError
		switch {
		case err == nil:
			lostSince = time.Time{}
		case errors.As(err, &ae) && ae.code != "503" || ctx.Err() != nil:
			return ev, err
		case lostSince.IsZero():
			lostSince = time.Now()
			continue
		case time.Since(lostSince) > waitLost:
			return ev, fmt.Errorf("no answer about job %s for %s: %w", jobID, waitLost, err)
		default:
			select {
			case <-ctx.Done():
				return ev, ctx.Err()
			case <-t.C:
			}
			continue
		}
		if ev.Announced {
			return ev, nil
		}
		if tick != nil {
			tick(ev)
		}
		select {
		case <-ctx.Done():
			return ev, ctx.Err()
		case <-t.C:
		}
	}
}

// waitLost is how long waitJob goes on asking without an answer.
const waitLost = 2 * time.Minute

// retryWatch shows a job's DTRs that wait for a retry, one line for each
// when it starts waiting and again after each further failed attempt, and
// counts them for the progress line. The generator knows only finished
// DTRs: the scheduler answers which wait (sluice.api.retrying). When it
// does not answer (restarting, an older one, a user who may not ask),
// --wait waits on and asks again later.
type retryWatch struct {
	job      string
	shown    map[uuid.UUID]int // the attempts of the last line shown
	after    time.Time         // ask no sooner: the scheduler did not answer
	noted    bool              // that it did not has been said
	waiting  int               // DTRs waiting for a retry at the last answer
	progress *progress         // where the lines go (nil: nowhere)
}

func (w *retryWatch) show(ctx context.Context, nc *nats.Conn) {
	if w.progress == nil || time.Now().Before(w.after) {
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
			w.progress.println(fmt.Sprintf("(retries are not shown for now: %v)", err))
		}
		return
	}
	w.waiting = 0
	for _, d := range r.DTRs {
		if d.Error == nil {
			continue
		}
		w.waiting++
		if w.shown[d.ID] == d.Attempts {
			continue
		}
		w.shown[d.ID] = d.Attempts
		w.progress.println(fmt.Sprintf("retrying %s: attempt %d of %d failed: %s: %s; next try at %s (in %s)",
			d.Destination, d.Attempts, d.MaxAttempts, d.Error.Kind, oneLine(d.Error.Text, 200),
			d.NextProcess.Local().Format("15:04:05 MST"), max(0, time.Until(d.NextProcess)).Round(time.Second)))
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

// progress shows a job's progress while submit --wait or cp follows it:
// files done, failed and waiting for a retry, the bytes of the files done
// and the rates since the job was submitted. On a terminal it is one line
// redrawn in place; elsewhere (a pipe, a log file) a plain line is written
// when the figures change, at most every plainEvery.
type progress struct {
	out   io.Writer
	tty   bool
	start time.Time
	// last is the line last drawn (tty) or written; drawn says a tty line
	// is on the screen, to be cleared before another line is written.
	last    string
	drawn   bool
	written time.Time
	now     func() time.Time
	width   int // the terminal's columns (0: unknown)
}

const plainEvery = 2 * time.Second

func newProgress(out io.Writer) *progress {
	p := &progress{out: out, tty: isTerminal(out), start: time.Now(), now: time.Now}
	if f, ok := out.(*os.File); ok && p.tty {
		p.width, _, _ = term.GetSize(int(f.Fd()))
	}
	return p
}

// isTerminal says whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// update shows the job's figures; retrying is how many of its DTRs wait
// for a retry.
func (p *progress) update(ev api.JobEvent, retrying int) { p.show(ev, retrying, false) }

// show shows the figures; a plain line is written, when they changed, at
// once if final, else if plainEvery has passed since the last.
func (p *progress) show(ev api.JobEvent, retrying int, final bool) {
	if p == nil {
		return
	}
	line := p.line(ev, retrying)
	now := p.now()
	if p.tty {
		// One screen row, or \r\033[K would clear only the last of a
		// wrapped line's rows.
		if r := []rune(line); p.width > 1 && len(r) >= p.width {
			line = string(r[:p.width-2]) + "…"
		}
		fmt.Fprintf(p.out, "\r\033[K%s", line)
		p.last, p.drawn = line, true
		return
	}
	// The counts and bytes, not the elapsed time and rates, which change
	// at every poll: a job that does not move writes no more lines.
	figures := fmt.Sprint(ev.Done, ev.Failed, ev.Cancelled, retrying, ev.Total, p.bytes(ev))
	if figures == p.last || (!final && now.Sub(p.written) < plainEvery) {
		return
	}
	p.last, p.written = figures, now
	fmt.Fprintln(p.out, line)
}

// bytes is the bytes of the job's files done (of those listed).
func (p *progress) bytes(ev api.JobEvent) int64 {
	var n int64
	for _, f := range ev.Files {
		if f.Error == nil {
			n += f.Size
		}
	}
	return n
}

// line is the progress line: elapsed time, files, bytes and rates.
func (p *progress) line(ev api.JobEvent, retrying int) string {
	elapsed := p.now().Sub(p.start)
	bytes := p.bytes(ev)
	pending := max(0, ev.Total-ev.Final()-retrying)
	s := fmt.Sprintf("%s %d/%d done, %d failed, %d retrying, %d to go", fmtElapsed(elapsed), ev.Done, ev.Total, ev.Failed, retrying, pending)
	if ev.Cancelled > 0 {
		s += fmt.Sprintf(", %d cancelled", ev.Cancelled)
	}
	s += " · " + fmtBytes(float64(bytes))
	if secs := elapsed.Seconds(); secs >= 0.5 {
		s += fmt.Sprintf(" (%s/s, %.1f files/s)", fmtBytes(float64(bytes)/secs), float64(ev.Done)/secs)
	}
	if ev.FilesOmitted > 0 {
		s += " (bytes of the files listed only)"
	}
	return s
}

// println writes a line of its own, above the progress line.
func (p *progress) println(s string) {
	if p == nil {
		return
	}
	if p.drawn {
		fmt.Fprint(p.out, "\r\033[K")
	}
	fmt.Fprintln(p.out, s)
	if p.drawn {
		fmt.Fprint(p.out, p.last)
	}
}

// end shows the job's last figures, if known, and leaves the progress
// line on the screen, ended.
func (p *progress) end(ev *api.JobEvent) {
	if ev != nil {
		p.show(*ev, 0, true)
	}
	if p != nil && p.drawn {
		fmt.Fprintln(p.out)
		p.drawn = false
	}
}

func fmtElapsed(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%02d:%02d:%02d", int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60)
}

// fmtBytes writes a byte count with a binary unit.
func fmtBytes(b float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	i := 0
	for b >= 1024 && i < len(units)-1 {
		b /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", b)
	}
	return fmt.Sprintf("%.1f %s", b, units[i])
}
