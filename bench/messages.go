package bench

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
)

// MessageCount is how many NATS messages of one kind a DTR took.
type MessageCount struct {
	Kind   string
	PerDTR float64
}

// messageKinds sorts the subjects a run's messages went to into kinds,
// in order: the first whose test matches names the kind.
var messageKinds = []struct {
	kind string
	is   func(subject string) bool
}{
	{"grants", prefix(api.SubjectGrantPrefix)},
	{"results", prefix(api.SubjectResultPrefix)},
	{"history events", prefix(bus.SubjectHistoryPrefix)},
	{"journal records", prefix(bus.SubjectJournal)},
	{"acknowledgements of messages taken", prefix("$JS.ACK.")},
	{"pull requests", prefix("$JS.API.CONSUMER.MSG.NEXT.")},
	{"replies (messages pulled, publish acknowledgements, status)", prefix("_INBOX.")},
	{"progress and lease renewals", prefix(api.SubjectProgressPrefix)},
	{"final DTRs", prefix(api.SubjectDTRFinal)},
	{"state notices", prefix(api.SubjectDTRState)},
}

func prefix(p string) func(string) bool {
	return func(s string) bool { return strings.HasPrefix(s, p) }
}

// MessagesPerDTR moves n 1 KiB files file→file as one job, all roles in
// this process, and counts the NATS messages that went through the server
// meanwhile, by kind, per DTR: every message a client published and every
// one the server sent to a client's inbox (what a consumer's pull takes,
// a publish's acknowledgement, a status). With slots 0 the site's
// defaults (SiteDefaults: ARC's slot counts) are used, else config(slots).
// A subscription to every subject sees them, and costs the server a copy
// of each: the run's speed is not a figure.
func MessagesPerDTR(ctx context.Context, dir string, n, slots int) (total float64, kinds []MessageCount, err error) {
	cfg := config(slots)
	if slots == 0 {
		if cfg, err = SiteDefaults(n); err != nil {
			return 0, nil, err
		}
	}
	s, err := start(ctx, dir, cfg, "", nil, process{roles: app.Roles})
	if err != nil {
		return 0, nil, err
	}
	defer s.stop()
	j, err := files(dir, "m", n, 1024, nil)
	if err != nil {
		return 0, nil, err
	}
	watch, err := nats.Connect(s.ns.ClientURL())
	if err != nil {
		return 0, nil, fmt.Errorf("messages: %w", err)
	}
	defer watch.Close()
	var mu sync.Mutex
	counts := map[string]int{}
	all := 0
	sub, err := watch.Subscribe(">", func(m *nats.Msg) {
		kind := "other"
		for _, k := range messageKinds {
			if k.is(m.Subject) {
				kind = k.kind
				break
			}
		}
		mu.Lock()
		counts[kind]++
		all++
		mu.Unlock()
	})
	if err != nil {
		return 0, nil, fmt.Errorf("messages: %w", err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return 0, nil, fmt.Errorf("messages: %w", err)
	}
	if err := watch.Flush(); err != nil {
		return 0, nil, fmt.Errorf("messages: %w", err)
	}
	ev, err := s.run(ctx, j)
	if err != nil {
		return 0, nil, err
	}
	if ev.Done != n {
		return 0, nil, fmt.Errorf("messages: %d of %d files done", ev.Done, n)
	}
	if err := watch.Flush(); err != nil {
		return 0, nil, fmt.Errorf("messages: %w", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for kind, c := range counts {
		kinds = append(kinds, MessageCount{kind, float64(c) / float64(n)})
	}
	slices.SortFunc(kinds, func(a, b MessageCount) int { return cmp.Compare(b.PerDTR, a.PerDTR) })
	return float64(all) / float64(n), kinds, nil
}

// messagesValue writes a run's messages per DTR: the total, then each kind.
func messagesValue(total float64, kinds []MessageCount) string {
	parts := make([]string, 0, len(kinds))
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %.2f", k.Kind, k.PerDTR))
	}
	return fmt.Sprintf("%.1f (%s)", total, strings.Join(parts, ", "))
}
