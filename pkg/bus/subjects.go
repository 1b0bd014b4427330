// Package bus is Sluice's stream topology: its NATS streams, consumers and
// key-value buckets with their limits, created idempotently in one place;
// waiting until they exist, publishing in batches, following a full store,
// and an embedded server. The messages and their subjects are in pkg/api,
// their encoding in pkg/bus/codec, trace propagation in pkg/bus/tracing.
package bus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// SubjectJournal is where the scheduler appends changed DTR records
// (stream SLUICE_JOURNAL; not CloudEvents but lines of DTR JSON, read
// only by the scheduler). The other subjects are in pkg/api.
const SubjectJournal = "sluice.journal"

// Streams, consumers and buckets.
const (
	StreamSubmit  = "SLUICE_SUBMIT"
	StreamGrants  = "SLUICE_GRANTS"
	StreamResults = "SLUICE_RESULTS"
	StreamEvents  = "SLUICE_EVENTS"
	// StreamRejections keeps the rejection events (SubjectRejected).
	StreamRejections = "SLUICE_REJECTIONS"
	// StreamJournal is the scheduler's journal of changed DTR records
	// (services/scheduler/journal.go); only the scheduler uses it.
	StreamJournal = "SLUICE_JOURNAL"
	ConsumerSched = "scheduler"
	ConsumerGen   = "generator"
	BucketDTRs    = "sluice_dtrs"
	BucketJobs    = "sluice_jobs"
	// BucketLeader holds the key of the scheduler that leads (its
	// election, services/scheduler/leader.go); its TTL removes the key of
	// a leader that stops renewing it.
	BucketLeader = "sluice_leader"
	// LeaderKey is the election's key in BucketLeader: its value is the
	// api.Leader that holds it.
	LeaderKey = "scheduler"
	// IndexKey is the key in BucketDTRs of the leader's restart index
	// (services/scheduler/restoreindex.go): not a DTR.
	IndexKey = "index"
	// BucketSubjectTokens holds the bearer tokens that DTRs were submitted
	// with, each sealed with a random reference that the DTR carries (its
	// token_ref; subjecttokens.go), so that the workers of its transfers can exchange the
	// token for storage tokens with the submitter's rights. Only the
	// scheduler writes it and only processors and deliverers read it; the
	// tokens are in no DTR record, event, log or trace. Each entry lives
	// until its token expires, and at most Setup.SubjectTokenTTL (a
	// per-message TTL); the bucket holds at most Limits.SubjectTokens
	// bytes.
	BucketSubjectTokens = "sluice_subject_tokens"
	MaxMessageBytes     = 1 << 20
)

// MaxDTRBytes is the size of the largest DTR (the body of its dtr.submit
// message) that Sluice takes on a NATS server whose max_payload is
// maxPayload: MaxMessageBytes (SLUICE_SUBMIT's limit), and at most an
// eighth of max_payload, so that every message that carries the DTR later,
// its grants, its stored record and its final event, fits with room for
// what is added on the way (error texts quoting its URLs among them). A
// larger DTR would be taken by the stream and then stop the scheduler,
// which could not publish its grant. On a server with the 8MB of the
// embedded server and the compose file it is MaxMessageBytes; with NATS's
// default of 1MB, 128 KiB.
func MaxDTRBytes(maxPayload int64) int {
	if maxPayload <= 0 {
		return MaxMessageBytes // not connected yet: the stream's limit
	}
	return int(min(MaxMessageBytes, maxPayload/8))
}

// Setup is how streams are created; Replicas is 1 on a single server.
type Setup struct {
	Replicas int
	// AckWait is how long a consumer's message stays unacknowledged before
	// JetStream delivers it again: a grant message whose taker died before
	// acknowledging it (workers acknowledge a grant message before running
	// any of its grants), or a scheduler or generator input not yet done.
	AckWait time.Duration
	// ExpiringRecords lets the records of the sluice_dtrs bucket carry a
	// time to live (JetStream's per-message TTL, NATS 2.11 and later): the
	// scheduler's retention of final DTRs.
	ExpiringRecords bool
	// Limits are the most bytes each stream and bucket may hold.
	Limits Limits
	// LeaderTTL is how long the scheduler's leader key lives without a
	// renewal (the TTL of BucketLeader); 0: DefaultLeaderTTL.
	LeaderTTL time.Duration
	// SubjectTokenTTL is how long a submitter's token is kept in
	// BucketSubjectTokens; 0: DefaultSubjectTokenTTL.
	SubjectTokenTTL time.Duration
}

// DefaultSubjectTokenTTL is how long submitters' tokens are kept by
// default: longer than WLCG access tokens live (at most a few hours),
// after which they could not be exchanged anyway.
const DefaultSubjectTokenTTL = 24 * time.Hour

// withDefaults fills in what is not set.
func (s Setup) withDefaults() Setup {
	if s.Replicas <= 0 {
		s.Replicas = 1
	}
	if s.AckWait <= 0 {
		s.AckWait = 30 * time.Second
	}
	return s
}

// DefaultLeaderTTL is the TTL of the scheduler's leader key by default.
const DefaultLeaderTTL = 3 * time.Second

// Limits are the most bytes each stream and bucket may hold; 0 is no
// limit. A full work-queue stream (SLUICE_SUBMIT, SLUICE_GRANTS,
// SLUICE_RESULTS), the journal and the buckets refuse new messages
// (DiscardNew) and keep what they hold; SLUICE_EVENTS, whose messages
// stay until they are 7 days old whether read or not, drops its oldest
// (DiscardOld), which the generator took long before. The server reserves
// each limit in its store (max_file_store): together they must fit in it.
type Limits struct {
	Submit, Grants, Results, Events, Journal int64
	Rejections, DTRs, Jobs                   int64
	SubjectTokens                            int64
	// History is StreamHistory's (history.go): full, it drops its oldest
	// events.
	History int64
}

// ensureMu keeps the schedulers of one process from setting up at once.
var ensureMu sync.Mutex

// Ensure creates or updates every stream, consumer and bucket Sluice uses.
// The scheduler calls it at start, and only the scheduler needs the rights
// to; the other roles Await what they use. What exists with the settings
// wanted is left alone, so a restart changes nothing.
func Ensure(ctx context.Context, js jetstream.JetStream, s Setup) error {
	ensureMu.Lock()
	defer ensureMu.Unlock()
	s = s.withDefaults()
	l := s.Limits
	if err := l.Check(); err != nil {
		return err
	}
	streams := []jetstream.StreamConfig{
		{Name: StreamSubmit, Subjects: []string{api.SubjectSubmit, api.SubjectSubmit + ".*", api.SubjectCancelCommand},
			Retention: jetstream.WorkQueuePolicy, MaxMsgSize: MaxMessageBytes, Duplicates: 2 * time.Minute,
			MaxBytes: l.Submit, Discard: jetstream.DiscardNew},
		{Name: StreamGrants, Subjects: []string{api.SubjectGrantPrefix + ">"},
			Retention: jetstream.WorkQueuePolicy, Duplicates: 2 * time.Minute,
			MaxBytes: l.Grants, Discard: jetstream.DiscardNew},
		{Name: StreamResults, Subjects: []string{api.SubjectResultPrefix + ">", api.SubjectProgressPrefix + ">"},
			Retention: jetstream.WorkQueuePolicy, Duplicates: 2 * time.Minute,
			MaxBytes: l.Results, Discard: jetstream.DiscardNew},
		// Rejections were in SLUICE_EVENTS once: it is updated before
		// SLUICE_REJECTIONS takes their subject.
		{Name: StreamEvents, Subjects: []string{api.SubjectDTRFinal, "sluice.event.job.>"},
			Retention: jetstream.LimitsPolicy, MaxAge: 7 * 24 * time.Hour, Duplicates: 2 * time.Minute,
			MaxBytes: l.Events, Discard: jetstream.DiscardOld},
		{Name: StreamRejections, Subjects: []string{api.SubjectRejected},
			Retention: jetstream.LimitsPolicy, MaxAge: 7 * 24 * time.Hour, Duplicates: 2 * time.Minute,
			MaxBytes: l.Rejections, Discard: jetstream.DiscardOld},
		// The scheduler purges what it has checkpointed; full, it
		// refuses new records and keeps the ones not yet checkpointed.
		{Name: StreamJournal, Subjects: []string{SubjectJournal},
			Retention: jetstream.LimitsPolicy, Duplicates: 2 * time.Minute,
			MaxBytes: l.Journal, Discard: jetstream.DiscardNew},
	}
	for _, cfg := range streams {
		cfg.Storage = jetstream.FileStorage
		cfg.Replicas = s.Replicas
		if cfg.MaxBytes <= 0 {
			cfg.MaxBytes = -1 // no limit, as the server says it
		}
		if st, err := js.Stream(ctx, cfg.Name); err == nil && sameStream(st.CachedInfo().Config, cfg) {
			continue
		}
		if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("stream %s: %w", cfg.Name, reserveHint(err))
		}
	}
	for _, c := range consumerConfigs(s) {
		if cons, err := js.Consumer(ctx, c.stream, c.cfg.Durable); err == nil && sameConsumer(cons.CachedInfo().Config, c.cfg) {
			continue
		}
		if _, err := js.CreateOrUpdateConsumer(ctx, c.stream, c.cfg); err != nil {
			return fmt.Errorf("consumer %s on %s: %w", c.cfg.Durable, c.stream, err)
		}
	}
	for _, b := range []struct {
		name     string
		maxBytes int64
	}{{BucketDTRs, l.DTRs}, {BucketJobs, l.Jobs}} {
		maxBytes := b.maxBytes
		if maxBytes <= 0 {
			maxBytes = -1
		}
		if _, err := js.KeyValue(ctx, b.name); err == nil {
			// There already: only its copies and its limit follow the
			// settings (a deployment moved to a cluster keeps its
			// records).
			st, err := js.Stream(ctx, "KV_"+b.name)
			if err != nil {
				return fmt.Errorf("bucket %s: %w", b.name, err)
			}
			if cfg := st.CachedInfo().Config; cfg.Replicas != s.Replicas || cfg.MaxBytes != maxBytes {
				cfg.Replicas, cfg.MaxBytes = s.Replicas, maxBytes
				if _, err := js.UpdateStream(ctx, cfg); err != nil {
					return fmt.Errorf("bucket %s: %d copies, at most %d bytes: %w", b.name, cfg.Replicas, cfg.MaxBytes, reserveHint(err))
				}
			}
			continue
		}
		// Created, not updated: a scheduler starting at the same time may
		// have created it and allowed entries with their own TTL, which an
		// update without them would be refused for (10052).
		if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: b.name, Storage: jetstream.FileStorage, Replicas: s.Replicas, History: 1, MaxBytes: maxBytes,
		}); err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
			return fmt.Errorf("bucket %s: %w", b.name, reserveHint(err))
		}
	}
	if err := ensureLeaderBucket(ctx, js, s); err != nil {
		return err
	}
	if err := ensureSubjectTokenBucket(ctx, js, s); err != nil {
		return err
	}
	if err := ensureHistoryStream(ctx, js, s); err != nil {
		return err
	}
	if s.ExpiringRecords {
		// Allowed on a bucket made before; never turned off again, since
		// records stored with a TTL may remain.
		st, err := js.Stream(ctx, "KV_"+BucketDTRs)
		if err != nil {
			return fmt.Errorf("bucket %s: %w", BucketDTRs, err)
		}
		if cfg := st.CachedInfo().Config; !cfg.AllowMsgTTL {
			cfg.AllowMsgTTL = true
			if _, err := js.UpdateStream(ctx, cfg); err != nil {
				return fmt.Errorf("bucket %s: allow records with a time to live (NATS 2.11 or later): %w", BucketDTRs, err)
			}
		}
	}
	return nil
}

// consumerSpec is a durable consumer and its stream.
type consumerSpec struct {
	stream string
	cfg    jetstream.ConsumerConfig
}

// consumerConfigs are the durable consumers Ensure makes.
func consumerConfigs(s Setup) []consumerSpec {
	consumers := []consumerSpec{
		{StreamSubmit, jetstream.ConsumerConfig{Durable: ConsumerSched, MaxAckPending: 20000}},
		{StreamResults, jetstream.ConsumerConfig{Durable: ConsumerSched, MaxAckPending: 20000}},
		{StreamEvents, jetstream.ConsumerConfig{Durable: ConsumerGen, FilterSubject: api.SubjectDTRFinal, MaxAckPending: 20000}},
	}
	for _, st := range dtr.Stages {
		consumers = append(consumers, consumerSpec{StreamGrants, jetstream.ConsumerConfig{Durable: string(st), FilterSubject: api.GrantSubject(st), MaxAckPending: 10000}})
	}
	for i := range consumers {
		c := &consumers[i].cfg
		c.AckPolicy = jetstream.AckExplicitPolicy
		c.AckWait = s.AckWait
		c.Replicas = s.Replicas
	}
	return consumers
}

// ResetConsumer deletes a durable consumer that Ensure makes and creates
// it again: what it had delivered to a taker that never acknowledged it
// (a scheduler that died or was deposed) is delivered again at once, not
// after AckWait. Messages stay in their work-queue stream until
// acknowledged, so nothing is lost.
func ResetConsumer(ctx context.Context, js jetstream.JetStream, stream, durable string, s Setup) error {
	s = s.withDefaults()
	for _, c := range consumerConfigs(s) {
		if c.stream != stream || c.cfg.Durable != durable {
			continue
		}
		if err := js.DeleteConsumer(ctx, stream, durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("reset consumer %s on %s: %w", durable, stream, err)
		}
		if _, err := js.CreateOrUpdateConsumer(ctx, stream, c.cfg); err != nil {
			return fmt.Errorf("reset consumer %s on %s: %w", durable, stream, err)
		}
		return nil
	}
	return fmt.Errorf("reset consumer %s on %s: not one of Sluice's", durable, stream)
}

// ensureLeaderBucket creates the leader bucket, or gives it the TTL and
// copies wanted.
func ensureLeaderBucket(ctx context.Context, js jetstream.JetStream, s Setup) error {
	ttl := s.LeaderTTL
	if ttl <= 0 {
		ttl = DefaultLeaderTTL
	}
	if st, err := js.Stream(ctx, "KV_"+BucketLeader); err == nil {
		cfg := st.CachedInfo().Config
		if cfg.MaxAge == ttl && cfg.Replicas == s.Replicas {
			return nil
		}
		cfg.MaxAge, cfg.Replicas = ttl, s.Replicas
		if cfg.Duplicates > ttl {
			cfg.Duplicates = ttl
		}
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("bucket %s: TTL %s, %d copies: %w", BucketLeader, ttl, s.Replicas, err)
		}
		return nil
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: BucketLeader, Storage: jetstream.FileStorage, Replicas: s.Replicas, History: 1, TTL: ttl,
		Description: "the scheduler that leads: its key lives for the TTL unless renewed",
	}); err != nil {
		return fmt.Errorf("bucket %s: %w", BucketLeader, reserveHint(err))
	}
	return nil
}

// ensureSubjectTokenBucket creates the bucket of submitters' tokens, or
// gives it the TTL, limit and copies wanted. Its entries may carry their
// own, shorter, time to live (JetStream's per-message TTL): their token's
// expiry.
func ensureSubjectTokenBucket(ctx context.Context, js jetstream.JetStream, s Setup) error {
	ttl := s.SubjectTokenTTL
	if ttl <= 0 {
		ttl = DefaultSubjectTokenTTL
	}
	maxBytes := s.Limits.SubjectTokens
	if maxBytes <= 0 {
		maxBytes = -1 // no limit, as the server says it
	}
	if _, err := js.Stream(ctx, "KV_"+BucketSubjectTokens); err != nil {
		// Created, not updated (as above): another scheduler may have
		// made it and allowed entries with their own TTL meanwhile.
		if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: BucketSubjectTokens, Storage: jetstream.FileStorage, Replicas: s.Replicas, History: 1, TTL: ttl,
			MaxBytes:     maxBytes,
			MaxValueSize: 64 << 10, // a bearer token; the verifier takes none larger
			Description:  "submitters' bearer tokens under random references, for the exchange of storage tokens",
		}); err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
			return fmt.Errorf("bucket %s: %w", BucketSubjectTokens, reserveHint(err))
		}
	}
	st, err := js.Stream(ctx, "KV_"+BucketSubjectTokens)
	if err != nil {
		return fmt.Errorf("bucket %s: %w", BucketSubjectTokens, err)
	}
	cfg := st.CachedInfo().Config
	if cfg.MaxAge == ttl && cfg.Replicas == s.Replicas && cfg.MaxBytes == maxBytes && cfg.AllowMsgTTL {
		return nil
	}
	cfg.MaxAge, cfg.Replicas, cfg.MaxBytes, cfg.AllowMsgTTL = ttl, s.Replicas, maxBytes, true
	if cfg.Duplicates > ttl {
		cfg.Duplicates = ttl
	}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("bucket %s: TTL %s, %d copies, at most %d bytes, entries with their own TTL (NATS 2.11 or later): %w",
			BucketSubjectTokens, ttl, s.Replicas, maxBytes, reserveHint(err))
	}
	return nil
}

// MinLimit is the smallest limit a stream or bucket may have: a message
// larger than its stream's limit would be refused for ever, and Sluice's
// messages reach half of the server's max_payload (8 MB in the embedded
// server and compose).
const MinLimit = 8 << 20

// Check says whether every limit is 0 or at least MinLimit.
func (l Limits) Check() error {
	for _, v := range []struct {
		name  string
		bytes int64
	}{{"SLUICE_SUBMIT_MAX_BYTES", l.Submit}, {"SLUICE_GRANTS_MAX_BYTES", l.Grants}, {"SLUICE_RESULTS_MAX_BYTES", l.Results},
		{"SLUICE_EVENTS_MAX_BYTES", l.Events}, {"SLUICE_REJECTIONS_MAX_BYTES", l.Rejections}, {"SLUICE_JOURNAL_MAX_BYTES", l.Journal}, {"SLUICE_DTRS_MAX_BYTES", l.DTRs},
		{"SLUICE_JOBS_MAX_BYTES", l.Jobs}, {"SLUICE_SUBJECT_TOKENS_MAX_BYTES", l.SubjectTokens}, {"SLUICE_HISTORY_MAX_BYTES", l.History}} {
		if v.bytes != 0 && v.bytes < MinLimit {
			return fmt.Errorf("%s is %d bytes: 0 (no limit) or at least %d (8 MiB), so that any message fits", v.name, v.bytes, MinLimit)
		}
	}
	return nil
}

// reserveHint explains a limit the server cannot reserve in its store.
func reserveHint(err error) error {
	var api *jetstream.APIError
	if errors.As(err, &api) && (api.ErrorCode == JSErrCodeStorageResourcesExceeded || api.ErrorCode == JSErrCodeMemoryResourcesExceeded) {
		return fmt.Errorf("%w: the limits of Sluice's streams and buckets (SLUICE_*_MAX_BYTES) add up to more than the NATS server's JetStream store (max_file_store) can reserve; lower them, or give the server more", err)
	}
	return err
}

func sameStream(have, want jetstream.StreamConfig) bool {
	if want.MaxMsgSize == 0 {
		want.MaxMsgSize = -1 // how the server reports "no limit"
	}
	return slices.Equal(have.Subjects, want.Subjects) && have.Retention == want.Retention &&
		have.MaxMsgSize == want.MaxMsgSize && have.Duplicates == want.Duplicates &&
		have.MaxAge == want.MaxAge && have.Storage == want.Storage && have.Replicas == want.Replicas &&
		have.MaxBytes == want.MaxBytes && have.Discard == want.Discard
}

func sameConsumer(have, want jetstream.ConsumerConfig) bool {
	return have.AckPolicy == want.AckPolicy && have.AckWait == want.AckWait &&
		have.MaxAckPending == want.MaxAckPending && have.FilterSubject == want.FilterSubject &&
		have.Replicas == want.Replicas
}
