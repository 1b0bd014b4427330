package tracing

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
)

const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func TestTraceParent(t *testing.T) {
	t.Run("a traceparent carried by a context comes back the same", func(t *testing.T) {
		if got := TraceParent(Context(context.Background(), tp)); got != tp {
			t.Fatalf("TraceParent gives %q, want %q", got, tp)
		}
	})
	t.Run("a context without a span has none", func(t *testing.T) {
		if got := TraceParent(Context(context.Background(), "")); got != "" {
			t.Fatalf("TraceParent gives %q, want none", got)
		}
	})
	t.Run("a header written by Inject is read by Extract, its name in any case", func(t *testing.T) {
		h := nats.Header{}
		Inject(Context(context.Background(), tp), h)
		moved := nats.Header{"TraceParent": h.Values("traceparent")}
		if got := TraceParent(Extract(context.Background(), moved)); got != tp {
			t.Fatalf("read back %q from %v, want %q", got, moved, tp)
		}
	})
	t.Run("only a well-formed traceparent is valid", func(t *testing.T) {
		for s, want := range map[string]bool{tp: true, "": false, "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01": false, "garbage": false} {
			if got := ValidTraceParent(s); got != want {
				t.Errorf("ValidTraceParent(%q) = %v, want %v", s, got, want)
			}
		}
	})
}

func TestTheTraceIDOfATraceParentIsItsSecondField(t *testing.T) {
	for in, want := range map[string]string{tp: "0af7651916cd43dd8448eb211c80319c", "": "", "garbage": "",
		"00-00000000000000000000000000000000-b7ad6b7169203331-01": ""} {
		if got := TraceID(in); got != want {
			t.Errorf("TraceID(%q) = %q, want %q", in, got, want)
		}
	}
}
