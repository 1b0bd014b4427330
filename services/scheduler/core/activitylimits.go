package core

// Per-activity limits at an endpoint (Rucio's transfer limits): at most Max
// transfers of an activity run at once against an endpoint as a source,
// or as a destination. A DTR whose endpoint is at its activity's limit is
// parked in TRANSFER (parking.go), like one whose endpoint is at
// MaxPerHost (hosts.go). The activity is the DTR's effective one, that
// its share goes by (SharePolicy.EffectiveActivity).

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// AnyEndpoint in an activity limit's source or destination applies the
// limit to every endpoint, each counted on its own.
const AnyEndpoint = "*"

// ActivityLimit is one limit: Activity ("default" for DTRs without one)
// at Source or at Destination (one of them: an endpoint "host:port",
// compared in normal form (normalEndpoint) with the URLs'; a host name
// alone, which counts every port of that host together,
// https://se.example.org/… and https://se.example.org:8443/… alike; or
// "*", each endpoint on its own), at most Max transfers at once.
type ActivityLimit struct {
	Activity    string `json:"activity"`
	Source      string `json:"source,omitempty"`
	Destination string `json:"destination,omitempty"`
	Max         int    `json:"max"`
}

// Side is "source" or "destination", Endpoint the endpoint the limit is at.
func (l ActivityLimit) Side() string {
	if l.Source != "" {
		return "source"
	}
	return "destination"
}

// Endpoint is the limit's source or destination.
func (l ActivityLimit) Endpoint() string { return l.Source + l.Destination }

// String describes the limit for messages: `at most 5 "User
// Subscriptions" transfers at destination se.example.org:443`.
func (l ActivityLimit) String() string {
	at := l.Endpoint()
	if at == AnyEndpoint {
		at = "any one endpoint"
	}
	return fmt.Sprintf("at most %d %q transfers at %s %s", l.Max, l.Activity, l.Side(), at)
}

// ParseActivityLimits reads SLUICE_ACTIVITY_LIMITS (a JSON array); "" is
// no limits.
func ParseActivityLimits(s string) ([]ActivityLimit, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var ls []ActivityLimit
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ls); err != nil {
		return nil, fmt.Errorf("activity limits: not a JSON array of {\"activity\":…,\"source\" or \"destination\":…,\"max\":…}: %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("activity limits: text after the JSON array")
	}
	return ls, ValidateActivityLimits(ls)
}

// ValidateActivityLimits checks each limit: an activity a DTR may carry,
// exactly one of source and destination, an endpoint without scheme or
// path, a max of at least 1, and no two limits on the same activity, side
// and endpoint.
func ValidateActivityLimits(ls []ActivityLimit) error {
	seen := map[ActivityLimit]int{}
	for i, l := range ls {
		n := i + 1
		switch {
		case l.Activity == "":
			return fmt.Errorf("activity limit %d: no activity (DTRs without one are in %q)", n, DefaultActivity)
		case (l.Source == "") == (l.Destination == ""):
			return fmt.Errorf("activity limit %d (%q): give exactly one of source and destination", n, l.Activity)
		case l.Max < 1:
			return fmt.Errorf("activity limit %d (%q): max %d; it must be at least 1", n, l.Activity, l.Max)
		}
		if err := dtr.CheckActivity(l.Activity); err != nil {
			return fmt.Errorf("activity limit %d: %w", n, err)
		}
		if ep := l.Endpoint(); ep != AnyEndpoint && !isEndpoint(ep) {
			return fmt.Errorf("activity limit %d (%q): %s %q is not an endpoint: give host:port as in the URLs, a host name for every port of it, or %q for each endpoint", n, l.Activity, l.Side(), ep, AnyEndpoint)
		}
		key := l
		key.Max = 0
		if j, dup := seen[key]; dup {
			return fmt.Errorf("activity limit %d repeats limit %d (%q at %s %s)", n, j, l.Activity, l.Side(), l.Endpoint())
		}
		seen[key] = n
	}
	return nil
}

// activityKey is one limit (its index) at one endpoint (1 + its number in
// the names table, as in entry.hosts).
type activityKey struct {
	limit    int32
	endpoint uint32
}

// isEndpoint reports whether ep is "host:port" or "host", as a URL
// writes it.
func isEndpoint(ep string) bool {
	if ep == "" || strings.ContainsAny(ep, "/ \t?#@") {
		return false
	}
	p, err := url.Parse("x://" + ep)
	return err == nil && p.Host == ep && p.Hostname() != ""
}

// hostOnly reports whether an endpoint is a host name without a port.
func hostOnly(ep string) bool {
	u := url.URL{Host: ep}
	return ep != AnyEndpoint && u.Port() == "" && !strings.HasSuffix(ep, ":")
}

// hostnameOf is the host name of an endpoint as written in a URL,
// lower-cased and without a trailing dot ("[::1]:8443" → "::1").
func hostnameOf(ep string) string {
	return strings.TrimSuffix(strings.ToLower((&url.URL{Host: ep}).Hostname()), ".")
}

// activityLoad counts the grants running per activity limit and endpoint,
// in the states whose slot class is perHost (TRANSFER). Its invariant,
// like hostLoad's: a key is in running exactly while a grant that the
// limit covers runs at the endpoint.
type activityLoad struct {
	limits []ActivityLimit
	// activity and endpoint are each limit's activity and endpoint as
	// 1 + their number in the names table; endpoint 0 is "*". byHost
	// marks a limit at a host name: its endpoint is that name's number,
	// and hostname maps an endpoint's number to its host name's.
	activity, endpoint []uint32
	byHost             []bool
	hostname           func(endpoint uint32) uint32
	// ids maps the activities that limits name to their numbers.
	ids     map[string]uint32
	running map[activityKey]int
}

// setActivityLimits installs the limits, interning their names (the
// configuration's, a bounded few); a limit at a host name is kept
// lower-cased.
func (c *Core) setActivityLimits(ls []ActivityLimit) {
	l := &c.activityLoad
	l.limits = slices.Clone(ls)
	l.activity, l.endpoint, l.byHost = make([]uint32, len(ls)), make([]uint32, len(ls)), make([]bool, len(ls))
	l.ids = map[string]uint32{}
	for i := range l.limits {
		lim := &l.limits[i]
		l.activity[i] = uint32(c.nameID(lim.Activity)) + 1
		l.ids[lim.Activity] = l.activity[i]
		switch ep := lim.Endpoint(); {
		case ep == AnyEndpoint:
		case hostOnly(ep):
			l.byHost[i] = true
			if lim.Source != "" {
				lim.Source = hostnameOf(ep)
			} else {
				lim.Destination = hostnameOf(ep)
			}
			l.endpoint[i] = uint32(c.nameID(lim.Endpoint())) + 1
		default:
			// In the normal form of the URLs' endpoints: lower-cased,
			// without a trailing dot.
			ep = normalEndpoint("", ep)
			if lim.Source != "" {
				lim.Source = ep
			} else {
				lim.Destination = ep
			}
			l.endpoint[i] = uint32(c.nameID(ep)) + 1
		}
	}
	// The host name of each endpoint, worked out when a limit first asks:
	// one more name per storage endpoint at most.
	hostnames := map[uint32]uint32{}
	l.hostname = func(h uint32) uint32 {
		id, ok := hostnames[h]
		if !ok {
			id = uint32(c.nameID(hostnameOf(c.names[h-1]))) + 1
			hostnames[h] = id
		}
		return id
	}
}

// setActivity notes the activity of a DTR if a limit names it: its
// effective activity, the one its share goes by (an activity that the
// weights table does not list is "default", so inventing one does not
// escape a limit on "default"). A DTR's activity is a submitter's free
// text: it is not interned, as the table of names is never pruned.
func (c *Core) setActivity(e *entry) {
	e.activity = c.activityLoad.ids[c.effectiveActivity(e.d)]
}

// effectiveActivity is the activity a DTR's share and limits go by
// (SharePolicy.EffectiveActivity, with the core's bound on the
// activities of an identity without a weights table).
func (c *Core) effectiveActivity(d *dtr.DTR) string {
	p := c.cfg.SharePolicy
	if !p.HasActivity() {
		return activityFor(d.Options.Activity)
	}
	if d.Share != "" {
		// A DTR with its share (submitted, or restored from its record)
		// goes by the activity its share names; a restored one also counts
		// it as its identity's, so that the bound on an identity's
		// activities is rebuilt as the records left it.
		if sid, act, ok := p.SplitShare(d.Share); ok {
			if act != DefaultActivity && c.cfg.ActivityWeights.table(p, sid) == nil {
				c.activitySeen.admit(sid, act)
			}
			return act
		}
	}
	var id string
	if p != PolicyActivity {
		id = p.ShareName(d.Owner)
	}
	return p.effectiveActivity(id, d.Options.Activity, c.cfg.ActivityWeights, &c.activitySeen)
}

// limited reports whether there are activity limits.
func (l *activityLoad) limited() bool { return len(l.limits) > 0 }

// covers returns the key under which limit i counts e, if it does.
func (l *activityLoad) covers(i int, e *entry) (activityKey, bool) {
	if e.activity == 0 || l.activity[i] != e.activity {
		return activityKey{}, false
	}
	h := e.hosts[1]
	if l.limits[i].Source != "" {
		h = e.hosts[0]
	}
	switch {
	case h == 0:
		return activityKey{}, false
	case l.byHost[i]:
		// Counted under the host name, whatever port each URL wrote.
		if l.hostname(h) != l.endpoint[i] {
			return activityKey{}, false
		}
		h = l.endpoint[i]
	case l.endpoint[i] != 0 && l.endpoint[i] != h:
		return activityKey{}, false
	}
	return activityKey{limit: int32(i), endpoint: h}, true
}

// room reports whether every limit that covers e is below its max.
func (l *activityLoad) room(e *entry) bool {
	_, full := l.full(e)
	return !full
}

// full returns a limit that covers e and has max grants running.
func (l *activityLoad) full(e *entry) (activityKey, bool) {
	for i := range l.limits {
		if k, ok := l.covers(i, e); ok && l.running[k] >= l.limits[i].Max {
			return k, true
		}
	}
	return activityKey{}, false
}

// add counts a grant of e in (n = 1) or out (n = -1) under every limit
// that covers it.
func (l *activityLoad) add(e *entry, n int) {
	for i := range l.limits {
		if k, ok := l.covers(i, e); ok {
			if l.running[k] += n; l.running[k] <= 0 {
				delete(l.running, k)
			}
		}
	}
}

// activityLimitReason says which activity limit holds a queued TRANSFER
// DTR, "" if none does.
func (c *Core) activityLimitReason(e *entry) string {
	k, full := c.activityLoad.full(e)
	if !full {
		return ""
	}
	lim := c.activityLoad.limits[k.limit]
	return fmt.Sprintf("activity limit %d (%s) holds it: %d %q transfers run at %s %s; the DTR waits for one of them to end",
		k.limit+1, lim, c.activityLoad.running[k], lim.Activity, lim.Side(), c.names[k.endpoint-1])
}

// ActivityLimitUse is one activity limit and how many transfers it counts
// at each endpoint where any run.
type ActivityLimitUse struct {
	ActivityLimit
	// Running is the transfers running, by endpoint.
	Running map[string]int `json:"running,omitempty"`
}

// ActivityLimits returns the activity limits and their use.
func (c *Core) ActivityLimits() []ActivityLimitUse {
	l := &c.activityLoad
	out := make([]ActivityLimitUse, len(l.limits))
	for i, lim := range l.limits {
		out[i].ActivityLimit = lim
	}
	for k, n := range l.running {
		u := &out[k.limit]
		if u.Running == nil {
			u.Running = map[string]int{}
		}
		u.Running[c.names[k.endpoint-1]] = n
	}
	return out
}
