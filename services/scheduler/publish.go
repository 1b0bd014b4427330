package scheduler

// What a step publishes besides its journal records: grants, final DTRs and
// state notices, as CloudEvents.

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/bus/tracing"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// maxFinalsPerMessage bounds the DTRs of one Finals event.
const maxFinalsPerMessage = 100

// finalEntry is a final DTR ready to be announced: its JSON and the span
// that announces it.
type finalEntry struct {
	id          uuid.UUID
	traceparent string
	data        []byte
}

// finalEntries makes the entries of final DTRs (their JSON as encoded, if
// it is there), each with a span that announces it, and remembers them
// as finished; count says they end now (and count in the figures), not
// that they are announced again.
func (s *Service) finalEntries(ctx context.Context, now time.Time, ds []*dtr.DTR, encoded map[uuid.UUID][]byte, count bool) ([]finalEntry, error) {
	entries := make([]finalEntry, 0, len(ds))
	for _, d := range ds {
		s.finished.Add(d.ID, now)
		if count {
			s.mon.final(now, d)
			s.rates.observe(d)
			if d.TokenRef != "" && s.keeper != nil {
				s.keeper.release(ctx, d.TokenRef)
			}
		}
		b, ok := encoded[d.ID]
		if !ok {
			var err error
			if b, err = codec.EncodeJSON(d); err != nil {
				return nil, fmt.Errorf("encode DTR %s: %w", d.ID, err)
			}
		}
		fctx, span := tracing.StartProducer(tracing.Context(ctx, d.TraceParent), api.SubjectDTRFinal, d.ID.String()+".final")
		if span.IsRecording() {
			tracing.SetDTR(span, d, "")
			var failure *dtr.Failure
			if d.State == dtr.Error {
				failure = d.Error // one done after a retry keeps its last failure
			}
			tracing.SetResult(span, d.Bytes, failure)
		}
		tp := tracing.TraceParent(fctx)
		span.End()
		if s.log.Enabled(ctx, slog.LevelInfo) { // its arguments cost even when not logged
			s.log.Info("dtr final", "dtr", d.ID, "job", d.JobID, "state", d.State, "attempts", d.Attempts,
				"trace_id", span.SpanContext().TraceID())
		}
		entries = append(entries, finalEntry{id: d.ID, traceparent: tp, data: b})
	}
	return entries, nil
}

// finalsMessages groups final DTRs into Finals events of up to
// maxFinalsPerMessage DTRs and maxBytes, in order, each message carrying
// the trace of its first DTR. A message's id is a digest of its DTRs'
// ids: announced again after a crash, the same DTRs are stored once, and
// other groupings of them are taken (the generator takes each DTR once).
func finalsMessages(ctx context.Context, entries []finalEntry, maxBytes int) ([]*nats.Msg, error) {
	var msgs []*nats.Msg
	var data []byte // the Finals event's data, written here: each DTR's JSON is ready
	first := ""
	n := 0
	digest := sha256.New()
	flush := func() error {
		if n == 0 {
			return nil
		}
		ev, err := codec.NewEvent(api.TypeDTRFinals, "sluice/scheduler", "", append(data, "]}"...))
		if err != nil {
			return err
		}
		m, err := codec.Encode(tracing.Context(ctx, first), api.SubjectDTRFinal, fmt.Sprintf("finals.%x", digest.Sum(nil)[:16]), ev)
		if err != nil {
			return err
		}
		msgs = append(msgs, m)
		data, n = nil, 0
		digest.Reset()
		return nil
	}
	for _, e := range entries {
		if n == maxFinalsPerMessage || n > 0 && len(data)+len(e.data)+len(e.traceparent)+40 > maxBytes {
			if err := flush(); err != nil {
				return nil, err
			}
		}
		if n == 0 {
			first = e.traceparent
			data = append(data, `{"dtrs":[`...)
		} else {
			data = append(data, ',')
		}
		data = append(data, `{"traceparent":`...)
		data = strconv.AppendQuote(data, e.traceparent)
		data = append(data, `,"dtr":`...)
		data = append(data, e.data...)
		data = append(data, '}')
		digest.Write(e.id[:])
		n++
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return msgs, nil
}

// maxGrantsPerMessage bounds the grants of one Grants event.
const maxGrantsPerMessage = 32

// grants encodes a step's grants as Grants events, one stage's per event.
// A stage's grants are spread over as many events as it has worker
// processes heard from (so that they go to several of them, each taking
// messages for its free workers: a message's grants all run where it is
// taken), or over four while none has been heard from, or one per grant
// if fewer, and over more when maxGrantsPerMessage requires: with one
// worker process a stage's grants of a step go out in one event, taken
// with one pull and one acknowledgement. No event is larger than half of
// the server's max_payload. Each grant carries the span that sent it.
func (s *Service) grants(ctx context.Context, gs []core.Grant, encoded map[uuid.UUID][]byte) ([]*nats.Msg, error) {
	byStage := map[dtr.Stage][]encodedGrant{}
	for _, g := range gs {
		gctx, span := tracing.StartProducer(tracing.Context(ctx, g.DTR.TraceParent), api.GrantSubject(g.Stage), g.ID)
		tracing.SetDTR(span, g.DTR, g.Stage)
		// The DTR as its record was just encoded (a granted DTR is always
		// among the changed ones), not encoded again.
		d, ok := encoded[g.DTR.ID]
		if !ok {
			var err error
			if d, err = codec.EncodeJSON(g.DTR); err != nil {
				span.End()
				return nil, fmt.Errorf("encode grant %s: %w", g.ID, err)
			}
		}
		// The grant without its DTR, and then the DTR's JSON appended.
		data := g
		data.DTR, data.TraceParent, data.Term = nil, tracing.TraceParent(gctx), s.term.Load()
		if g.Stage == dtr.StageDelivery {
			data.ExpectedSeconds = s.rates.expected(g.DTR, s.cfg.StorageTokens.FloorRate).Seconds()
		}
		span.End()
		b, err := codec.EncodeJSON(data)
		if err != nil {
			return nil, fmt.Errorf("encode grant %s: %w", g.ID, err)
		}
		b = api.AppendDTR(b, d)
		byStage[g.Stage] = append(byStage[g.Stage], encodedGrant{g.ID, b})
	}
	maxBytes := int(s.nc.MaxPayload()) / 2
	var msgs []*nats.Msg
	now := time.Now()
	for _, stage := range dtr.Stages {
		enc := byStage[stage]
		if len(enc) == 0 {
			continue
		}
		// One worker process takes one message; with several (or none
		// heard from yet) at least four, so that a busy process holds
		// back few grants that another could run.
		spread := s.workers.pools(stage, now)
		if spread != 1 {
			spread = max(spread, 4)
		}
		per := max((len(enc)+maxGrantsPerMessage-1)/maxGrantsPerMessage, min(len(enc), spread))
		size := (len(enc) + per - 1) / max(per, 1)
		for len(enc) > 0 {
			n, bytes := 0, 0
			for n < len(enc) && n < size && (n == 0 || bytes+len(enc[n].data) < maxBytes) {
				bytes += len(enc[n].data) + 1
				n++
			}
			m, err := grantsMessage(ctx, stage, enc[:n])
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, m)
			enc = enc[n:]
		}
	}
	return msgs, nil
}

type encodedGrant struct {
	id   string
	data []byte
}

// grantsMessage makes one Grants event of encoded grants. Its message id
// is the first grant's id: a grant is sent in one message only.
func grantsMessage(ctx context.Context, stage dtr.Stage, enc []encodedGrant) (*nats.Msg, error) {
	size := len(`{"grants":[]}`)
	for _, g := range enc {
		size += len(g.data) + 1
	}
	data := append(make([]byte, 0, size), `{"grants":[`...)
	for i, g := range enc {
		if i > 0 {
			data = append(data, ',')
		}
		data = append(data, g.data...)
	}
	data = append(data, "]}"...)
	// The data is JSON already: the CloudEvents SDK takes it as it is.
	ev, err := codec.NewEvent(api.TypeGrants, "sluice/scheduler", "", data)
	if err != nil {
		return nil, err
	}
	return codec.Encode(ctx, api.GrantSubject(stage), enc[0].id+".grants", ev)
}

// notice encodes a best-effort event for core NATS; nil if it cannot be.
func notice(ctx context.Context, subject, typ string, data any) *nats.Msg {
	ev, err := codec.NewEvent(typ, "sluice/scheduler", "", data)
	if err != nil {
		return nil
	}
	m, err := codec.Encode(ctx, subject, "", ev)
	if err != nil {
		return nil
	}
	return m
}

// stateNotices makes the state-change notices of commits settled
// together: the changes of consecutive steps, in order, in one event up to
// about maxBytes (a step's changes are never split; a DTR changed in two
// of the steps appears twice, its latest state last). With few slots a
// step changes a DTR or two, and an event for each would cost a message
// for each.
func stateNotices(ctx context.Context, cs []*commit, maxBytes int) []*nats.Msg {
	var msgs []*nats.Msg
	var batch api.StateChanges
	size := 0
	flush := func() {
		if len(batch.Changes) == 0 {
			return
		}
		if m := notice(ctx, api.SubjectDTRState, api.TypeDTRStates, batch); m != nil {
			msgs = append(msgs, m)
		}
		batch.Changes, size = nil, 0
	}
	for _, c := range cs {
		n := 0
		for _, ch := range c.changes {
			// The JSON of a change: its job and share and 120 bytes of the rest.
			n += len(ch.JobID) + len(ch.Share) + 120
		}
		if size > 0 && size+n > maxBytes {
			flush()
		}
		batch.Changes = append(batch.Changes, c.changes...)
		size += n
	}
	flush()
	return msgs
}

// keptFinals is a commit that announces again the final DTRs whose
// records the journal keeps (not yet checkpointed): the leader before may
// have journaled them and died before it announced them. nil if there
// are none. Its DTRs are announced as a step's are, at once (commit.now):
// the journal keeps their messages (journal.Lead) until their Finals
// events are stored. Made before the term's first checkpoint can begin
// (which takes the records out of those KeptFinals returns).
func (s *Service) keptFinals(ctx context.Context, now time.Time) (*commit, error) {
	recs := s.journal.KeptFinals()
	if len(recs) == 0 {
		return nil, nil
	}
	var ds []*dtr.DTR
	encoded := make(map[uuid.UUID][]byte, len(recs))
	for i, d := range decodeRecords(recs, s.log) {
		if d != nil {
			ds = append(ds, d)
			encoded[d.ID] = recs[i]
		}
	}
	if len(ds) == 0 {
		// Unreadable, they can never be announced: the journal need not
		// keep them for that.
		s.journal.Announced(s.journal.ReadUpTo())
		return nil, nil
	}
	entries, err := s.finalEntries(ctx, now, ds, encoded, false)
	if err != nil {
		return nil, err
	}
	return &commit{announce: entries, now: true}, nil
}
