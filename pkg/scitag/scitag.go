// Package scitag marks transfers for the network (SciTags packet
// marking): a transfer's requests to storage carry a tag,
// experiment id << 6 | activity id, that storage and routers use to account
// and steer traffic per experiment and activity.
//
// Which experiment a transfer belongs to, and which activity it is, are site
// configuration: a Table maps the VO of the DTR's owner (the first element
// of its first FQAN or token group: /atlas/Role=production is atlas) to an
// experiment id, and the DTR's activity (FTS3's field; empty is "default")
// to an activity id, for every experiment or for one. A DTR whose owner's
// VO is not mapped, or whose activity is not and has no default, carries no
// tag. A tag chosen by a trusted caller (dtr.Options.SciTag) is used as is.
package scitag

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// Bounds of the ids: ten bits of experiment, six of activity.
const (
	MaxExperiment = 1023
	MaxActivity   = 63
)

// DefaultActivity is the activity of a DTR that names none, and the entry
// used for an activity the table does not name.
const DefaultActivity = "default"

// Config is read from SLUICE_SCITAG_*.
type Config struct {
	Experiments string `envconfig:"EXPERIMENTS" desc:"SciTags packet marking: the experiment id of each VO, vo=id,... (e.g. atlas=2,cms=3; ids 1–1023, as in the SciTags registry), keyed by the first element of the owner's first FQAN or token group; transfers of other VOs carry no SciTag header; empty: no marking"`
	Activities  string `envconfig:"ACTIVITIES" desc:"SciTags activity ids, activity=id,... for every experiment or vo:activity=id for one (e.g. default=1,Production Input=2,cms:Production=5; ids 1–63); a DTR's activity is looked up for its VO, then for every VO, then as default; one that finds none carries no SciTag header"`
}

// Table maps owners and activities to tags. The zero Table and a nil one
// mark nothing.
type Table struct {
	experiments map[string]int
	// activities maps "vo\x00activity" (vo empty for every experiment)
	// to an activity id.
	activities map[string]int
}

// New reads cfg, refusing what it cannot use with an error that names the
// setting and the entry.
func New(cfg Config) (*Table, error) {
	t := &Table{experiments: map[string]int{}, activities: map[string]int{}}
	exps, err := entries("SLUICE_SCITAG_EXPERIMENTS", cfg.Experiments, 1, MaxExperiment)
	if err != nil {
		return nil, err
	}
	for _, e := range exps {
		if strings.ContainsAny(e.name, "/: ") {
			return nil, fmt.Errorf("SLUICE_SCITAG_EXPERIMENTS: entry %q: a VO name has no '/', ':' or space (atlas, not /atlas)", e.raw)
		}
		if _, dup := t.experiments[e.name]; dup {
			return nil, fmt.Errorf("SLUICE_SCITAG_EXPERIMENTS: VO %q is given twice", e.name)
		}
		t.experiments[e.name] = e.id
	}
	acts, err := entries("SLUICE_SCITAG_ACTIVITIES", cfg.Activities, 1, MaxActivity)
	if err != nil {
		return nil, err
	}
	for _, e := range acts {
		vo, name := "", e.name
		// "cms:Production" is cms's when cms is a configured VO; an
		// activity may itself hold a colon otherwise.
		if before, after, ok := strings.Cut(e.name, ":"); ok {
			if _, known := t.experiments[before]; known {
				vo, name = before, strings.TrimSpace(after)
			}
		}
		if err := dtr.CheckActivity(name); err != nil || name == "" {
			return nil, fmt.Errorf("SLUICE_SCITAG_ACTIVITIES: entry %q: not an activity name (at most %d printable bytes): %v", e.raw, dtr.MaxActivity, err)
		}
		key := vo + "\x00" + name
		if _, dup := t.activities[key]; dup {
			return nil, fmt.Errorf("SLUICE_SCITAG_ACTIVITIES: activity %q is given twice", e.name)
		}
		t.activities[key] = e.id
	}
	if len(t.activities) > 0 && len(t.experiments) == 0 {
		return nil, fmt.Errorf("SLUICE_SCITAG_ACTIVITIES is set but SLUICE_SCITAG_EXPERIMENTS is empty: no transfer would be marked")
	}
	return t, nil
}

// entry is one name=id of a setting.
type entry struct {
	raw, name string
	id        int
}

// entries parses "name=id,..." with ids in lo–hi.
func entries(setting, s string, lo, hi int) ([]entry, error) {
	var out []entry
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for raw := range strings.SplitSeq(s, ",") {
		name, val, ok := strings.Cut(raw, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("%s: entry %q is not name=id", setting, raw)
		}
		id, err := strconv.Atoi(strings.TrimSpace(val))
		if err != nil || id < lo || id > hi {
			return nil, fmt.Errorf("%s: entry %q: the id must be a whole number in %d–%d", setting, raw, lo, hi)
		}
		out = append(out, entry{raw: raw, name: name, id: id})
	}
	return out, nil
}

// Enabled says whether the table marks anything.
func (t *Table) Enabled() bool { return t != nil && len(t.experiments) > 0 }

// VO returns the VO of an owner: the first element of its first FQAN or
// token group ("/atlas/Role=production" is "atlas"), "" if it has none.
func VO(owner dtr.Identity) string {
	if len(owner.FQANs) == 0 {
		return ""
	}
	vo, _, _ := strings.Cut(strings.TrimPrefix(owner.FQANs[0], "/"), "/")
	return vo
}

// Of returns the tag of a transfer of owner for activity, 0 if the table
// maps none.
func (t *Table) Of(owner dtr.Identity, activity string) int {
	if !t.Enabled() {
		return 0
	}
	vo := VO(owner)
	exp, ok := t.experiments[vo]
	if !ok {
		return 0
	}
	if activity == "" {
		activity = DefaultActivity
	}
	for _, key := range [...]string{vo + "\x00" + activity, "\x00" + activity, vo + "\x00" + DefaultActivity, "\x00" + DefaultActivity} {
		if act, ok := t.activities[key]; ok {
			return exp<<6 | act
		}
	}
	return 0
}

// For returns the tag of a DTR's transfer: the one its trusted submitter
// chose, else the table's for its owner and activity; 0 for none.
func (t *Table) For(d *dtr.DTR) int {
	if d.Options.SciTag != 0 {
		return d.Options.SciTag
	}
	return t.Of(d.Owner, d.Options.Activity)
}
