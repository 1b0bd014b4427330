// Package codec writes and reads Sluice's messages: CloudEvents in NATS
// messages (binary content mode, structured accepted), their JSON data
// with one JSON library (goccy/go-json), and the batched events' items.
package codec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus/tracing"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// specs maps "ce-" headers to CloudEvents attributes.
var specs = spec.WithPrefix("ce-")

// ErrNotCloudEvent is returned by Decode for a message with neither ce-*
// headers nor a structured CloudEvents content type.
var ErrNotCloudEvent = errors.New("not a CloudEvent")

// NewEvent builds a CloudEvent with a fresh id, the time now and JSON data.
func NewEvent(typ, source, subject string, data any) (event.Event, error) {
	ev := event.New()
	ev.SetID(uuid.NewString())
	ev.SetType(typ)
	ev.SetSource(source)
	ev.SetTime(time.Now().UTC())
	if subject != "" {
		ev.SetSubject(subject)
	}
	// The data is written here, as encoding/json writes it but faster
	// (EncodeJSON); the SDK takes JSON bytes as they are.
	b, ok := data.([]byte)
	if !ok {
		var err error
		if b, err = EncodeJSON(data); err != nil {
			return ev, fmt.Errorf("event %s: %w", typ, err)
		}
	}
	if err := ev.SetData(event.ApplicationJSON, b); err != nil {
		return ev, fmt.Errorf("event %s: %w", typ, err)
	}
	ev.DataBase64 = false // JSON, not bytes to carry as base64 in a structured event
	return ev, nil
}

// Encode writes a CloudEvent as a NATS message in binary content mode:
// attributes in ce-* headers, data in the body. The message id header
// (Nats-Msg-Id) is msgID, or the event id when msgID is empty, so that
// JetStream drops a republished duplicate; ctx's span context goes in the
// traceparent header.
func Encode(ctx context.Context, subject, msgID string, ev event.Event) (*nats.Msg, error) {
	m := nats.NewMsg(subject)
	if _, err := binding.Write(binding.WithForceBinary(ctx), binding.ToMessage(&ev), nil, (*headerWriter)(m)); err != nil {
		return nil, fmt.Errorf("encode %s event: %w", ev.Type(), err)
	}
	if msgID == "" {
		msgID = ev.ID()
	}
	m.Header.Set(nats.MsgIdHdr, msgID)
	tracing.Inject(ctx, m.Header)
	return m, nil
}

// Decode reads a CloudEvent from a NATS message in binary (ce-* headers) or
// structured (application/cloudevents+json) mode and validates it.
func Decode(ctx context.Context, m *nats.Msg) (*event.Event, error) {
	r := (*msgReader)(m)
	if r.ReadEncoding() == binding.EncodingUnknown {
		return nil, ErrNotCloudEvent
	}
	ev, err := binding.ToEvent(ctx, r)
	if err != nil {
		return nil, fmt.Errorf("malformed CloudEvent: %w", err)
	}
	if err := ev.Validate(); err != nil {
		return nil, fmt.Errorf("invalid CloudEvent: %w", err)
	}
	return ev, nil
}

// DecodeData decodes a message's event and its JSON data into v, checking
// the event type.
func DecodeData(ctx context.Context, m *nats.Msg, typ string, v any) (*event.Event, error) {
	ev, err := Decode(ctx, m)
	if err != nil {
		return nil, err
	}
	if ev.Type() != typ {
		return ev, fmt.Errorf("event type %q, want %q", ev.Type(), typ)
	}
	if err := DecodeJSON(ev.Data(), v); err != nil {
		return ev, fmt.Errorf("%s data: %w", typ, err)
	}
	return ev, nil
}

// DecodeResults reads the results of a message on a result subject: one
// (org.sluice.result.v1) or several (org.sluice.results.v1).
func DecodeResults(ctx context.Context, m *nats.Msg) ([]api.Result, error) {
	ev, err := Decode(ctx, m)
	if err != nil {
		return nil, err
	}
	switch ev.Type() {
	case api.TypeResult:
		var r api.Result
		if err := DecodeJSON(ev.Data(), &r); err != nil {
			return nil, fmt.Errorf("%s data: %w", api.TypeResult, err)
		}
		return []api.Result{r}, nil
	case api.TypeResults:
		var rs api.Results
		if err := DecodeJSON(ev.Data(), &rs); err != nil {
			return nil, fmt.Errorf("%s data: %w", api.TypeResults, err)
		}
		return rs.Results, nil
	}
	return nil, fmt.Errorf("event type %q, want %q or %q", ev.Type(), api.TypeResult, api.TypeResults)
}

// Final is one final DTR of a message on sluice.event.dtr.final.
type Final struct {
	DTR dtr.DTR
	// Data is the DTR's JSON as the scheduler wrote it.
	Data []byte
	// TraceParent names the span that announced it (the message's
	// traceparent header for a single final DTR).
	TraceParent string
}

// DecodeFinals reads the final DTRs of a message on sluice.event.dtr.final:
// one (org.sluice.dtr.final.v1) or several (org.sluice.dtr.finals.v1).
func DecodeFinals(ctx context.Context, m *nats.Msg) ([]Final, error) {
	ev, err := Decode(ctx, m)
	if err != nil {
		return nil, err
	}
	switch ev.Type() {
	case api.TypeDTRFinal:
		f := Final{Data: ev.Data(), TraceParent: m.Header.Get("traceparent")}
		if err := DecodeJSON(f.Data, &f.DTR); err != nil {
			return nil, fmt.Errorf("%s data: %w", api.TypeDTRFinal, err)
		}
		return []Final{f}, nil
	case api.TypeDTRFinals:
		var fs api.Finals
		if err := DecodeJSON(ev.Data(), &fs); err != nil {
			return nil, fmt.Errorf("%s data: %w", api.TypeDTRFinals, err)
		}
		out := make([]Final, len(fs.DTRs))
		for i, e := range fs.DTRs {
			out[i] = Final{Data: e.DTR, TraceParent: e.TraceParent}
			if err := DecodeJSON(e.DTR, &out[i].DTR); err != nil {
				return nil, fmt.Errorf("%s data: dtrs[%d]: %w", api.TypeDTRFinals, i, err)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("event type %q, want %q or %q", ev.Type(), api.TypeDTRFinal, api.TypeDTRFinals)
}

// headerWriter writes a binary-mode CloudEvent into a NATS message.
type headerWriter nats.Msg

func (w *headerWriter) Start(context.Context) error { return nil }
func (w *headerWriter) End(context.Context) error   { return nil }

func (w *headerWriter) SetAttribute(a spec.Attribute, value any) error {
	s, err := types.Format(value)
	if err != nil {
		return err
	}
	if a.Kind() == spec.DataContentType {
		w.Header.Set("content-type", s)
		return nil
	}
	w.Header.Set("ce-"+a.Name(), s)
	return nil
}

func (w *headerWriter) SetExtension(name string, value any) error {
	s, err := types.Format(value)
	if err != nil {
		return err
	}
	w.Header.Set("ce-"+name, s)
	return nil
}

func (w *headerWriter) SetData(r io.Reader) error {
	switch b := r.(type) {
	case *bytes.Buffer: // how the SDK hands over an event's data
		// Taken as it is: neither the event nor the message changes it.
		w.Data = b.Bytes()
		return nil
	case *bytes.Reader:
		w.Data = make([]byte, b.Len())
		_, err := io.ReadFull(b, w.Data)
		return err
	}
	b, err := io.ReadAll(r)
	w.Data = b
	return err
}

// msgReader reads a CloudEvent from a NATS message. Header names are matched
// without regard to case, since publishers differ.
type msgReader nats.Msg

func (r *msgReader) header(name string) string { return Header(r.Header, name) }

// Header returns the first value of a NATS message header, its name
// matched without regard to case (nats.Header.Get is case-sensitive).
func Header(h nats.Header, name string) string {
	for k, v := range h {
		if strings.EqualFold(k, name) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

func (r *msgReader) ReadEncoding() binding.Encoding {
	if r.header("ce-specversion") != "" {
		return binding.EncodingBinary
	}
	if strings.HasPrefix(r.header("content-type"), event.ApplicationCloudEventsJSON) {
		return binding.EncodingStructured
	}
	return binding.EncodingUnknown
}

func (r *msgReader) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	if r.ReadEncoding() != binding.EncodingStructured {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, format.JSON, bytes.NewReader(r.Data))
}

func (r *msgReader) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	version := specs.Version(r.header("ce-specversion"))
	if version == nil {
		return fmt.Errorf("unknown CloudEvents specversion %q", r.header("ce-specversion"))
	}
	for k, v := range r.Header {
		k = strings.ToLower(k)
		if !strings.HasPrefix(k, "ce-") || len(v) == 0 {
			continue
		}
		if a := version.Attribute(k); a != nil {
			if err := w.SetAttribute(a, v[0]); err != nil {
				return err
			}
		} else if err := w.SetExtension(strings.TrimPrefix(k, "ce-"), v[0]); err != nil {
			return err
		}
	}
	if ct := r.header("content-type"); ct != "" {
		if err := w.SetAttribute(version.AttributeFromKind(spec.DataContentType), ct); err != nil {
			return err
		}
	}
	if len(r.Data) > 0 {
		// A buffer, which the SDK's event builder takes without copying:
		// the event's data is the message's, which nothing changes.
		return w.SetData(bytes.NewBuffer(r.Data))
	}
	return nil
}

func (r *msgReader) Finish(error) error { return nil }

func (r *msgReader) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	version := specs.Version(r.header("ce-specversion"))
	if version == nil {
		return nil, nil
	}
	a := version.AttributeFromKind(k)
	if a == nil {
		return nil, nil
	}
	v := ""
	if k == spec.DataContentType {
		v = r.header("content-type")
	} else {
		v = r.header(a.PrefixedName())
	}
	if v == "" {
		return a, nil
	}
	return a, v
}

func (r *msgReader) GetExtension(name string) any {
	if v := r.header("ce-" + name); v != "" {
		return v
	}
	return nil
}
