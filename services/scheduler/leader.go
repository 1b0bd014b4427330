package scheduler

// Leading and standing by. Any number of schedulers may run on one NATS;
// one leads and the others stand by, warm.
//
// The election is a key in the bucket sluice_leader, whose TTL removes it
// unless it is renewed: a scheduler that creates the key leads, renews it
// every third of the TTL by a revision-checked update, and steps down
// before the TTL since its last good renewal is over. The others try to
// create the key four times a second, and keep a copy of the leader's
// state meanwhile (standby.go).
//
// The election decides who should lead; fencing makes sure that no one
// else can. A scheduler that wins begins its term with a barrier: a
// message appended to the journal on the condition that the journal's last
// sequence is the last one it has read (Nats-Expected-Last-Sequence), and
// a record put in the bucket of checkpoints on the same condition. Every
// later journal append and checkpoint write of the leader carries the same
// condition, so once the barrier is in, a deposed leader (frozen, cut off,
// or one that does not know yet) has every write refused by the server,
// and with its journal records it publishes no grant, final DTR or stop.
// The barrier's journal sequence is the term: it only grows, grants and
// stops carry it, and workers drop those of an older term than one they
// have seen.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
)

// leaderKey is the election's key in bus.BucketLeader.
const leaderKey = bus.LeaderKey

// termKey is the key of the checkpoint bucket that each term's barrier
// writes (its value is the term); it is not a DTR.
const termKey = "term"

// errDeposed is the error of a leader that lost its term: its renewal
// was refused or came too late, or the server refused one of its writes
// because another scheduler has begun a term since. The scheduler starts
// over as a standby.
var errDeposed = errors.New("no longer the leader")

// election is this scheduler's part in the election.
type election struct {
	kv  jetstream.KeyValue
	ttl time.Duration
	me  api.Leader
	// rev is the revision of the key while this scheduler holds it;
	// renewed is when the update that last succeeded was sent (Unix
	// ns; the loop and the committer read it, the renewals write it).
	rev     uint64
	renewed atomic.Int64
}

func newElection(kv jetstream.KeyValue, ttl time.Duration, name string) *election {
	if ttl <= 0 {
		ttl = bus.DefaultLeaderTTL
	}
	if name == "" {
		name, _ = os.Hostname()
	}
	return &election{kv: kv, ttl: ttl, me: api.Leader{Name: name, Instance: uuid.NewString()}}
}

// renewEvery is how often the leader renews its key.
func (e *election) renewEvery() time.Duration { return e.ttl / 3 }

// holdsUntil is when the leader must have stepped down if no renewal
// succeeds before: a quarter of the TTL before the key could expire,
// counted from when the last good renewal was sent (the server counts the
// TTL from later than that).
func (e *election) holdsUntil() time.Time {
	return time.Unix(0, e.renewed.Load()).Add(e.ttl - e.ttl/4)
}

// lapsed reports whether the term may have passed to another scheduler
// (holdsUntil is past): nothing more is acted on.
func (e *election) lapsed(now time.Time) bool { return now.After(e.holdsUntil()) }

// campaign tries to create the key; true if this scheduler now holds it.
func (e *election) campaign(ctx context.Context) (bool, error) {
	e.me.Since, e.me.Term = time.Now().UTC(), 0
	v, _ := json.Marshal(e.me)
	sent := time.Now()
	rev, err := e.kv.Create(ctx, leaderKey, v)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("leader election: %w", err)
	}
	e.rev = rev
	e.renewed.Store(sent.UnixNano())
	return true, nil
}

// renew updates the key if it is still this scheduler's; a refusal (the
// key expired and was taken, or deleted) is errDeposed.
func (e *election) renew(ctx context.Context) error {
	v, _ := json.Marshal(e.me)
	sent := time.Now()
	rev, err := e.kv.Update(ctx, leaderKey, v, e.rev)
	if isWrongLast(err) || errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("%w: its key was taken or removed (%v)", errDeposed, err)
	}
	if err != nil {
		return fmt.Errorf("renew the leader key: %w", err)
	}
	e.rev = rev
	e.renewed.Store(sent.UnixNano())
	return nil
}

// resign removes the key if it is still this scheduler's, so that a
// standby takes over at once rather than after the TTL.
func (e *election) resign(ctx context.Context) {
	if e.rev != 0 {
		_ = e.kv.Delete(ctx, leaderKey, jetstream.LastRevision(e.rev))
		e.rev = 0
	}
}

// current reads who leads now; ok is false when no one does.
func (e *election) current(ctx context.Context) (l api.Leader, ok bool, err error) {
	entry, err := e.kv.Get(ctx, leaderKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return l, false, nil
	}
	if err != nil {
		return l, false, err
	}
	if err := json.Unmarshal(entry.Value(), &l); err != nil {
		return l, false, fmt.Errorf("leader key: %w", err)
	}
	return l, true, nil
}

// keepLeading renews the key every renewEvery until ctx ends, and reports
// on deposed (once) when the term is lost: a renewal refused, or none
// succeeded by holdsUntil. It runs apart from the scheduling loop, so that
// a busy loop does not lose the term; a frozen process loses it, and finds
// out as it resumes.
// A renewal that fails or is slow is logged: what came before a term lost.
func (e *election) keepLeading(ctx context.Context, deposed chan<- error, log *slog.Logger) {
	t := time.NewTicker(min(e.renewEvery(), 250*time.Millisecond))
	defer t.Stop()
	next := time.Now() // at once: the campaign may have been a while ago
	var logged time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if now.After(e.holdsUntil()) {
				deposed <- fmt.Errorf("%w: no renewal of the leader key succeeded for %s", errDeposed, now.Sub(time.Unix(0, e.renewed.Load())).Round(time.Millisecond))
				return
			}
			if now.Before(next) {
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, e.ttl/4)
			sent := time.Now()
			err := e.renew(rctx)
			cancel()
			// Logged once a renewal period at most: a failed renewal is
			// tried again at each tick, and a full store keeps failing.
			if took := time.Since(sent); (err != nil || took > e.ttl/6) && now.Sub(logged) >= e.renewEvery() {
				logged = now
				log.Warn("renewing the leader key: slow or failed", "took", took.Round(time.Millisecond), "err", err,
					"holds_until", e.holdsUntil().Format(time.RFC3339Nano))
			}
			if errors.Is(err, errDeposed) {
				deposed <- err
				return
			}
			if bus.StoreFull(err) {
				// No one can take over while the store refuses writes
				// (a standby's key and barrier are writes too), and a
				// barrier written once space returns fences this
				// leader's writes: it holds on, and does not step down
				// with a full store.
				e.renewed.Store(sent.UnixNano())
			}
			if err == nil {
				next = now.Add(e.renewEvery())
			}
		}
	}
}

// isWrongLast reports whether err is the server's refusal of a write whose
// expected last sequence was not the stream's (10071, or 10164 from a
// replicated stream, which does not say the actual one).
func isWrongLast(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// errCodeWrongLastMsgID is JetStream's error code for a write whose
// expected last message id was not the stream's.
const errCodeWrongLastMsgID jetstream.ErrorCode = 10070

// wrongLastMsgID reads the id of the stream's actual last message from a
// refusal of a write whose expected last message id was not the
// stream's; ok is false for any other error.
func wrongLastMsgID(err error) (actual string, ok bool) {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeWrongLastMsgID {
		return "", false
	}
	_, actual, ok = strings.Cut(apiErr.Description, "wrong last msg ID: ")
	return strings.TrimSpace(actual), ok
}

// wrongLastSequence reads the stream's actual last sequence from a refusal
// of a write whose expected last sequence was not the stream's; ok is
// false for any other error.
func wrongLastSequence(err error) (actual uint64, ok bool) {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		return 0, false
	}
	// "wrong last sequence: 123"
	i := strings.LastIndexByte(apiErr.Description, ' ')
	n, perr := strconv.ParseUint(strings.TrimSpace(apiErr.Description[i+1:]), 10, 64)
	return n, perr == nil
}

// conditional sets the header that makes the server store m only if the
// stream's last sequence is last.
func conditional(m *nats.Msg, last uint64) *nats.Msg {
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	m.Header.Set(jetstream.ExpectedLastSeqHeader, strconv.FormatUint(last, 10))
	return m
}

// barrierSize is the length of what varies in a checkpoint barrier (its
// expected last sequence, message id and term, at most 20, 29 and 20
// bytes) and of the padding (headerPad) that makes it up.
const barrierSize = 80

// headerPad pads a checkpoint barrier to barrierSize.
const headerPad = "Sluice-Pad"

// headerTermOf names, in a journal barrier, the scheduler that wrote it
// (its name and instance).
const headerTermOf = "Sluice-Term-Of"

// beginTerm writes the barriers of a term won: to the journal, on the
// condition that its last sequence is the one the standby has read up to
// (behind is true, and nothing is written, if the journal has more), then
// to the checkpoint bucket, on the condition that nothing was put there
// since its last sequence was read. It returns the term (the barrier's
// journal sequence) and the message id of the bucket's barrier, which the
// leader's first checkpoint record names as the one before it.
func beginTerm(ctx context.Context, js jetstream.JetStream, readUpTo uint64, who string) (term uint64, bucketBarrier string, behind bool, err error) {
	m := conditional(nats.NewMsg(bus.SubjectJournal), readUpTo)
	m.Header.Set(headerTermOf, who)
	ack, err := js.PublishMsg(ctx, m)
	switch {
	case err == nil:
		term = ack.Sequence
	case ownBarrier(ctx, js, readUpTo, who, err):
		// Stored, but its answer was lost: nats.go sent it again (after
		// no responders) and the server refused the copy as out of
		// sequence, or the answer came too late.
		term = readUpTo + 1
	case isWrongLast(err):
		return 0, "", true, nil
	default:
		return 0, "", false, fmt.Errorf("journal barrier: %w", err)
	}
	st, err := js.Stream(ctx, "KV_"+bus.BucketDTRs)
	if err != nil {
		return 0, "", false, fmt.Errorf("checkpoint barrier: %w", err)
	}
	for try := 0; ; try++ {
		info, err := st.Info(ctx)
		if err != nil {
			return 0, "", false, fmt.Errorf("checkpoint barrier: %w", err)
		}
		b := conditional(nats.NewMsg("$KV."+bus.BucketDTRs+"."+termKey), info.State.LastSeq)
		b.Data = strconv.AppendUint(nil, term, 10)
		id := "term-" + strconv.FormatUint(term, 10) + "-" + strconv.Itoa(try)
		b.Header.Set(jetstream.MsgIDHeader, id)
		// Every barrier the same size: in a bucket over its limit (set
		// below what it holds) the server still takes a message that
		// replaces one no smaller under its key, so a term can begin on
		// a full bucket once one has.
		b.Header.Set(headerPad, strings.Repeat(".", barrierSize-len(b.Header.Get(jetstream.ExpectedLastSeqHeader))-len(id)-len(b.Data)))
		_, err = js.PublishMsg(ctx, b)
		if isWrongLast(err) && try < 100 {
			continue // a deposed leader's checkpoint came in between
		}
		if err != nil {
			return 0, "", false, fmt.Errorf("checkpoint barrier: %w", err)
		}
		return term, id, false, nil
	}
}

// ownBarrier reports whether the journal's last message is a barrier that
// this scheduler (who) wrote on the condition that the journal's last
// sequence was readUpTo, although its publish failed with err. Only one
// message can be stored on that condition, at readUpTo+1, so one there
// naming this scheduler is its own, whichever of its publishes stored it;
// and with nothing after it, no one has written since this scheduler read
// the journal.
func ownBarrier(ctx context.Context, js jetstream.JetStream, readUpTo uint64, who string, err error) bool {
	if actual, ok := wrongLastSequence(err); ok && actual != readUpTo+1 {
		return false // the journal has no message, or more than one, after readUpTo
	}
	// A publish that timed out leaves ctx spent: the look takes a moment
	// of its own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	st, serr := js.Stream(ctx, bus.StreamJournal)
	if serr != nil || st.CachedInfo().State.LastSeq != readUpTo+1 {
		return false
	}
	m, gerr := st.GetMsg(ctx, readUpTo+1)
	return gerr == nil && m.Header.Get(headerTermOf) == who
}
