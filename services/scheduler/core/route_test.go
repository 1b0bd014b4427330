package core

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// copyOf says what one attempt's transfer does: the checksum its copy has
// ("" fails the transfer with a TEMPORARY_REMOTE error), and whether the copy
// is damaged on disk after delivery computed that checksum.
type copyOf struct {
	sum     string
	damaged bool
}

// runCopies drives d through attempts whose copies are as given, answering
// post-processing as the processor does: a copy whose checksum is not the
// expected one fails verification (TRANSFER_SPEED in REGISTERING_REPLICA).
// Before attempt restartBefore (if > 1) the core is restarted from its DTRs
// as stored (JSON), as when the scheduler restarts while d waits for its
// retry. It returns the harness in use at the end and the attempts made.
func runCopies(t *testing.T, h *harness, d *dtr.DTR, copies []copyOf, restartBefore int) (*harness, int) {
	t.Helper()
	attempt := 0
	// send answers as a worker does: a failed post-processing reports no
	// checksum.
	send := func(g Grant, f *dtr.Failure, sum string) {
		delete(h.running, g.ID)
		if err := h.c.Result(h.now, Result{DTR: g.DTR.ID, Grant: g.ID, Error: f, Size: 10, Bytes: 10, Checksum: sum}); err != nil {
			t.Fatal(err)
		}
		h.collect()
	}
	for i := 0; len(h.final) == 0 && i < 10000; i++ {
		for _, g := range h.tick(time.Second) {
			switch {
			case g.State == dtr.QueryingReplica:
				attempt++
				if attempt > len(copies) {
					t.Fatalf("attempt %d was started; the test has %d", attempt, len(copies))
				}
				send(g, nil, "")
			case g.State == dtr.Transferring && copies[attempt-1].sum == "":
				send(g, &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "GET got 503"}, "")
			case g.State == dtr.Transferring:
				send(g, nil, copies[attempt-1].sum)
			case g.State == dtr.RegisteringReplica && !g.Cleanup:
				c := copies[attempt-1]
				switch {
				case c.damaged:
					send(g, &dtr.Failure{Kind: dtr.ErrTransferSpeed, Text: fmt.Sprintf(
						"verify %s: checksum mismatch: delivery computed %s, the file on disk has adler32:00000bad", d.Destination, c.sum)}, "")
				case c.sum != d.Options.Checksum:
					send(g, &dtr.Failure{Kind: dtr.ErrTransferSpeed, Text: fmt.Sprintf(
						"verify %s: checksum mismatch: expected %s, got %s", d.Destination, d.Options.Checksum, c.sum)}, "")
				default:
					send(g, nil, c.sum)
				}
			default:
				send(g, nil, "")
			}
		}
		if attempt == restartBefore-1 && len(h.running) == 0 {
			if w, ok := h.c.Get(d.ID); ok && w.State == dtr.New && !w.NextProcess.IsZero() {
				h = restarted(t, h)
				restartBefore = 0
			}
		}
	}
	return h, attempt
}

// restarted returns a new core holding h's unfinished DTRs as a store holds
// them: encoded as JSON and read back.
func restarted(t *testing.T, h *harness) *harness {
	t.Helper()
	h2 := newHarness(t, h.c.Config())
	h2.now = h.now
	for _, e := range h.c.dtrs {
		b, err := json.Marshal(h.c.peekEntry(e))
		if err != nil {
			t.Fatal(err)
		}
		var d dtr.DTR
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatal(err)
		}
		if err := h2.c.Restore(h2.now, &d); err != nil {
			t.Fatal(err)
		}
	}
	return h2
}

func TestACopyWithTheWrongChecksumIsCopiedAgainOnceThenFailsPermanently(t *testing.T) {
	const want, bad, other = "adler32:0a1b2c3d", "adler32:ffff0000", "adler32:12345678"
	twice := "checksum mismatch: expected " + want + ", got " + bad + " (twice: the source or its stated checksum is wrong)"
	tests := []struct {
		name          string
		copies        []copyOf
		restartBefore int // restart the scheduler before this attempt; 0: never
		wantState     dtr.State
		wantKind      dtr.ErrorKind
		wantText      string // the whole text; "" with wantKind: any
		wantAttempts  int
	}{
		{name: "two mismatches fail PERMANENT_REMOTE naming both values",
			copies:    []copyOf{{sum: bad}, {sum: bad}},
			wantState: dtr.Error, wantKind: dtr.ErrPermanentRemote, wantText: twice, wantAttempts: 2},
		{name: "a restart between the two attempts changes nothing",
			copies: []copyOf{{sum: bad}, {sum: bad}}, restartBefore: 2,
			wantState: dtr.Error, wantKind: dtr.ErrPermanentRemote, wantText: twice, wantAttempts: 2},
		{name: "two different wrong copies are both named",
			copies:    []copyOf{{sum: bad}, {sum: other}},
			wantState: dtr.Error, wantKind: dtr.ErrPermanentRemote, wantAttempts: 2,
			wantText: "checksum mismatch: expected " + want + ", got " + bad + ", then " + other + " (twice: the source or its stated checksum is wrong)"},
		{name: "a mismatch then a right copy is done",
			copies:    []copyOf{{sum: bad}, {sum: want}},
			wantState: dtr.Done, wantAttempts: 2},
		{name: "the mismatches need not follow each other",
			copies: []copyOf{{sum: bad}, {sum: ""}, {sum: bad}}, restartBefore: 3,
			wantState: dtr.Error, wantKind: dtr.ErrPermanentRemote, wantText: twice, wantAttempts: 3},
		{name: "a right copy damaged on disk is retried as any TRANSFER_SPEED error",
			copies:    []copyOf{{sum: want, damaged: true}, {sum: want, damaged: true}, {sum: want, damaged: true}, {sum: want, damaged: true}},
			wantState: dtr.Error, wantKind: dtr.ErrTransferSpeed, wantAttempts: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxTransferTries = 4
			cfg.RetryBase = time.Second
			h := newHarness(t, cfg)
			d := newDTR(1, "x", "")
			d.Options.Checksum = want
			h.submit(d)
			h, attempts := runCopies(t, h, d, tt.copies, tt.restartBefore)
			got, ok := h.final[d.ID]
			if !ok {
				t.Fatalf("not final after %d attempts", attempts)
			}
			if got.State != tt.wantState || got.Attempts != tt.wantAttempts || attempts != tt.wantAttempts {
				t.Fatalf("ended %s after %d attempts (%d started), error %+v; want %s after %d",
					got.State, got.Attempts, attempts, got.Error, tt.wantState, tt.wantAttempts)
			}
			if tt.wantKind == "" {
				return
			}
			if got.Error == nil || got.Error.Kind != tt.wantKind || tt.wantText != "" && got.Error.Text != tt.wantText {
				t.Fatalf("error %+v, want %s %q", got.Error, tt.wantKind, tt.wantText)
			}
		})
	}
}

func TestAFirstChecksumMismatchWaitsForItsRetryAsATransferSpeedError(t *testing.T) {
	cfg := DefaultConfig()
	cfg.RetryBase = time.Minute
	h := newHarness(t, cfg)
	d := newDTR(1, "x", "")
	d.Options.Checksum = "adler32:0a1b2c3d"
	h.submit(d)
	for i := 0; i < 100; i++ {
		if w, _ := h.c.Get(d.ID); w.State == dtr.New && !w.NextProcess.IsZero() {
			break
		}
		for _, g := range h.tick(time.Second) {
			if g.State == dtr.RegisteringReplica {
				// The harness's copies have adler32:00000001.
				h.answer(g, &dtr.Failure{Kind: dtr.ErrTransferSpeed, Text: "checksum mismatch: expected adler32:0a1b2c3d, got adler32:00000001"})
				continue
			}
			h.answer(g, nil)
		}
	}
	w, _ := h.c.Get(d.ID)
	if w.State != dtr.New || w.Attempts != 1 || w.NextProcess.IsZero() || w.ChecksumMismatch != "adler32:00000001" ||
		w.Error == nil || w.Error.Kind != dtr.ErrTransferSpeed {
		t.Fatalf("after the first mismatch: %s, %d attempts, next %v, mismatch %q, error %+v; want NEW waiting for attempt 2 with the TRANSFER_SPEED error",
			w.State, w.Attempts, w.NextProcess, w.ChecksumMismatch, w.Error)
	}
}

func TestErrorsAreRetriedOrEndTheDTR(t *testing.T) {
	tests := []struct {
		name      string
		kind      dtr.ErrorKind
		wantState dtr.State
		wantTries int
	}{
		{"a permanent error ends in ERROR at once", dtr.ErrPermanentRemote, dtr.Error, 1},
		{"a local file error is not retried", dtr.ErrLocalFile, dtr.Error, 1},
		{"a temporary error is retried up to maxtransfertries", dtr.ErrTemporaryRemote, dtr.Error, 3},
		{"a transfer speed error is retried", dtr.ErrTransferSpeed, dtr.Error, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxTransferTries = 3
			h := newHarness(t, cfg)
			d := newDTR(1, "alice", dtr.Download)
			h.submit(d)
			var delays []time.Duration
			lastEnd := time.Time{}
			for i := 0; len(h.final) == 0 && i < 1000; i++ {
				for _, g := range h.tick(time.Second) {
					if g.State == dtr.QueryingReplica && !lastEnd.IsZero() {
						delays = append(delays, h.now.Sub(lastEnd))
					}
					if g.State == dtr.Transferring {
						h.answer(g, &dtr.Failure{Kind: tt.kind, Text: "boom"})
						lastEnd = h.now
						continue
					}
					h.answer(g, nil)
				}
			}
			got := h.final[d.ID]
			if got.State != tt.wantState || got.Attempts != tt.wantTries {
				t.Fatalf("ended %s after %d attempts, want %s after %d", got.State, got.Attempts, tt.wantState, tt.wantTries)
			}
			if got.Error == nil || got.Error.Kind != tt.kind || got.Error.Text != "boom" || got.Error.State != dtr.Transferring {
				t.Fatalf("error = %+v, want kind %s raised in TRANSFERRING", got.Error, tt.kind)
			}
			// Retries wait 10·k² s after k attempts (plus the tick that
			// notices): 10 s, then 40 s.
			for k, dl := range delays {
				want := time.Duration((k+1)*(k+1)) * 10 * time.Second
				if dl < want || dl > want+2*time.Second {
					t.Fatalf("retry %d came after %s, want %s", k+1, dl, want)
				}
			}
		})
	}
}

func TestFailedTransferIsCleanedUpByPostProcessing(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	h.submit(newDTR(1, "alice", dtr.Download))
	var cleanup []bool
	for len(h.final) == 0 {
		for _, g := range h.tick(time.Second) {
			if g.State == dtr.RegisteringReplica {
				cleanup = append(cleanup, g.Cleanup)
			}
			if g.State == dtr.Transferring {
				h.answer(g, &dtr.Failure{Kind: dtr.ErrPermanentRemote, Text: "HTTP 404"})
			} else {
				h.answer(g, nil)
			}
		}
	}
	if fmt.Sprint(cleanup) != "[true]" {
		t.Fatalf("post-processing grants' cleanup flags = %v, want [true]", cleanup)
	}
}
