package core

// Activity shares: a share policy that adds the DTR's activity (what the
// transfer is for, in FTS3's and Rucio's words) to the share's name, and
// per-activity weights that divide a share's priority between its
// activities.

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// DefaultActivity is the activity of a DTR that names none (FTS3 does the
// same), and the entry of an activity-weights table that an activity the
// table does not list takes.
const DefaultActivity = "default"

// ActivitySeparator joins a share's identity part and its activity:
// "atlas#Production Input". VOMS names (VO, group, role) cannot hold it,
// and ":" and "/" already appear in group and role shares.
const ActivitySeparator = "#"

// activitySuffix turns a share policy into its activity form:
// "voms:vo+activity".
const activitySuffix = "+activity"

// PolicyActivity names shares by the activity alone.
const PolicyActivity SharePolicy = "activity"

// activityFor returns the activity of a DTR's options, DefaultActivity for
// none.
func activityFor(a string) string {
	if a == "" {
		return DefaultActivity
	}
	return a
}

// HasActivity reports whether the policy puts the activity in share names.
func (p SharePolicy) HasActivity() bool {
	return p == PolicyActivity || strings.HasSuffix(string(p), activitySuffix)
}

// identity returns the policy without its activity part: the one that
// names a share from the owner's identity.
func (p SharePolicy) identity() SharePolicy {
	if p == PolicyActivity {
		return PolicyNone
	}
	return SharePolicy(strings.TrimSuffix(string(p), activitySuffix))
}

// ShareOf names the share of a DTR, without the direction suffix: its
// identity's share (ShareName) and, under an activity policy, its
// effective activity (EffectiveActivity): "atlas#Production Input"; under
// plain "activity" the activity alone.
func (p SharePolicy) ShareOf(d *dtr.DTR, w ActivityWeights) string {
	return p.shareOf(d, w, nil)
}

// shareOf is ShareOf with the core's bound on the activities of an
// identity without a weights table (nil: no bound).
func (p SharePolicy) shareOf(d *dtr.DTR, w ActivityWeights, seen *activitySet) string {
	if !p.HasActivity() {
		return p.ShareName(d.Owner)
	}
	var id string
	if p != PolicyActivity {
		id = p.ShareName(d.Owner)
	}
	act := p.effectiveActivity(id, d.Options.Activity, w, seen)
	if p == PolicyActivity {
		return act
	}
	return id + ActivitySeparator + act
}

// EffectiveActivity is the activity a DTR's shares and limits go by under
// an activity policy: "default" for none; "default" for one that the
// identity's weights table (ActivityWeights) does not list, so that a
// submitter's free text makes no new share, nor escapes a limit on
// "default", where a table says which activities there are; and
// "default" for one holding "#" (only a record older than the check that
// refuses it can). Under any other policy it is the DTR's activity, or
// "default" for none.
func (p SharePolicy) EffectiveActivity(d *dtr.DTR, w ActivityWeights) string {
	if !p.HasActivity() {
		return activityFor(d.Options.Activity)
	}
	var id string
	if p != PolicyActivity {
		id = p.ShareName(d.Owner)
	}
	return p.effectiveActivity(id, d.Options.Activity, w, nil)
}

func (p SharePolicy) effectiveActivity(id, activity string, w ActivityWeights, seen *activitySet) string {
	act := activityFor(activity)
	if strings.Contains(act, ActivitySeparator) {
		return DefaultActivity
	}
	if table := w.table(p, id); table != nil {
		if _, listed := table[act]; !listed {
			act = DefaultActivity
		}
		return act
	}
	if seen != nil && !seen.admit(id, act) {
		return DefaultActivity
	}
	return act
}

// DefaultActivitiesPerIdentity is the default bound on the distinct
// activities that make shares of their own for one identity without a
// weights table.
const DefaultActivitiesPerIdentity = 16

// activitySet bounds the distinct activities of each identity that has no
// weights table: the first max of them each make a share, the rest go to
// "default". Without the bound every new activity text would be a new
// share, kept for ever in the names table and in every per-share metric.
type activitySet struct {
	max int
	by  map[string]map[string]struct{}
}

// admit reports whether act is (or now becomes) one of id's own
// activities.
func (s *activitySet) admit(id, act string) bool {
	if act == DefaultActivity || s.max <= 0 {
		return true
	}
	acts := s.by[id]
	if _, ok := acts[act]; ok {
		return true
	}
	if len(acts) >= s.max {
		return false
	}
	if acts == nil {
		if s.by == nil {
			s.by = map[string]map[string]struct{}{}
		}
		acts = map[string]struct{}{}
		s.by[id] = acts
	}
	acts[act] = struct{}{}
	return true
}

// SplitShare splits a share name that ShareOf gave (with or without the
// direction suffix) into its identity part and its activity; ok is false
// for a share without an activity. The identity part of a share under
// plain "activity" is "". The activity follows the last "#": an activity
// cannot hold one (dtr.CheckActivity), an identity part (a DN) may. As
// with every share name, a DTR without a direction whose activity ends in
// "-download" or "-upload" reads as if it had that direction.
func (p SharePolicy) SplitShare(share string) (identity, activity string, ok bool) {
	base, _ := CutDirection(share)
	switch {
	case p == PolicyActivity:
		return "", base, true
	case !p.HasActivity():
		return base, "", false
	}
	i := strings.LastIndex(base, ActivitySeparator)
	if i < 0 {
		return base, "", false
	}
	return base[:i], base[i+len(ActivitySeparator):], true
}

// ActivityWeights are the relative weights of activities, by VO (or by a
// share's identity part, such as "atlas:prod" under voms:group+activity,
// or "*" for any): {"atlas": {"Production Input": 0.6, "default": 0.3}}.
// Each table must have a "default" entry, which activities it does not
// list take.
type ActivityWeights map[string]map[string]float64

// MaxActivityWeight bounds a weight, so that the sums of a table stay far
// from overflowing; weights are relative, so no table needs more.
const MaxActivityWeight = 1e6

// ParseActivityWeights reads SLUICE_ACTIVITY_SHARES (JSON); "" is no
// weights.
func ParseActivityWeights(s string) (ActivityWeights, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var w ActivityWeights
	dec := json.NewDecoder(strings.NewReader(s))
	if err := dec.Decode(&w); err != nil {
		return nil, fmt.Errorf("activity shares: not a JSON object of VOs, each an object of activity weights, such as {\"atlas\":{\"Production Input\":0.6,\"default\":0.4}}: %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("activity shares: text after the JSON object")
	}
	return w, w.Validate()
}

// Validate checks every table: a non-empty VO key, at least a "default"
// entry, activity names that a DTR may carry, weights above 0 and at most
// MaxActivityWeight.
func (w ActivityWeights) Validate() error {
	for _, vo := range slices.Sorted(maps.Keys(w)) {
		table := w[vo]
		if strings.TrimSpace(vo) == "" {
			return fmt.Errorf("activity shares: an empty VO name")
		}
		if _, ok := table[DefaultActivity]; !ok {
			return fmt.Errorf("activity shares of %q: no %q weight (activities the table does not list, and DTRs without one, take it)", vo, DefaultActivity)
		}
		for _, a := range slices.Sorted(maps.Keys(table)) {
			if a == "" {
				return fmt.Errorf("activity shares of %q: an empty activity name", vo)
			}
			if err := dtr.CheckActivity(a); err != nil {
				return fmt.Errorf("activity shares of %q: %w", vo, err)
			}
			if v := table[a]; math.IsNaN(v) || v <= 0 || v > MaxActivityWeight {
				return fmt.Errorf("activity shares of %q: activity %q has weight %v; a weight must be a number above 0 and at most %g (weights are relative)", vo, a, v, float64(MaxActivityWeight))
			}
		}
	}
	return nil
}

// table returns the weights table of a share's identity part: its own
// (such as "atlas:prod" under voms:group+activity), else its VO's (the
// part before the first ":" under a VOMS policy), else "*"'s; nil if none.
func (w ActivityWeights) table(policy SharePolicy, identity string) map[string]float64 {
	if table, ok := w[identity]; ok {
		return table
	}
	if strings.HasPrefix(string(policy.identity()), "voms:") {
		vo, _, _ := strings.Cut(identity, ":")
		if table, ok := w[vo]; ok {
			return table
		}
	}
	return w["*"]
}

// weight returns an activity's weight for a share's identity part: from
// its table, the table's "default" entry for an activity it does not
// list; 1 for every activity of an identity with no table.
func (w ActivityWeights) weight(policy SharePolicy, identity, activity string) float64 {
	table := w.table(policy, identity)
	if table == nil {
		return 1
	}
	if v, ok := table[activity]; ok {
		return v
	}
	return table[DefaultActivity]
}

// activityScale multiplies every share's weight when activities divide
// them, so that a priority times a fraction keeps its precision as an
// integer weight.
const activityScale = 10000

// shareActivity is how a share's name splits for weighActivities.
type shareActivity struct {
	// identity and direction name the activities that divide one
	// priority; weight is the activity's weight, 0 for a share without
	// an activity.
	identity, direction string
	weight              float64
}

// activityOf splits a share's name. It is worked out afresh at each
// split rather than remembered: activities are submitters' free text, and
// a table of them would only grow.
func (c *Core) activityOf(share string) shareActivity {
	id, act, ok := c.cfg.SharePolicy.SplitShare(share)
	if !ok {
		return shareActivity{}
	}
	_, dir := CutDirection(share)
	return shareActivity{identity: id, direction: dir, weight: c.cfg.ActivityWeights.weight(c.cfg.SharePolicy, id, act)}
}

// weighActivities divides the weight the policy gave each share between
// the activities of one identity (and direction) that have work in the
// state, in proportion to their activity weights:
//
//	weight × activity weight ÷ sum of the weights of that identity's activities with work
//
// so that an identity's activities together weigh what its priority says,
// however many of them have work. Every share's weight is multiplied by
// activityScale first. It does nothing unless the share policy names
// activities and the policy is ARC's (perhaps wrapped, as byte-fair
// does): the other policies name their own groups, without activities.
// It reports whether it did.
func (c *Core) weighActivities(shares []ShareDemand) bool {
	if _, arc := innermost(c.policy).(ARC); !arc || !c.cfg.SharePolicy.HasActivity() {
		return false
	}
	type group struct{ identity, direction string }
	sums := map[group]float64{}
	for _, s := range shares {
		if sa := c.activityOf(s.Name); sa.weight > 0 && s.Demand > 0 {
			sums[group{sa.identity, sa.direction}] += sa.weight
		}
	}
	for i := range shares {
		w := float64(max(shares[i].Weight, 1)) * activityScale
		sa := c.activityOf(shares[i].Name)
		if sum := sums[group{sa.identity, sa.direction}]; sa.weight > 0 && sum > 0 {
			w = w * sa.weight / sum
		}
		shares[i].Weight = max(int64(math.Round(w)), 1)
	}
	return true
}

// sharePriorityUnder is a share's configured priority: that of the share
// itself (with or without the direction suffix) if configured, else, for a
// share with an activity, that of its identity part ("atlas" for
// "atlas#Production Input-download"), else _default's, else 50.
func sharePriorityUnder(prios map[string]int, policy SharePolicy, share string) int {
	if id, _, ok := policy.SplitShare(share); ok && id != "" {
		base, _ := CutDirection(share)
		if _, set := prios[share]; !set {
			if _, set := prios[base]; !set {
				share = id
			}
		}
	}
	return sharePriorityIn(prios, share)
}
