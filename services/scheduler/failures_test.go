package scheduler

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

func TestReasonsDifferingInHostsPathsAndNumbersAreOne(t *testing.T) {
	for _, tt := range []struct{ a, b, want string }{
		{"connection refused by dcache01.example.org:2880", "connection refused by se.other.net:443",
			"connection refused by <host>"},
		{`GET https://a.example.org/data/f1?x=1: 503 Service Unavailable`, `GET http://b.example.org/other: 503 Service Unavailable`,
			"GET <url>: <n> Service Unavailable"},
		{"open /data/in/f1: no such file or directory", "open /scratch/x/y/f22: no such file or directory",
			"open <path>: no such file or directory"},
		{"dial tcp 10.0.0.1:443: i/o timeout", "dial tcp [::1]:8443: i/o timeout", "dial tcp <host>: i/o timeout"},
		{"transfer too slow: 12 B/s for 300 s", "transfer too slow: 7 B/s for 60 s", "transfer too slow: <n> B/s for <n> s"},
		{"checksum adler32:0a1b2c3d is not adler32:ffee0011", "checksum adler32:12345678 is not adler32:9abcdef0",
			"checksum adler32:<n> is not adler32:<n>"},
		{"grant 1b4e28ba-2fa1-11d2-883f-0016d3cca427 lost", "grant 6ba7b810-9dad-11d1-80b4-00c04fd430c8 lost", "grant <id> lost"},
	} {
		a, b := normaliseReason(tt.a), normaliseReason(tt.b)
		if a != tt.want || b != tt.want {
			t.Errorf("%q → %q\n%q → %q\nwant both %q", tt.a, a, tt.b, b, tt.want)
		}
	}
	if a, b := normaliseReason("no such file or directory"), normaliseReason("permission denied"); a == b {
		t.Errorf("different reasons are one: %q", a)
	}
}

func failedDTR(kind dtr.ErrorKind, text string) *dtr.DTR {
	return &dtr.DTR{ID: uuid.New(), JobID: "job1", Share: "atlas-download", State: dtr.Error, Attempts: 3,
		Error: &dtr.Failure{Kind: kind, Text: text, State: dtr.Transferring}}
}

func TestFailuresAreGroupedByKindAndReasonWithCountsAndTheLatestExample(t *testing.T) {
	m := newMonitor("arc")
	t0 := time.Date(2026, 11, 26, 1, 0, 0, 0, time.UTC)
	var refusedB, missing *dtr.DTR
	for i := range 5 {
		d := failedDTR(dtr.ErrTemporaryRemote, fmt.Sprintf("connection refused by host%d.example.org:443", i))
		m.final(t0.Add(time.Duration(i)*time.Second), d)
		refusedB = d
	}
	missing = failedDTR(dtr.ErrPermanentRemote, "open /in/f: no such file or directory")
	m.final(t0.Add(10*time.Second), missing)
	// The same text of another kind is another group.
	m.final(t0.Add(11*time.Second), failedDTR(dtr.ErrInternalProcess, "connection refused by x.example.org:1"))
	// A DTR that ended DONE is no failure.
	m.final(t0, &dtr.DTR{ID: uuid.New(), State: dtr.Done, Share: "atlas-download", Bytes: 10})

	m.sample(t0.Add(12*time.Second), newTestCore(), nil, nil, nil)
	ov := m.overview()
	if ov.FailuresKept != 7 || len(ov.Failures) != 3 {
		t.Fatalf("%d failures kept in %d groups, want 7 in 3: %+v", ov.FailuresKept, len(ov.Failures), ov.Failures)
	}
	g := ov.Failures[0]
	if g.Kind != dtr.ErrTemporaryRemote || g.Reason != "connection refused by <host>" || g.Count != 5 {
		t.Errorf("first group %s %q ×%d", g.Kind, g.Reason, g.Count)
	}
	if g.Latest.DTR != refusedB.ID || g.Latest.Text != "connection refused by host4.example.org:443" || g.Latest.JobID != "job1" ||
		g.Latest.Share != "atlas-download" || g.Latest.State != dtr.Transferring || !g.Latest.Time.Equal(t0.Add(4*time.Second)) {
		t.Errorf("latest example %+v", g.Latest)
	}
	if len(g.DTRs) != 5 || g.DTRs[0] != refusedB.ID || !g.First.Equal(t0) {
		t.Errorf("group DTRs %v (first at %s)", g.DTRs, g.First)
	}
	if ov.Failures[1].Latest.DTR == missing.ID { // equal counts: the latest first
		t.Errorf("groups of one in the order %v, %v", ov.Failures[1].Kind, ov.Failures[2].Kind)
	}
	if r, ok := m.failure(missing.ID); !ok || r.Kind != dtr.ErrPermanentRemote {
		t.Errorf("the failure of DTR %s: %+v, %v", missing.ID, r, ok)
	}
}

func TestFailuresAreBoundedInNumberAndAgeAndKeepNoCredentials(t *testing.T) {
	m := newMonitor("arc")
	t0 := time.Date(2026, 11, 26, 1, 0, 0, 0, time.UTC)
	first := failedDTR(dtr.ErrTemporaryRemote, "x")
	m.final(t0, first)
	for i := range maxFailures + 10 {
		m.final(t0.Add(time.Hour+time.Duration(i)*time.Millisecond), failedDTR(dtr.ErrTemporaryRemote, "GET https://u:secret@h.example.org/f?access_token=abc: "+strings.Repeat("long ", 70)))
	}
	if _, ok := m.failure(first.ID); ok {
		t.Error("the oldest failure is kept beyond the bound")
	}
	m.sample(t0.Add(time.Hour+time.Minute), newTestCore(), nil, nil, nil)
	ov := m.overview()
	if ov.FailuresKept != maxFailures {
		t.Errorf("%d failures kept, want %d", ov.FailuresKept, maxFailures)
	}
	text := ov.Failures[0].Latest.Text
	if strings.Contains(text, "secret") || strings.Contains(text, "abc") || len(text) > maxFailureText {
		t.Errorf("kept text (%d bytes) %q", len(text), text)
	}
	// The same DTR announced again is one failure.
	again := failedDTR(dtr.ErrTemporaryRemote, "y")
	m.final(t0.Add(2*time.Hour), again)
	m.final(t0.Add(2*time.Hour), again)
	m.sample(t0.Add(2*time.Hour), newTestCore(), nil, nil, nil)
	if n := m.overview().FailuresKept; n != maxFailures {
		t.Errorf("%d failures kept after one DTR announced twice, want %d", n, maxFailures)
	}
	// A day later all have gone.
	m.sample(t0.Add(failuresSpan+3*time.Hour), newTestCore(), nil, nil, nil)
	if ov := m.overview(); ov.FailuresKept != 0 || len(ov.Failures) != 0 {
		t.Errorf("after a day %d failures in %d groups", ov.FailuresKept, len(ov.Failures))
	}
}

func TestTotalsCountWhatEndedAndTheRatesOverTheLastMinuteAndSinceTheStart(t *testing.T) {
	m := newMonitor("arc")
	t0 := time.Date(2026, 11, 26, 1, 0, 0, 0, time.UTC)
	m.started = t0
	c := newTestCore()
	m.sample(t0, c, nil, nil, nil)
	for i := range 120 {
		m.final(t0, &dtr.DTR{ID: uuid.New(), State: dtr.Done, Share: "s", Bytes: 2e6})
		m.sample(t0.Add(time.Duration(i+1)*time.Second), c, nil, nil, nil)
	}
	ov := m.overview()
	tt := ov.Totals
	if tt.Bytes != 240e6 || !tt.Since.Equal(t0) {
		t.Fatalf("totals %+v", tt)
	}
	// The core's counts are zero here (no DTR went through it): the bytes
	// alone move.
	if tt.LastMinute.Seconds != 60 || tt.LastMinute.MBPerSecond != 2 || tt.SinceStart.Seconds != 120 || tt.SinceStart.MBPerSecond != 2 {
		t.Errorf("rates %+v, %+v; want 2 MB/s over 60 s and 120 s", tt.LastMinute, tt.SinceStart)
	}
}

// newTestCore is an empty core for the monitor to sample.
func newTestCore() *core.Core { return core.New(core.Config{}) }
