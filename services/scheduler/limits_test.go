package scheduler

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestAStreamLimitSmallerThanAMessageStopsTheSchedulerAtStart(t *testing.T) {
	cfg := Config{StoreLimits: StoreLimits{JournalMaxBytes: 1 << 20}}
	_, err := New(cfg, nil, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "SLUICE_JOURNAL_MAX_BYTES") {
		t.Fatalf("New with a 1 MiB journal: %v", err)
	}
}

func TestAConfigBuiltInCodeTakesTheTagsDefaults(t *testing.T) {
	if d, err := time.ParseDuration(tagDefault("Tick")); err != nil || d <= 0 {
		t.Fatalf("Tick's default %q: %v", tagDefault("Tick"), err)
	}
}
