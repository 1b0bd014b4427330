package scheduler

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestHistoryRecordIsEncodedByteForByteAsEncodingJSONDoes(t *testing.T) {
	at := time.Date(2026, 11, 26, 13, 30, 4, 123456789, time.UTC)
	for name, events := range map[string][]api.HistoryEvent{
		"none":    {},
		"minimal": {{Seq: 1, Time: at, State: dtr.New}},
		"every field": {{Seq: 7, Time: at.In(time.FixedZone("x", 3600)), From: "TRANSFER_WAIT", State: dtr.Transferring,
			Hold: "retry", Until: at.Add(time.Minute), Error: &dtr.Failure{Kind: "temporary", Text: "no <route> & \"so\"", State: dtr.Transferring},
			Grant: "g-1", Ended: "g-0", Worker: "delivery@host (pid 12)", Bytes: 1 << 40, Attempts: -2, Share: "atlas#Production Input",
			Priority: 50, Term: 3}},
		"escapes": {{Seq: 2, Time: at, State: dtr.Done, Share: "é\t\"\\<>&\u2028", Worker: "w\x01"},
			{Seq: 3, Time: time.Time{}, State: dtr.Error}},
	} {
		got, err := appendHistoryRecord(nil, events)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want, err := json.Marshal(api.HistoryRecord{Events: events})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
	}
}

func TestHistoryRecordOfABadStateOrTimeIsAnError(t *testing.T) {
	for name, ev := range map[string]api.HistoryEvent{
		"state": {Time: time.Now(), State: dtr.State(250)},
		"year":  {Time: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		if _, err := appendHistoryRecord(nil, []api.HistoryEvent{ev}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
