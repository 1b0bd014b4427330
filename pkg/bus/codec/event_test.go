package codec

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus/tracing"
)

func TestEncodeWritesBinaryCloudEventsThatDecodeBack(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("test").Start(context.Background(), "send")
	defer span.End()
	ev, err := NewEvent(api.TypeProgress, "sluice/test", "dtr-1", api.Progress{Bytes: 42, Grant: "g.1"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := Encode(ctx, "sluice.progress.delivery", "msg-1", ev)
	if err != nil {
		t.Fatal(err)
	}
	for h, want := range map[string]string{
		"ce-specversion": "1.0", "ce-type": api.TypeProgress, "ce-source": "sluice/test", "ce-subject": "dtr-1",
		"content-type": "application/json", nats.MsgIdHdr: "msg-1",
	} {
		if got := m.Header.Get(h); got != want {
			t.Errorf("header %s = %q, want %q", h, got, want)
		}
	}
	if tp := m.Header.Get("traceparent"); !strings.Contains(tp, span.SpanContext().TraceID().String()) {
		t.Errorf("traceparent %q does not carry the trace %s", tp, span.SpanContext().TraceID())
	}
	var p api.Progress
	back, err := DecodeData(context.Background(), m, api.TypeProgress, &p)
	if err != nil {
		t.Fatal(err)
	}
	if back.ID() != ev.ID() || p.Bytes != 42 || p.Grant != "g.1" {
		t.Fatalf("decoded %v %+v", back, p)
	}
	got := trace.SpanContextFromContext(tracing.Extract(context.Background(), m.Header))
	if got.TraceID() != span.SpanContext().TraceID() {
		t.Fatalf("extracted trace %s, want %s", got.TraceID(), span.SpanContext().TraceID())
	}
}

func TestDecodeAcceptsEveryContentModeAndRefusesTheRest(t *testing.T) {
	binary := func(h map[string]string, body string) *nats.Msg {
		m := nats.NewMsg("x")
		for k, v := range h {
			m.Header[k] = []string{v} // as any publisher may spell it
		}
		m.Data = []byte(body)
		return m
	}
	full := map[string]string{"Ce-Specversion": "1.0", "Ce-Id": "1", "Ce-Source": "s", "Ce-Type": "t", "Content-Type": "application/json"}
	tests := []struct {
		name    string
		msg     *nats.Msg
		wantErr string
	}{
		{"binary with header names in any case", binary(full, `{"a":1}`), ""},
		{"structured", binary(map[string]string{"content-type": "application/cloudevents+json"},
			`{"specversion":"1.0","id":"1","source":"s","type":"t","data":{"a":1}}`), ""},
		{"plain JSON is not a CloudEvent", binary(nil, `{"a":1}`), "not a CloudEvent"},
		{"binary without an id", binary(map[string]string{"ce-specversion": "1.0", "ce-source": "s", "ce-type": "t"}, `{}`), "id"},
		{"unknown spec version", binary(map[string]string{"ce-specversion": "9.9", "ce-id": "1", "ce-source": "s", "ce-type": "t"}, `{}`), "specversion"},
		{"structured that is not JSON", binary(map[string]string{"content-type": "application/cloudevents+json"}, `{{`), "malformed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode(context.Background(), tt.msg)
			if tt.wantErr == "" && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("got %v, want an error mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func TestDecodeFinalsReadsOneFinalDTROrSeveral(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	a, b := `{"id":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","source":"file:///a","destination":"file:///b","state":"DONE","created":"0001-01-01T00:00:00Z","updated":"0001-01-01T00:00:00Z"}`,
		`{"id":"7c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","source":"file:///c","destination":"file:///d","state":"ERROR","created":"0001-01-01T00:00:00Z","updated":"0001-01-01T00:00:00Z"}`
	encode := func(typ string, data string) *nats.Msg {
		ev, err := NewEvent(typ, "sluice/scheduler", "", []byte(data))
		if err != nil {
			t.Fatal(err)
		}
		m, err := Encode(tracing.Context(context.Background(), tp), api.SubjectDTRFinal, "", ev)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	tests := []struct {
		name    string
		msg     *nats.Msg
		want    []string // each DTR's data
		wantTPs []string
		wantErr string
	}{
		{"one", encode(api.TypeDTRFinal, a), []string{a}, []string{tp}, ""},
		{"several, each with its span", encode(api.TypeDTRFinals, `{"dtrs":[{"traceparent":"`+tp+`","dtr":`+a+`},{"dtr":`+b+`}]}`),
			[]string{a, b}, []string{tp, ""}, ""},
		{"a DTR that is not one", encode(api.TypeDTRFinals, `{"dtrs":[{"dtr":`+a+`},{"dtr":"DONE"}]}`), nil, nil, "dtrs[1]"},
		{"another type", encode(api.TypeResult, `{}`), nil, nil, `want "org.sluice.dtr.final.v1" or "org.sluice.dtr.finals.v1"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs, err := DecodeFinals(context.Background(), tt.msg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(fs) != len(tt.want) {
				t.Fatalf("%d final DTRs, want %d", len(fs), len(tt.want))
			}
			for i, f := range fs {
				if string(f.Data) != tt.want[i] || f.TraceParent != tt.wantTPs[i] {
					t.Errorf("final %d: data %s, traceparent %q; want %s, %q", i, f.Data, f.TraceParent, tt.want[i], tt.wantTPs[i])
				}
				if f.DTR.Source == "" || !f.DTR.State.Final() {
					t.Errorf("final %d: DTR %+v not decoded", i, f.DTR)
				}
			}
		})
	}
}

func TestDecodeJSONReadsAsEncodingJSONAndRefusesInItsWords(t *testing.T) {
	for _, tt := range []struct{ name, data string }{
		{"a result", `{"dtr":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","grant":"g.1","state":"TRANSFERRING","bytes":7,"Checksum":"adler32:1"}`},
		{"empty", ``},
		{"not JSON", `not json`},
		{"cut short", `{"dtr":`},
		{"a bad UUID", `{"dtr":"6c1d8ea0"}`},
		{"a bad state", `{"state":"NOT_A_STATE"}`},
		{"a number too large", `{"bytes":1e400}`},
		{"a string for a number", `{"bytes":"7"}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var std, got api.Result
			errStd := json.Unmarshal([]byte(tt.data), &std)
			err := DecodeJSON([]byte(tt.data), &got)
			if fmt.Sprint(err) != fmt.Sprint(errStd) {
				t.Fatalf("error %v, encoding/json's %v", err, errStd)
			}
			if err == nil && !reflect.DeepEqual(got, std) {
				t.Fatalf("read %+v, encoding/json %+v", got, std)
			}
		})
	}
}
