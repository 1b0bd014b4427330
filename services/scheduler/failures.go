package scheduler

import (
	"cmp"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// Bounds of the record of recent failures that the web page shows.
const (
	// maxFailures is how many failed DTRs are kept, the latest.
	maxFailures = 1000
	// failuresSpan is how long a failed DTR is kept.
	failuresSpan = 24 * time.Hour
	// maxFailureText is how much of an error's text is kept, in bytes.
	maxFailureText = 300
	// maxFailureGroups and maxGroupDTRs bound what the overview says of
	// them: the groups with the most failures, each with its latest DTRs.
	maxFailureGroups = 30
	maxGroupDTRs     = 10
)

// FailureRecord is a DTR that ended ERROR, as the scheduler remembers it
// after it let go of the DTR: its error's text has no credentials and is
// cut short.
type FailureRecord struct {
	DTR   uuid.UUID     `json:"dtr"`
	JobID string        `json:"job_id,omitempty"`
	Share string        `json:"share,omitempty"`
	Kind  dtr.ErrorKind `json:"kind"`
	// State is where the error was raised.
	State    dtr.State `json:"state,omitempty"`
	Text     string    `json:"text"`
	Attempts int       `json:"attempts,omitempty"`
	Time     time.Time `json:"time"`
	// reason is Text normalised: what groups it with failures of the same
	// cause. It is made when the failures are next grouped, so that a storm
	// of failures costs the normalisation of the latest only.
	reason    string
	reasonSet bool
}

// FailureGroup is the recent failures of one kind and one normalised
// reason.
type FailureGroup struct {
	Kind dtr.ErrorKind `json:"kind"`
	// Reason is the error's text with its URLs, paths, hosts, numbers and
	// ids replaced by placeholders (<url>, <path>, <host>, <n>, <id>).
	Reason string    `json:"reason"`
	Count  int       `json:"count"`
	First  time.Time `json:"first"`
	// Latest is the group's latest failure, an example of it.
	Latest FailureRecord `json:"latest"`
	// DTRs are the group's latest failed DTRs, the latest first.
	DTRs []uuid.UUID `json:"dtrs"`
}

// failureRecord makes the record of d, which ended ERROR at now.
func failureRecord(now time.Time, d *dtr.DTR) FailureRecord {
	r := FailureRecord{DTR: d.ID, JobID: d.JobID, Share: d.Share, Attempts: d.Attempts, Time: now}
	if d.Error != nil {
		r.Kind, r.State, r.Text = d.Error.Kind, d.Error.State, d.Error.Text
	}
	r.Text = shorten(dtr.RedactText(r.Text), maxFailureText)
	return r
}

// shorten cuts s to at most n bytes, on a character boundary, marking the
// cut with "…".
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n-len("…")]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// The parts of an error's text that differ between failures of one cause,
// in the order they are replaced.
var reasonParts = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s"'<>]*[^\s"'<>.,;:)]`), "<url>"},
	{regexp.MustCompile(`(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`), "<id>"},
	{regexp.MustCompile(`\[[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*\](:\d+)?`), "<host>"}, // [::1]:443
	{regexp.MustCompile(`\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b`), "<host>"},
	{regexp.MustCompile(`(^|[\s"'(=])(\.{0,2}/[^\s"'<>:,;)]*)`), "$1<path>"},
	{regexp.MustCompile(`(?i)\b[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*\.[a-z][a-z0-9-]*[a-z0-9](?::\d+)?\b`), "<host>"},
	{regexp.MustCompile(`\blocalhost(:\d+)?\b`), "<host>"},
	{regexp.MustCompile(`(?i)\b(0x)?[0-9a-f]*\d[0-9a-f]*\b`), "<n>"},
	{regexp.MustCompile(`\s+`), " "},
}

// normaliseReason returns an error's text with what differs between
// failures of the same cause (URLs, paths, hosts, addresses, ids, numbers)
// replaced by placeholders: "connection refused by a.example.org:443" and
// "connection refused by b.example.org:8443" are one reason.
func normaliseReason(text string) string {
	for _, p := range reasonParts {
		text = p.re.ReplaceAllString(text, p.with)
	}
	return strings.TrimSpace(text)
}

// failures are the DTRs that ended ERROR lately, at most maxFailures of
// them and none older than failuresSpan, oldest first.
type failures struct {
	recs []FailureRecord
	// kept holds the DTR ids of recs: a failure is recorded at a cost
	// that does not grow with the number kept.
	kept map[uuid.UUID]struct{}
	// groups is recs grouped, made again when changed is set.
	groups  []FailureGroup
	changed bool
}

// add records r; a DTR recorded before (its end announced again after a
// restart) is recorded once.
func (f *failures) add(r FailureRecord) {
	if f.kept == nil {
		f.kept = map[uuid.UUID]struct{}{}
	}
	if _, again := f.kept[r.DTR]; again {
		if i := slices.IndexFunc(f.recs, func(o FailureRecord) bool { return o.DTR == r.DTR }); i >= 0 {
			f.recs = slices.Delete(f.recs, i, i+1)
		}
	}
	f.recs = append(f.recs, r)
	f.kept[r.DTR] = struct{}{}
	if n := len(f.recs); n > maxFailures {
		f.drop(n - maxFailures)
	}
	f.changed = true
}

// drop forgets the n oldest failures. The slice is cut from the front, not
// moved: append copies the kept ones when it next needs room.
func (f *failures) drop(n int) {
	for _, r := range f.recs[:n] {
		delete(f.kept, r.DTR)
	}
	clear(f.recs[:n])
	f.recs = f.recs[n:]
}

// prune forgets the failures older than failuresSpan before now.
func (f *failures) prune(now time.Time) {
	i := 0
	for i < len(f.recs) && now.Sub(f.recs[i].Time) > failuresSpan {
		i++
	}
	if i > 0 {
		f.drop(i)
		f.changed = true
	}
}

// get returns the record of DTR id, if it is kept.
func (f *failures) get(id uuid.UUID) (FailureRecord, bool) {
	for i := len(f.recs) - 1; i >= 0; i-- {
		if f.recs[i].DTR == id {
			return f.recs[i], true
		}
	}
	return FailureRecord{}, false
}

// grouped returns the failures grouped by kind and normalised reason,
// the largest groups first (then the latest), at most maxFailureGroups.
// The slice is shared: callers must not change it.
func (f *failures) grouped() []FailureGroup {
	if f.changed || f.groups == nil {
		for i := range f.recs {
			if r := &f.recs[i]; !r.reasonSet {
				r.reason, r.reasonSet = normaliseReason(r.Text), true
			}
		}
		f.groups, f.changed = groupFailures(f.recs), false
	}
	return f.groups
}

// groupFailures groups recs (oldest first) by kind and normalised reason.
func groupFailures(recs []FailureRecord) []FailureGroup {
	type key struct {
		kind   dtr.ErrorKind
		reason string
	}
	at := map[key]int{}
	groups := []FailureGroup{}
	for i := len(recs) - 1; i >= 0; i-- { // the latest first
		r := recs[i]
		k := key{r.Kind, r.reason}
		j, ok := at[k]
		if !ok {
			j = len(groups)
			at[k] = j
			groups = append(groups, FailureGroup{Kind: r.Kind, Reason: r.reason, Latest: r})
		}
		g := &groups[j]
		g.Count++
		g.First = r.Time
		if len(g.DTRs) < maxGroupDTRs {
			g.DTRs = append(g.DTRs, r.DTR)
		}
	}
	slices.SortStableFunc(groups, func(a, b FailureGroup) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return b.Latest.Time.Compare(a.Latest.Time)
	})
	return groups[:min(len(groups), maxFailureGroups)]
}
