package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestHistoryPrintsOneLinePerEventWithWhatHeldIt(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	id := uuid.MustParse("3c884280-bfc7-4054-9d64-615044fdb1ab")
	r := api.HistoryReply{DTR: id, State: dtr.Done, Dropped: 3, Events: []api.HistoryEvent{
		{Seq: 4, Time: t0, State: dtr.New},
		{Seq: 5, Time: t0.Add(1500 * time.Millisecond), From: "NEW", State: dtr.Transfer, Hold: "share_full"},
		{Seq: 6, Time: t0.Add(2 * time.Minute), From: "TRANSFER", State: dtr.Transferring, Hold: "running", Grant: "g.3"},
		{Seq: 7, Time: t0.Add(3 * time.Minute), From: "TRANSFERRING", State: dtr.RegisteringReplica, Ended: "g.3", Worker: "delivery@node2 (pid 977)",
			Error: &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "HTTP 503"}, Bytes: 100},
		{Seq: 8, Time: t0.Add(3*time.Minute + time.Second), From: "REGISTERING_REPLICA", State: dtr.New, Hold: "retry_backoff", Until: t0.Add(4 * time.Minute), Attempts: 1},
	}}
	var b bytes.Buffer
	printHistory(&b, r)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 1+len(r.Events) {
		t.Fatalf("%d lines for %d events:\n%s", len(lines), len(r.Events), b.String())
	}
	for i, want := range [][]string{
		{"DTR 3c884280-bfc7-4054-9d64-615044fdb1ab is DONE; 5 events", "3 earlier ones dropped"},
		{"2026-11-26T10:00:00.000Z", "NEW", "submitted"},
		{"+1.5s", "TRANSFER", "queued: its share uses all its slots"},
		{"+1m58.5s", "TRANSFERRING", "running under a grant", "grant g.3"},
		{"+1m0s", "REGISTERING_REPLICA", "error TEMPORARY_REMOTE: HTTP 503", "grant g.3 ended (worker delivery@node2 (pid 977))", "100 bytes"},
		{"+1s", "NEW", "waiting to retry after an error until 2026-11-26T10:04:00Z", "attempts 1"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("line %d %q lacks %q", i, lines[i], w)
			}
		}
	}
}

func TestHistorySaysWhyADTRHasNoEvents(t *testing.T) {
	var b bytes.Buffer
	printHistory(&b, api.HistoryReply{DTR: uuid.New(), State: dtr.Done, Events: []api.HistoryEvent{},
		Missing: "history no longer kept: the history store holds the newest 256 MiB of events"})
	if !strings.Contains(b.String(), "0 events\nhistory no longer kept: the history store holds the newest 256 MiB") {
		t.Fatalf("no reason given:\n%s", b.String())
	}
}

func TestSharesListsTheStuckDTRs(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	var b bytes.Buffer
	printStuck(&b, nil, now)
	if b.Len() != 0 {
		t.Fatalf("printed for none: %q", b.String())
	}
	id := uuid.New()
	printStuck(&b, []api.StuckDTR{{DTR: id, State: dtr.Transferring, Hold: "running", Since: now.Add(-3 * time.Hour), Deadline: 2 * time.Hour}}, now)
	for _, want := range []string{"1 DTRs are stuck", id.String(), "TRANSFERRING for 3h0m0s (deadline 2h0m0s): running under a grant"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("%q lacks %q", b.String(), want)
		}
	}
}
