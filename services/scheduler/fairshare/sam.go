package fairshare

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// SAMSettings are SAM's policy's SLUICE_SAM_* variables.
type SAMSettings struct {
	SAMGroups string `envconfig:"SAM_GROUPS" desc:"sam policy: group=fraction or group=priority, e.g. daq=priority,cms=0.6,atlas=0.4; priority groups rank in the order given"`
	SAMUnit   string `envconfig:"SAM_UNIT" default:"files" desc:"sam policy: benefit counted in files, bytes (byte-fair) or seconds"`
}

// Maker parses the settings into a maker of SAM's policy.
func (s SAMSettings) Maker() (core.PolicyMaker, error) {
	sc, err := ParseSAMGroups(s.SAMGroups)
	if err != nil {
		return nil, err
	}
	if sc.Unit, err = ParseUnit(s.SAMUnit); err != nil {
		return nil, fmt.Errorf("SAM: %w", err)
	}
	return NewSAM(sc), nil
}

// SAMConfig configures SAM's policy.
type SAMConfig struct {
	// Priority lists the priority groups, highest first: their DTRs always
	// go before every fair-share DTR, in this order.
	Priority []string
	// Fractions gives each fair-share group its fraction of the benefit;
	// they are normalised to sum to 1. A group not listed has the fraction
	// of core.DefaultShare, or none: its DTRs always go to the back.
	Fractions map[string]float64
	// Unit is the benefit of a DTR: UnitFiles (default), UnitBytes or
	// UnitSlotSeconds (the time its transfer held a slot).
	Unit string
}

// SAM is SAM's generic fair share: one
// queue, in which a new DTR of a fair-share group g goes to the front if
// (B[g] + b) / (ΣB + b) ≤ f[g], where B is the cumulative benefit each
// group has received, b the DTR's expected benefit and f the group's
// fraction, and to the back otherwise; DTRs of priority groups go before
// both, in the groups' order. Front and back are priorities 2 and 1;
// priority groups get 3 and up. Equal priorities keep their order of
// arrival, and the queue does not age (SAM assumes it does not).
//
// The benefit is charged when a transfer ends (files: 1; bytes: the bytes
// moved; seconds: the slot-time). A DTR's expected benefit is 1 file, its
// size once known (else its group's mean so far), or its group's mean
// transfer time. As in SAM, the decision is made once, when the DTR
// arrives: a burst from one group is placed against the benefit received
// so far.
type SAM struct {
	env core.PolicyEnv
	cfg SAMConfig
	// B is the cumulative benefit per group, n the transfers charged.
	B     map[string]float64
	n     map[string]int
	total float64
	rank  map[string]int // priority group → priority
}

// NewSAM returns a maker of SAM's policy for core.Config.Policy.
func NewSAM(cfg SAMConfig) core.PolicyMaker {
	if cfg.Unit == "" {
		cfg.Unit = UnitFiles
	}
	sum := 0.0
	for _, f := range cfg.Fractions {
		sum += f
	}
	norm := map[string]float64{}
	for g, f := range cfg.Fractions {
		norm[g] = f / sum
	}
	cfg.Fractions = norm
	rank := map[string]int{}
	for i, g := range cfg.Priority {
		rank[g] = min(100, 3+len(cfg.Priority)-1-i)
	}
	return func(env core.PolicyEnv) core.Policy {
		return &SAM{env: env, cfg: cfg, B: map[string]float64{}, n: map[string]int{}, rank: rank}
	}
}

// Name implements Policy.
func (*SAM) Name() string { return "sam" }

// Ageless implements ageless: SAM's queue does not age.
func (*SAM) Ageless() bool { return true }

// Share implements Policy: one queue (per direction).
func (*SAM) Share(*dtr.DTR) string { return "sam" }

func (p *SAM) group(d *dtr.DTR) string { return p.env.ShareName(d.Owner) }

func (p *SAM) fraction(g string) float64 {
	if f, ok := p.cfg.Fractions[g]; ok {
		return f
	}
	return p.cfg.Fractions[core.DefaultShare]
}

// expected returns a DTR's expected benefit.
func (p *SAM) expected(g string, d *dtr.DTR) float64 {
	mean := 1.0
	if p.n[g] > 0 {
		mean = p.B[g] / float64(p.n[g])
	}
	switch p.cfg.Unit {
	case UnitBytes:
		if d.Size > 0 {
			return float64(d.Size)
		}
		return mean
	case UnitSlotSeconds:
		return mean
	}
	return 1
}

// Priority implements Policy: front (2), back (1), or the priority
// group's rank (3 and up).
func (p *SAM) Priority(_ string, d *dtr.DTR) int {
	g := p.group(d)
	if r, ok := p.rank[g]; ok {
		return r
	}
	return p.Front(g, p.expected(g, d))
}

// Front returns 2 (the front) if a DTR of group g with expected benefit b
// keeps g within its fraction, else 1 (the back).
func (p *SAM) Front(g string, b float64) int {
	f := p.fraction(g)
	if f > 0 && (p.B[g]+b)/(p.total+b) <= f {
		return 2
	}
	return 1
}

// Weigh implements Policy: one share per direction, weighed alike.
func (*SAM) Weigh(time.Time, dtr.State, []core.ShareDemand) {}

// Charge implements Policy: a finished transfer adds its benefit.
func (p *SAM) Charge(_ time.Time, state dtr.State, d *dtr.DTR, held time.Duration, bytes int64) {
	if state != dtr.Transfer {
		return
	}
	var b float64
	switch p.cfg.Unit {
	case UnitBytes:
		b = float64(bytes)
	case UnitSlotSeconds:
		b = held.Seconds()
	default:
		b = 1
	}
	g := p.group(d)
	p.B[g] += b
	p.n[g]++
	p.total += b
}

// ParseSAMGroups reads "group=priority" and "group=fraction" items, as in
// "daq=priority,calib=priority,cms=0.6,atlas=0.4"; priority groups rank in
// the order given, highest first.
func ParseSAMGroups(s string) (SAMConfig, error) {
	cfg := SAMConfig{Fractions: map[string]float64{}}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, v, ok := strings.Cut(item, "=")
		if !ok || name == "" {
			return cfg, fmt.Errorf("SAM group %q: want group=fraction or group=priority", item)
		}
		if v == "priority" {
			cfg.Priority = append(cfg.Priority, name)
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0) || math.IsInf(f, 0) {
			return cfg, fmt.Errorf("SAM group %q: fraction %q is not a positive number (or \"priority\")", name, v)
		}
		cfg.Fractions[name] = f
	}
	if len(cfg.Fractions) == 0 {
		return cfg, fmt.Errorf("SAM groups %q: no fair-share group with a fraction", s)
	}
	return cfg, nil
}
