package scheduler

// New DTRs: submissions decoded, checked and given to the core, or
// rejected (reject and rejectEntry answer bad input on every subject).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/bus/tracing"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// submit gives the core a new DTR, unless its id was taken before: by the
// same DTR (a resubmission or redelivery) it is acknowledged and nothing
// runs; by another, it is refused with ErrIDTaken.
func (s *Service) submit(ctx context.Context, now time.Time, m *nats.Msg, d *dtr.DTR, traceparent string, taken map[uuid.UUID]*dtr.DTR) error {
	if earlier, ok := taken[d.ID]; ok { // takenBefore, or earlier in this step
		if earlier != nil && !sameTransfer(earlier, d) {
			return fmt.Errorf("%w: %s", ErrIDTaken, d.ID)
		}
		s.log.Debug("DTR already taken", "dtr", d.ID)
		return nil
	}
	// The publisher's trace goes on: the DTR's own traceparent in a
	// Submits event, else the message's traceparent header, else the
	// event's distributed-tracing extension.
	var cctx context.Context
	var span trace.Span
	if traceparent != "" {
		cctx, span = tracing.StartConsumerOf(ctx, traceparent, m.Subject, d.ID.String(), "schedule")
	} else {
		cctx, span = tracing.StartConsumer(tracing.Context(ctx, d.TraceParent), m, "schedule")
	}
	d.TraceParent = tracing.TraceParent(cctx)
	defer span.End()
	err := s.core.Submit(now, d)
	tracing.SetDTR(span, d, "") // with the share the core gave it
	if err != nil {
		if errors.Is(err, core.ErrDuplicate) {
			return nil // held, though takenBefore did not see it: taken, as before
		}
		return err
	}
	s.stored.Add(d.ID) // its record is journaled with this step
	s.history.arrived(d.ID)
	kept := *d
	taken[d.ID] = &kept // for the same id again in this step, even if it ended at once
	return nil
}

// ErrIDTaken refuses a DTR whose id another DTR (another source or
// destination) has taken. The earlier DTR is not named: it may be another
// publisher's.
var ErrIDTaken = errors.New("this DTR id is taken by another DTR, with another source or destination; a new DTR needs a new id")

// sameTransfer says whether a submitted DTR is the earlier one under its id
// again: the same owner and destination, and every source the earlier DTR
// kept among the submitted ones (the core orders the sources, and drops
// those that SLUICE_PREFERREDPATTERN excludes, but never adds one). Another
// owner's DTR under the same id is not the same: no one can take the id of
// a DTR another will submit, and have theirs taken for it.
func sameTransfer(earlier, d *dtr.DTR) bool {
	if earlier.Destination != d.Destination || earlier.Owner.DN != d.Owner.DN {
		return false
	}
	submitted := sourcesOf(d)
	for _, u := range sourcesOf(earlier) {
		if _, ok := slices.BinarySearch(submitted, u); !ok {
			return false
		}
	}
	return true
}

// sourcesOf returns a DTR's source URLs, sorted, without repeats.
func sourcesOf(d *dtr.DTR) []string {
	out := slices.Concat([]string{d.Source}, d.Replicas)
	slices.Sort(out)
	return slices.Compact(out)
}

// submitted is a decoded message from dtr.submit: its DTRs, or why the
// whole message is refused.
type submitted struct {
	dtrs   []Submitted
	err    error
	caller auth.Caller
	// tokenRef names the caller's bearer token in the bucket
	// sluice_subject_tokens, if it is kept (tokens.go). tokenOwner, for
	// the token a trusted caller sent on behalf of its holder, is that
	// holder: only the DTRs it owns get the token.
	tokenRef, tokenOwner string
	// withToken: the message came with a bearer token (the caller's own,
	// or one sent on its holder's behalf), so its DTRs are
	// dtr.DTR.SubmittedWithToken, kept or not.
	withToken bool
}

// Submitted is one DTR of a message on dtr.submit, or why it is refused.
type Submitted struct {
	DTR *dtr.DTR
	Err error
	// In a Submits event: the DTR's traceparent and its JSON as sent.
	TraceParent string
	Data        []byte
}

// DecodeSubmits reads the DTRs of a message on dtr.submit. A Submits event
// (org.sluice.dtr.submits.v1, binary mode) holds several, each taken or
// refused alone; any other message holds one, as DecodeSubmit reads it. No
// DTR may be larger than maxDTR bytes. An error refuses the whole message.
func DecodeSubmits(ctx context.Context, m *nats.Msg, maxDTR int) ([]Submitted, error) {
	if codec.Header(m.Header, "ce-type") != api.TypeSubmits {
		if err := checkSize(m.Data, maxDTR); err != nil {
			return nil, err
		}
		d, err := DecodeSubmit(ctx, m)
		if err != nil {
			return nil, err
		}
		return []Submitted{{DTR: d}}, nil
	}
	var batch api.Submits
	if _, err := codec.DecodeData(ctx, m, api.TypeSubmits, &batch); err != nil {
		return nil, err
	}
	if len(batch.DTRs) == 0 {
		return nil, errors.New("a submits event without DTRs")
	}
	out := make([]Submitted, len(batch.DTRs))
	for i, e := range batch.DTRs {
		out[i].Data = e.DTR
		err := checkSize(e.DTR, maxDTR)
		if err == nil {
			out[i].DTR, err = decodeSubmission(e.DTR)
		}
		if err != nil {
			out[i].Err = fmt.Errorf("dtrs[%d]: %w", i, err)
			continue
		}
		if tracing.ValidTraceParent(e.TraceParent) { // else ignored, as W3C Trace Context says
			out[i].TraceParent = e.TraceParent
		}
	}
	return out, nil
}

// DecodeSubmit reads a new DTR from a message on dtr.submit: a binary or
// structured CloudEvent of type org.sluice.dtr.submit.v1, or plain DTR JSON.
// Unknown fields are refused by name.
func DecodeSubmit(ctx context.Context, m *nats.Msg) (*dtr.DTR, error) {
	data := m.Data
	ev, err := codec.Decode(ctx, m)
	switch {
	case err == nil:
		if ev.Type() != api.TypeSubmit {
			return nil, fmt.Errorf("event type %q, want %q", ev.Type(), api.TypeSubmit)
		}
		data = ev.Data()
	case !errors.Is(err, codec.ErrNotCloudEvent):
		return nil, err
	}
	d, err := decodeSubmission(data)
	if err != nil {
		return nil, err
	}
	if ev != nil {
		// CloudEvents' distributed-tracing extension: a ce-traceparent
		// header, or "traceparent" in a structured event. One that is not
		// a valid traceparent is ignored, as W3C Trace Context says.
		if tp, _ := ev.Extensions()["traceparent"].(string); tracing.ValidTraceParent(tp) {
			d.TraceParent = tp
		}
	}
	return d, nil
}

// decodeSubmission reads a dtr.Submission and checks the DTR it asks for.
func decodeSubmission(data []byte) (*dtr.DTR, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("empty DTR")
	}
	var sub dtr.Submission
	if err := decodeStrict(data, &sub); err != nil {
		return nil, fmt.Errorf("DTR JSON: %w", err)
	}
	d := sub.DTR()
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return d, nil
}

// rejectEntry publishes why the i-th DTR of a Submits event is refused.
func (s *Service) rejectEntry(ctx context.Context, out *commit, m *nats.Msg, jm jetstream.Msg, i int, data []byte, reason error) {
	msgID := m.Header.Get(nats.MsgIdHdr)
	s.log.Warn("rejected", "subject", m.Subject, "msg_id", msgID, "dtr", i, "reason", reason)
	r := api.Rejection{Subject: m.Subject, MsgID: msgID, Reason: reason.Error(), Payload: rejectionPayload(data)}
	ev, err := codec.NewEvent(api.TypeRejected, "sluice/scheduler", msgID, r)
	if err != nil {
		return
	}
	id := ""
	if meta, err := jm.Metadata(); err == nil {
		id = fmt.Sprintf("reject.%s.%d.%d", meta.Stream, meta.Sequence.Stream, i)
	}
	if rm, err := codec.Encode(ctx, api.SubjectRejected, id, ev); err == nil {
		out.rejections = append(out.rejections, rm)
	}
}

func (s *Service) reject(ctx context.Context, out *commit, m *nats.Msg, jm jetstream.Msg, reason error) {
	msgID := m.Header.Get(nats.MsgIdHdr)
	s.log.Warn("rejected", "subject", m.Subject, "msg_id", msgID, "reason", reason)
	r := api.Rejection{Subject: m.Subject, MsgID: msgID, Reason: reason.Error(), Payload: rejectionPayload(m.Data)}
	ev, err := codec.NewEvent(api.TypeRejected, "sluice/scheduler", msgID, r)
	if err != nil {
		return
	}
	id := ""
	if meta, err := jm.Metadata(); err == nil {
		id = fmt.Sprintf("reject.%s.%d", meta.Stream, meta.Sequence.Stream)
	}
	if rm, err := codec.Encode(ctx, api.SubjectRejected, id, ev); err == nil {
		out.rejections = append(out.rejections, rm)
	}
}
