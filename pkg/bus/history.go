package bus

// The stream of every DTR's history (services/scheduler/history.go): one
// message per event on the DTR's own subject, the last HistoryPerDTR of
// each kept, the oldest dropped when the stream is full.

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

const (
	// StreamHistory holds the DTRs' histories; only the scheduler writes
	// and reads it.
	StreamHistory = "SLUICE_HISTORY"
	// SubjectHistoryPrefix, followed by a DTR's id, is the subject of its
	// history's events.
	SubjectHistoryPrefix = "sluice.history."
	// HistoryPerDTR is how many events of one DTR's history are kept: the
	// last ones.
	HistoryPerDTR = 64
)

// HistorySubject is the subject of a DTR's history events.
func HistorySubject(dtrID string) string { return SubjectHistoryPrefix + dtrID }

// historyStream is how StreamHistory is set up: a limits stream that drops
// its oldest events when full (a full history never stops scheduling),
// keeps the last HistoryPerDTR events of each DTR, and lets each event
// carry a time to live (the retention of final DTRs) where records expire.
func historyStream(s Setup) jetstream.StreamConfig {
	maxBytes := s.Limits.History
	if maxBytes <= 0 {
		maxBytes = -1
	}
	return jetstream.StreamConfig{
		Name: StreamHistory, Subjects: []string{SubjectHistoryPrefix + "*"},
		Retention: jetstream.LimitsPolicy, Storage: jetstream.FileStorage, Replicas: s.Replicas,
		MaxMsgsPerSubject: HistoryPerDTR, MaxBytes: maxBytes, Discard: jetstream.DiscardOld,
		Duplicates: 2 * time.Minute, AllowMsgTTL: s.ExpiringRecords, AllowDirect: true,
		Description: "every DTR's state changes and what held it, the last 64 of each",
	}
}

// ensureHistoryStream creates StreamHistory or gives it the settings
// wanted. Once allowed, events with a time to live stay allowed.
func ensureHistoryStream(ctx context.Context, js jetstream.JetStream, s Setup) error {
	want := historyStream(s)
	if st, err := js.Stream(ctx, StreamHistory); err == nil {
		have := st.CachedInfo().Config
		want.AllowMsgTTL = want.AllowMsgTTL || have.AllowMsgTTL
		if have.MaxBytes == want.MaxBytes && have.Replicas == want.Replicas && have.MaxMsgsPerSubject == want.MaxMsgsPerSubject &&
			have.AllowMsgTTL == want.AllowMsgTTL && have.Discard == want.Discard && have.AllowDirect == want.AllowDirect {
			return nil
		}
	}
	if _, err := js.CreateOrUpdateStream(ctx, want); err != nil {
		return fmt.Errorf("stream %s: %w", StreamHistory, reserveHint(err))
	}
	return nil
}
