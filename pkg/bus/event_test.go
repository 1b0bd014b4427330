package bus

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

func TestEncodeWritesBinaryCloudEventsThatDecodeBack(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("test").Start(context.Background(), "send")
	defer span.End()
	ev, err := NewEvent(TypeProgress, "sluice/test", "dtr-1", Progress{Bytes: 42, Grant: "g.1"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := Encode(ctx, "sluice.progress.delivery", "msg-1", ev)
	if err != nil {
		t.Fatal(err)
	}
	for h, want := range map[string]string{
		"ce-specversion": "1.0", "ce-type": TypeProgress, "ce-source": "sluice/test", "ce-subject": "dtr-1",
		"content-type": "application/json", nats.MsgIdHdr: "msg-1",
	} {
		if got := m.Header.Get(h); got != want {
			t.Errorf("header %s = %q, want %q", h, got, want)
		}
	}
	if tp := m.Header.Get("traceparent"); !strings.Contains(tp, span.SpanContext().TraceID().String()) {
		t.Errorf("traceparent %q does not carry the trace %s", tp, span.SpanContext().TraceID())
	}
	var p Progress
	back, err := DecodeData(context.Background(), m, TypeProgress, &p)
	if err != nil {
		t.Fatal(err)
	}
	if back.ID() != ev.ID() || p.Bytes != 42 || p.Grant != "g.1" {
		t.Fatalf("decoded %v %+v", back, p)
	}
	got := trace.SpanContextFromContext(Extract(context.Background(), m.Header))
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
