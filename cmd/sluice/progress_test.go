package main

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// fakeProgress is a progress on out whose clock the test moves.
func fakeProgress(out *bytes.Buffer, tty bool) (*progress, *time.Time) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	p := &progress{out: out, tty: tty, start: now, now: func() time.Time { return now }}
	return p, &now
}

func jobAt(done, failed, total int, sizes ...int64) api.JobEvent {
	ev := api.JobEvent{JobRecord: api.JobRecord{Total: total, Done: done, Failed: failed}}
	for _, s := range sizes {
		ev.Files = append(ev.Files, api.FileStat{State: dtr.Done, Size: s})
	}
	return ev
}

func TestProgressLineCountsFilesBytesAndRates(t *testing.T) {
	var out bytes.Buffer
	p, now := fakeProgress(&out, false)
	*now = now.Add(4 * time.Second)
	got := p.line(jobAt(2, 1, 10, 3<<20, 5<<20), 2)
	want := "00:00:04 2/10 done, 1 failed, 2 retrying, 5 to go · 8.0 MiB (2.0 MiB/s, 0.5 files/s)"
	if got != want {
		t.Fatalf("line\n%q\nwant\n%q", got, want)
	}
}

func TestProgressWritesPlainLinesWhenNotATerminal(t *testing.T) {
	var out bytes.Buffer
	p, now := fakeProgress(&out, false)
	p.update(jobAt(0, 0, 3), 0) // first figures: a line
	p.update(jobAt(0, 0, 3), 0) // the same: none
	*now = now.Add(time.Second)
	p.update(jobAt(1, 0, 3, 10), 0) // changed, too soon: none
	*now = now.Add(plainEvery)
	p.update(jobAt(1, 0, 3, 10), 0) // changed since the last line: a line
	p.println("retrying file:///x: attempt 1 of 3 failed")
	p.end(&api.JobEvent{JobRecord: api.JobRecord{Total: 3, Done: 3}}) // the end: at once
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 4 || strings.Contains(out.String(), "\r") || strings.Contains(out.String(), "\033") ||
		!strings.Contains(lines[0], "0/3 done") || !strings.Contains(lines[1], "1/3 done") ||
		!strings.HasPrefix(lines[2], "retrying ") || !strings.Contains(lines[3], "3/3 done") {
		t.Fatalf("printed %q", lines)
	}
}

func TestProgressRedrawsOneLineOnATerminal(t *testing.T) {
	var out bytes.Buffer
	p, now := fakeProgress(&out, true)
	p.update(jobAt(0, 0, 2), 0)
	*now = now.Add(100 * time.Millisecond)
	p.update(jobAt(1, 0, 2, 1), 0)
	p.println("retrying x")
	p.end(&api.JobEvent{JobRecord: api.JobRecord{Total: 2, Done: 2}})
	s := out.String()
	if strings.Count(s, "\r\033[K") < 4 || !strings.Contains(s, "\r\033[Kretrying x\n") || !strings.HasSuffix(s, "2/2 done, 0 failed, 0 retrying, 0 to go · 0 B\n") {
		t.Fatalf("drew %q", s)
	}
}

func TestProgressOnATerminalStaysOnOneRow(t *testing.T) {
	var out bytes.Buffer
	p, _ := fakeProgress(&out, true)
	p.width = 40
	p.update(jobAt(1, 0, 1000, 1<<30), 0)
	line := strings.TrimPrefix(out.String(), "\r\033[K")
	if n := len([]rune(line)); n >= 40 || !strings.HasSuffix(line, "…") {
		t.Fatalf("drew %q (%d columns) on a 40-column terminal", line, n)
	}
}

func TestFmtBytesUsesBinaryUnits(t *testing.T) {
	for in, want := range map[float64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1.5 * (1 << 30): "1.5 GiB"} {
		if got := fmtBytes(in); got != want {
			t.Errorf("fmtBytes(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestWaitingForAJobRidesOutAGeneratorThatDoesNotAnswerForAWhile(t *testing.T) {
	ns, err := bus.Embedded(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// Nobody answers at first (no responders); then the generator answers
	// that it cannot read the job now (503), then with the ended job.
	var asked atomic.Int32
	time.AfterFunc(600*time.Millisecond, func() {
		_, _ = nc.Subscribe(api.SubjectJobStatus, func(m *nats.Msg) {
			if asked.Add(1) <= 2 {
				r := nats.NewMsg(m.Reply)
				r.Header.Set(micro.ErrorHeader, "the job's records cannot be read now; try again")
				r.Header.Set(micro.ErrorCodeHeader, "503")
				_ = m.RespondMsg(r)
				return
			}
			_ = m.Respond([]byte(`{"job":{"id":"j1"},"state":"finished","total":1,"done":1,"announced":true}`))
		})
	})
	ev, err := waitJob(context.Background(), nc, "j1", nil)
	if err != nil || ev.State != api.JobFinished || asked.Load() != 3 {
		t.Fatalf("waitJob: %+v, %v after %d answers; want the finished job after 3", ev, err, asked.Load())
	}
	// An answer that is an error other than 503 ends the wait at once.
	as.user = "x"
	defer func() { as.user = "" }()
	_, _ = nc.Subscribe(api.UserSubject(api.SubjectJobStatus, "x"), func(m *nats.Msg) {
		r := nats.NewMsg(m.Reply)
		r.Header.Set(micro.ErrorHeader, `unknown job "j2", or not yours`)
		r.Header.Set(micro.ErrorCodeHeader, "404")
		_ = m.RespondMsg(r)
	})
	if _, err := waitJob(context.Background(), nc, "j2", nil); exitCode(err) != exitNotFound {
		t.Fatalf("waitJob of a job the generator does not know: %v", err)
	}
}
