package fairshare

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// EnstoreSettings are Enstore's policy's SLUICE_ENSTORE_* variables.
type EnstoreSettings struct {
	EnstoreAdmin string `envconfig:"ENSTORE_ADMIN" desc:"enstore policy: admin/DAQ rules as JSON, e.g. [{\"user\":\"/CN=joe\",\"host\":\"node1\"},{\"group\":\"daq\"}]"`
	EnstoreOwned string `envconfig:"ENSTORE_OWNED" desc:"enstore policy: slots a group owns in each state, e.g. cms=4,atlas=2"`
}

// Maker parses the settings into a maker of Enstore's policy; the slots
// groups own must fit in the smallest state (unless its slots are unknown,
// 0).
func (s EnstoreSettings) Maker(slots Slots) (core.PolicyMaker, error) {
	var err error
	var ec EnstoreConfig
	if ec.Admin, err = ParseEnstoreAdmin(s.EnstoreAdmin); err != nil {
		return nil, err
	}
	if ec.Owned, err = ParseOwned(s.EnstoreOwned); err != nil {
		return nil, err
	}
	owned := 0
	for _, n := range ec.Owned {
		owned += n
	}
	if smallest := min(slots.Delivery, slots.Processor); owned > smallest && slots.Delivery > 0 && slots.Processor > 0 {
		return nil, fmt.Errorf("Enstore owned slots add up to %d, more than the %d slots of the smallest state", owned, smallest)
	}
	return NewEnstore(ec), nil
}

// EnstoreRule is one condition for Enstore's admin/DAQ category: every
// field that is set must match (the DTR owner's DN, its group as
// core.SharePolicy names it, the host of its source or destination URL).
type EnstoreRule struct {
	User  string `json:"user,omitempty"`
	Group string `json:"group,omitempty"`
	Host  string `json:"host,omitempty"`
}

// EnstoreConfig configures Enstore's policy.
type EnstoreConfig struct {
	// Admin lists the conditions that grant the admin/DAQ category; a DTR
	// that meets any of them has it.
	Admin []EnstoreRule
	// Owned gives the slots a group owns in every state (and direction):
	// they are its whenever it has work, and others borrow them while it
	// is idle.
	Owned map[string]int
}

// Enstore is Enstore's queue management
// on Sluice's slots:
//
//   - Category: a DTR meeting an admin rule goes to its group's admin share
//     ("admin:<group>"), which is served before every normal share: it
//     takes the next free slots, but no running transfer is stopped.
//   - Numeric priority: the user priority, raised with time in the queue
//     by the core's ageing (SLUICE_AGE_AFTER / SLUICE_AGE_EVERY; Enstore
//     raises by one every 30 minutes).
//   - Fair share: groups weigh the same, and a group with nothing in
//     progress goes first when there are more groups than free slots.
//   - Owned capacity: a group's owned slots are guaranteed whenever it has
//     that much work; while it is idle others use them, and as their
//     transfers finish the freed slots go back to the owner first.
//
// Enstore stops serving normal requests on a volume that an admin request
// waits for; Sluice has no volumes, so the admin share simply goes first.
type Enstore struct {
	env    core.PolicyEnv
	cfg    EnstoreConfig
	groups map[string]enstoreShare // by share name without direction
}

type enstoreShare struct {
	group string
	admin bool
}

// NewEnstore returns a maker of Enstore's policy for core.Config.Policy.
func NewEnstore(cfg EnstoreConfig) core.PolicyMaker {
	return func(env core.PolicyEnv) core.Policy {
		return &Enstore{env: env, cfg: cfg, groups: map[string]enstoreShare{}}
	}
}

// Name implements Policy.
func (*Enstore) Name() string { return "enstore" }

// Admin reports whether a DTR of group meets an admin rule.
func (p *Enstore) Admin(d *dtr.DTR, group string) bool {
	for _, r := range p.cfg.Admin {
		if r.User != "" && r.User != d.Owner.DN {
			continue
		}
		if r.Group != "" && r.Group != group {
			continue
		}
		if r.Host != "" && hostOf(d.Source) != r.Host && hostOf(d.Destination) != r.Host {
			continue
		}
		return true
	}
	return false
}

func hostOf(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return ""
	}
	return p.Hostname()
}

// Share implements Policy.
func (p *Enstore) Share(d *dtr.DTR) string {
	group := p.env.ShareName(d.Owner)
	name, admin := group, p.Admin(d, group)
	if admin {
		name = "admin:" + group
	}
	p.groups[name] = enstoreShare{group: group, admin: admin}
	return name
}

// Priority implements Policy: the user priority.
func (*Enstore) Priority(_ string, d *dtr.DTR) int { return userPriority(d) }

func (p *Enstore) share(name string) enstoreShare {
	base, _ := core.CutDirection(name)
	if s, ok := p.groups[base]; ok {
		return s
	}
	if g, ok := strings.CutPrefix(base, "admin:"); ok {
		return enstoreShare{group: g, admin: true} // restored before this policy saw it
	}
	return enstoreShare{group: base}
}

// Weigh implements Policy.
func (p *Enstore) Weigh(_ time.Time, _ dtr.State, shares []core.ShareDemand) {
	for i := range shares {
		s := p.share(shares[i].Name)
		shares[i].Weight = 1000
		if shares[i].Running == 0 {
			shares[i].Weight++ // nothing in progress: first in a crowd
		}
		shares[i].Tier, shares[i].Min = 0, 0
		if s.admin {
			shares[i].Tier = 1
		} else {
			shares[i].Min = p.cfg.Owned[s.group]
		}
	}
}

// Charge implements Policy: Enstore keeps no history.
func (*Enstore) Charge(time.Time, dtr.State, *dtr.DTR, time.Duration, int64) {}

// ParseEnstoreAdmin reads the admin rules as a JSON array, e.g.
// [{"user":"/CN=joe","host":"mynode1"},{"host":"myspecialnode"}].
func ParseEnstoreAdmin(s string) ([]EnstoreRule, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	var rules []EnstoreRule
	if err := dec.Decode(&rules); err != nil {
		return nil, fmt.Errorf("Enstore admin rules: want a JSON array of {\"user\", \"group\", \"host\"}: %w", err)
	}
	for i, r := range rules {
		if r == (EnstoreRule{}) {
			return nil, fmt.Errorf("Enstore admin rule %d is empty: it would match every DTR", i+1)
		}
	}
	return rules, nil
}

// ParseOwned reads "group=slots,..." as in "cms=4,atlas=2".
func ParseOwned(s string) (map[string]int, error) {
	out := map[string]int{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, n, ok := strings.Cut(item, "=")
		slots, err := strconv.Atoi(n)
		if !ok || name == "" || err != nil || slots < 1 {
			return nil, fmt.Errorf("owned slots %q: want group=slots with slots ≥ 1", item)
		}
		out[name] = slots
	}
	return out, nil
}
