package scheduler

// The history's messages, encoded without reflection: the writer encodes
// every event of every DTR, several a DTR.

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sluice-dtr/sluice/pkg/api"
)

// appendHistoryRecord appends the api.HistoryRecord of events to b as JSON,
// byte for byte as encoding/json writes it.
func appendHistoryRecord(b []byte, events []api.HistoryEvent) ([]byte, error) {
	b = append(b, `{"events":[`...)
	for i := range events {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = appendHistoryEvent(b, &events[i]); err != nil {
			return nil, err
		}
	}
	return append(b, "]}"...), nil
}

// appendHistoryEvent appends one event, its fields in the order and with
// the omissions of api.HistoryEvent's tags.
func appendHistoryEvent(b []byte, ev *api.HistoryEvent) ([]byte, error) {
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, ev.Seq, 10)
	b = append(b, `,"time":`...)
	var err error
	if b, err = appendJSONTime(b, ev.Time); err != nil {
		return nil, err
	}
	if ev.From != "" {
		b = appendJSONField(b, "from", ev.From)
	}
	state, err := ev.State.MarshalText()
	if err != nil {
		return nil, fmt.Errorf("history event: %w", err)
	}
	b = appendJSONField(b, "state", string(state))
	if ev.Hold != "" {
		b = appendJSONField(b, "hold", ev.Hold)
	}
	if !ev.Until.IsZero() {
		b = append(b, `,"until":`...)
		if b, err = appendJSONTime(b, ev.Until); err != nil {
			return nil, err
		}
	}
	if ev.Error != nil {
		f, err := json.Marshal(ev.Error)
		if err != nil {
			return nil, fmt.Errorf("history event: %w", err)
		}
		b = append(append(b, `,"error":`...), f...)
	}
	if ev.Grant != "" {
		b = appendJSONField(b, "grant", ev.Grant)
	}
	if ev.Ended != "" {
		b = appendJSONField(b, "ended_grant", ev.Ended)
	}
	if ev.Worker != "" {
		b = appendJSONField(b, "worker", ev.Worker)
	}
	if ev.Bytes != 0 {
		b = strconv.AppendInt(append(b, `,"bytes":`...), ev.Bytes, 10)
	}
	if ev.Attempts != 0 {
		b = strconv.AppendInt(append(b, `,"attempts":`...), int64(ev.Attempts), 10)
	}
	if ev.Share != "" {
		b = appendJSONField(b, "share", ev.Share)
	}
	if ev.Priority != 0 {
		b = strconv.AppendInt(append(b, `,"priority":`...), int64(ev.Priority), 10)
	}
	if ev.Term != 0 {
		b = strconv.AppendUint(append(b, `,"term":`...), ev.Term, 10)
	}
	return append(b, '}'), nil
}

// appendJSONField appends ,"name":"value".
func appendJSONField(b []byte, name, value string) []byte {
	b = append(append(append(b, `,"`...), name...), `":`...)
	return appendJSONString(b, value)
}

// appendJSONTime appends t as time.Time's MarshalJSON does.
func appendJSONTime(b []byte, t time.Time) ([]byte, error) {
	if y := t.Year(); y < 0 || y >= 10000 {
		return nil, fmt.Errorf("history event: time %v: year outside of range [0,9999]", t)
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), nil
}

// appendJSONString appends s quoted as encoding/json quotes it: plain
// printable ASCII as it is, anything else by encoding/json itself.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
