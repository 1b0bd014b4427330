package fairshare

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// DIRACSettings are DIRAC's policy's SLUICE_DIRAC_* variables.
type DIRACSettings struct {
	DIRACGroups        string  `envconfig:"DIRAC_GROUPS" desc:"dirac policy: group=priority[:sharing][:background],... e.g. prod=100:sharing,user=50:background; groups are named by SLUICE_SHAREPOLICY"`
	DIRACSlices        string  `envconfig:"DIRAC_SLICES" desc:"dirac policy: history slices span:weight:maxcorrection,... e.g. 168h:80:2,1h:20:5; empty: no correction"`
	DIRACMaxCorrection float64 `envconfig:"DIRAC_MAX_CORRECTION" default:"5" desc:"dirac policy: the total correction stays within [1/G, G]"`
	DIRACUnit          string  `envconfig:"DIRAC_UNIT" default:"seconds" desc:"dirac policy: usage counted in seconds (slot-time), bytes (byte-fair) or files"`
	// The second level: users inside a group without job sharing.
	DIRACUserSlices        string  `envconfig:"DIRAC_USER_SLICES" desc:"dirac policy: history slices span:weight:maxcorrection,... that correct how a group without job sharing divides its weight among its users; empty: the same as DIRAC_SLICES; off: divided equally"`
	DIRACUserMaxCorrection float64 `envconfig:"DIRAC_USER_MAX_CORRECTION" desc:"dirac policy: a user's total correction inside its group stays within [1/U, U]; 0: DIRAC_MAX_CORRECTION"`
}

// Maker parses the settings into a maker of DIRAC's policy.
func (s DIRACSettings) Maker() (core.PolicyMaker, error) {
	var err error
	dc := DIRACConfig{MaxGlobalCorrection: s.DIRACMaxCorrection}
	if dc.Groups, err = ParseDIRACGroups(s.DIRACGroups); err != nil {
		return nil, err
	}
	if dc.Slices, err = ParseDIRACSlices(s.DIRACSlices); err != nil {
		return nil, err
	}
	if dc.Unit, err = ParseUnit(s.DIRACUnit); err != nil {
		return nil, fmt.Errorf("DIRAC: %w", err)
	}
	switch strings.ToLower(strings.TrimSpace(s.DIRACUserSlices)) {
	case "":
		// nil: the groups' slices
	case "off":
		dc.NoUserCorrection = true
	default:
		if dc.UserSlices, err = ParseDIRACSlices(s.DIRACUserSlices); err != nil {
			return nil, fmt.Errorf("SLUICE_DIRAC_USER_SLICES: %w", err)
		}
	}
	if u := s.DIRACUserMaxCorrection; u != 0 && !(u >= 1 && !math.IsInf(u, 0)) {
		return nil, fmt.Errorf("SLUICE_DIRAC_USER_MAX_CORRECTION: %v is not a number ≥ 1 (or 0: DIRAC_MAX_CORRECTION's)", u)
	}
	dc.MaxUserCorrection = s.DIRACUserMaxCorrection
	return NewDIRAC(dc), nil
}

// DIRACGroup is one group's configuration under DIRAC's policy.
type DIRACGroup struct {
	// Priority is the group's share (DIRAC's JobShare).
	Priority float64
	// JobSharing makes the group's users share one share and one priority
	// (a production group); otherwise every user with waiting work has a
	// share of their own and the group's priority is divided among them.
	JobSharing bool
	// AllowBackground lets a share whose waiting DTRs have, on average, a
	// RealPriority of 0.1 or less (in practice: all at user priority 1) run
	// in the background: only on slots that no other share can use
	// (DIRAC's AllowBackgroundTQs).
	AllowBackground bool
}

// DIRACSlice is one time window of the history correction.
type DIRACSlice struct {
	Span          time.Duration
	Weight        float64
	MaxCorrection float64
}

// Usage units: what a policy with a history charges a share for.
const (
	UnitSlotSeconds = "seconds" // how long the grant held its slot
	UnitBytes       = "bytes"   // the bytes a transfer moved (byte-fair)
	UnitFiles       = "files"   // one per grant
)

// ParseUnit checks a usage unit: "files", "bytes" or "seconds" (any
// case); empty stays empty (the policy's default).
func ParseUnit(s string) (string, error) {
	switch u := strings.ToLower(strings.TrimSpace(s)); u {
	case "", UnitSlotSeconds, UnitBytes, UnitFiles:
		return u, nil
	}
	return "", fmt.Errorf("usage unit %q is not files, bytes or seconds", s)
}

// DIRACConfig configures DIRAC's policy.
type DIRACConfig struct {
	// Groups by group name, as core.SharePolicy names them (voms:vo gives
	// "atlas", voms:group "atlas:higgs", ...). An unlisted group has the
	// entry of core.DefaultShare, or priority 1 without job sharing.
	Groups map[string]DIRACGroup
	// Slices of usage history for the correction; none turns it off.
	Slices []DIRACSlice
	// MaxGlobalCorrection bounds the total correction to [1/G, G];
	// default 5.
	MaxGlobalCorrection float64
	// Unit is what usage is counted in: UnitSlotSeconds (default),
	// UnitBytes or UnitFiles.
	Unit string
	// UserSlices correct how a group without job sharing divides its
	// corrected weight among its users, from their usage inside the group
	// (DIRAC's corrector of one group); nil takes Slices.
	// MaxUserCorrection bounds a user's total correction to [1/U, U]
	// (0: MaxGlobalCorrection). NoUserCorrection divides a group's
	// weight equally among its users.
	UserSlices        []DIRACSlice
	MaxUserCorrection float64
	NoUserCorrection  bool
}

// DIRAC is DIRAC's priority schema on Sluice's slots:
//
//   - The share of a DTR is its group if the group has JobSharing, else
//     "<group>|<DN>": one share per user of the group.
//   - A sharing group's share weighs the group's priority; a user's share
//     weighs the group's priority divided by the number of the group's
//     users with work in the state (and direction).
//   - Weights are corrected from usage history in two levels, as DIRAC's
//     share correctors do: first the groups with work, each as a whole
//     (the usage of all its users), then, inside a group without job
//     sharing, its users. At each level, for each slice k with usage H_k
//     (summed over its span) and total T_k over the entities present,
//     c_ek = clamp(n_e / (H_k[e]/T_k), 1/M_k, M_k), where n_e = S_e/ΣS is
//     the entity's expected part; the correction is C_e = clamp(Σ_k
//     w_k·c_ek / Σ_k w_k, 1/G, G). A group weighs S_g·C_g. Its users
//     (with work in the state and direction) each expect an equal part
//     of that, corrected with the user slices and bound (UserSlices,
//     MaxUserCorrection): user u weighs S_g·C_g·C_u/Σ_v C_v, so the user
//     level moves slots between the group's users and never changes the
//     group's total.
//   - Inside a share, DTRs go by user priority. DIRAC's RealPriority maps
//     the lowest user priority (1) to 1e-5 and the highest (100) to 1e6; a
//     share of a group with AllowBackground whose waiting DTRs average a
//     RealPriority of 0.1 or less is a background share: it gets only the
//     slots the other shares cannot use (DIRAC gives it a tiny priority,
//     0.001, which still takes slots from the others by chance).
//
// Where DIRAC's code is known to be wrong Sluice does the principled thing:
// a share with no usage in a slice gets that slice's maximum correction
// weighted like any other (DIRAC adds M_k unweighted); a slice with no
// usage at all is left out of the weights' sum as well as the sum (DIRAC
// keeps its weight, shrinking every correction); and there is no weighted
// random pick, whose ORDER BY RAND()/w is not proportional: the weights go
// to the exact water-filling split. DIRAC multiplies users' shares by
// their corrections without scaling them back to the group's, so a
// group's total drifts with how its users' corrections happen to add up;
// Sluice scales them so that the group keeps its corrected weight. DIRAC
// has a user corrector only for the groups it is configured for; Sluice
// has one for all groups without job sharing, by default with the
// groups' slices. DIRAC splits an entity's priority
// among its task queues by the sum of their jobs' user priorities; a Sluice
// share has one queue per state, so that factor is 1 and user priority
// orders the DTRs inside the queue instead.
type DIRAC struct {
	env core.PolicyEnv
	cfg DIRACConfig
	// shares maps a share name (without direction) to its group and user.
	shares map[string]diracEntity
	// history holds, per state and share, the usage in each slice; groups
	// the same per state and group (with direction suffix), for the group
	// level.
	history map[dtr.State]map[string][]*window
	groups  map[dtr.State]map[string][]*window
}

type diracEntity struct{ group, user string }

// NewDIRAC returns a maker of DIRAC's policy for core.Config.Policy.
func NewDIRAC(cfg DIRACConfig) core.PolicyMaker {
	if cfg.MaxGlobalCorrection <= 0 {
		cfg.MaxGlobalCorrection = 5
	}
	if cfg.Unit == "" {
		cfg.Unit = UnitSlotSeconds
	}
	if cfg.UserSlices == nil {
		cfg.UserSlices = cfg.Slices
	}
	if cfg.NoUserCorrection {
		cfg.UserSlices = nil
	}
	if cfg.MaxUserCorrection <= 0 {
		cfg.MaxUserCorrection = cfg.MaxGlobalCorrection
	}
	return func(env core.PolicyEnv) core.Policy {
		return &DIRAC{env: env, cfg: cfg, shares: map[string]diracEntity{},
			history: map[dtr.State]map[string][]*window{}, groups: map[dtr.State]map[string][]*window{}}
	}
}

// Name implements Policy.
func (*DIRAC) Name() string { return "dirac" }

func (p *DIRAC) group(name string) DIRACGroup {
	if g, ok := p.cfg.Groups[name]; ok {
		return g
	}
	if g, ok := p.cfg.Groups[core.DefaultShare]; ok {
		return g
	}
	return DIRACGroup{Priority: 1}
}

// Share implements Policy.
func (p *DIRAC) Share(d *dtr.DTR) string {
	g := p.env.ShareName(d.Owner)
	name, user := g, ""
	if !p.group(g).JobSharing {
		user = d.Owner.DN
		name = g + "|" + user
	}
	if _, ok := p.shares[name]; !ok {
		p.shares[name] = diracEntity{group: g, user: user}
	}
	return name
}

// Priority implements Policy: the user priority.
func (*DIRAC) Priority(_ string, d *dtr.DTR) int { return userPriority(d) }

// entity returns the group of a share name with its direction suffix, and
// the suffix.
func (p *DIRAC) entity(share string) (diracEntity, string) {
	base, suffix := core.CutDirection(share)
	if e, ok := p.shares[base]; ok {
		return e, suffix
	}
	// Restored before this policy saw it: a user's share is "group|DN".
	if e, ok := p.userShare(base); ok {
		return e, suffix
	}
	return diracEntity{group: base}, suffix
}

// userShare reads a user's share name "group|DN" that Share did not make
// in this process. Either part may hold '|' itself (with the dn share
// policy the group is the DN, and an OIDC subject such as auth0|123 is a
// DN), so every '|' is a possible cut, and the one taken is, in order:
//  1. the cut whose group is the share the user's DN alone is in (the dn
//     policy: the group is the DN; the name is then "X|X");
//  2. the cut after the longest configured group that divides between
//     its users;
//  3. the first '|' (a VO or group name holds none; a DN may).
//
// A name without '|' is no user's share.
func (p *DIRAC) userShare(base string) (diracEntity, bool) {
	var cuts []int
	for i := range len(base) {
		if base[i] == '|' {
			cuts = append(cuts, i)
		}
	}
	if len(cuts) == 0 {
		return diracEntity{}, false
	}
	split := func(i int) diracEntity { return diracEntity{group: base[:i], user: base[i+1:]} }
	if p.env.ShareName != nil {
		for _, i := range cuts {
			if e := split(i); p.env.ShareName(dtr.Identity{DN: e.user}) == e.group {
				return e, true
			}
		}
	}
	for _, i := range slices.Backward(cuts) {
		if g, ok := p.cfg.Groups[base[:i]]; ok && !g.JobSharing {
			return split(i), true
		}
	}
	return split(cuts[0]), true
}

// Weigh implements Policy: group level, then user level (see DIRAC).
func (p *DIRAC) Weigh(now time.Time, state dtr.State, shares []core.ShareDemand) {
	// The groups with work, by name with direction suffix, and the users
	// with work in each.
	groupOf := make([]int, len(shares))
	index := map[string]int{}
	var names []string
	var users [][]int
	for i, s := range shares {
		e, suffix := p.entity(s.Name)
		g, ok := index[e.group+suffix]
		if !ok {
			g = len(names)
			index[e.group+suffix] = g
			names = append(names, e.group+suffix)
			users = append(users, nil)
		}
		groupOf[i] = g
		if s.Demand > 0 && e.user != "" {
			users[g] = append(users[g], i)
		}
	}
	gS := make([]float64, len(names))
	for i, s := range shares {
		if s.Demand > 0 {
			e, _ := p.entity(s.Name)
			gS[groupOf[i]] = p.group(e.group).Priority
		}
	}
	gW := slices.Clone(gS)
	if len(p.cfg.Slices) > 0 {
		C := DIRACCorrection(gS, p.usage(now, p.groups[state], names, len(p.cfg.Slices)), p.cfg.Slices, p.cfg.MaxGlobalCorrection)
		for g := range gW {
			gW[g] *= C[g]
		}
	}
	W := make([]float64, len(shares))
	for i, s := range shares {
		if e, _ := p.entity(s.Name); s.Demand > 0 && e.user == "" {
			W[i] = gW[groupOf[i]]
		}
	}
	for g, members := range users {
		p.divide(now, state, shares, members, gW[g], W)
	}
	for i := range shares {
		shares[i].Weight = max(1, int64(math.Round(W[i]*1e6)))
		shares[i].Tier = 0
		if e, _ := p.entity(shares[i].Name); p.group(e.group).AllowBackground && background(shares[i].Queued) {
			shares[i].Tier = -1
		}
	}
}

// divide gives the users members (indices into shares) of one group their
// parts of the group's weight w, in W: equal parts corrected by their
// usage inside the group, scaled back to w.
func (p *DIRAC) divide(now time.Time, state dtr.State, shares []core.ShareDemand, members []int, w float64, W []float64) {
	if len(members) == 0 {
		return
	}
	C := make([]float64, len(members))
	for j := range C {
		C[j] = 1
	}
	if len(p.cfg.UserSlices) > 0 && len(members) > 1 {
		S := make([]float64, len(members))
		names := make([]string, len(members))
		for j, i := range members {
			S[j], names[j] = 1, shares[i].Name
		}
		C = DIRACCorrection(S, p.usage(now, p.history[state], names, len(p.cfg.UserSlices)), p.cfg.UserSlices, p.cfg.MaxUserCorrection)
	}
	sum := 0.0
	for _, c := range C {
		sum += c
	}
	for j, i := range members {
		W[i] = w * C[j] / sum
	}
}

// usage returns H[k][e], the usage of each named entity in each of n
// slices, from its windows in byName.
func (p *DIRAC) usage(now time.Time, byName map[string][]*window, names []string, n int) [][]float64 {
	H := make([][]float64, n)
	for k := range H {
		H[k] = make([]float64, len(names))
		for e, name := range names {
			if ws := byName[name]; ws != nil {
				H[k][e] = ws[k].sum(now)
			}
		}
	}
	return H
}

// PickWeight implements lottery: inside a share DIRAC picks a DTR at
// random, weighted by its RealPriority. DIRAC's ORDER BY RAND()/w is not
// proportional to w; Sluice's exponential race is, exactly.
func (*DIRAC) PickWeight(prio int) float64 { return RealPriority(prio) }

// RealPriority is DIRAC's mapping of a user priority: the lowest becomes
// 1e-5, the highest 1e6, the others stay.
func RealPriority(p int) float64 {
	switch {
	case p <= 1:
		return 1e-5
	case p >= 100:
		return 1e6
	}
	return float64(p)
}

// background reports whether waiting DTRs counted by priority average a
// RealPriority of at most 0.1.
func background(hist *[101]int32) bool {
	if hist == nil {
		return false
	}
	n, sum := 0, 0.0
	for p, k := range hist {
		if k > 0 {
			n += int(k)
			sum += float64(k) * RealPriority(p)
		}
	}
	return n > 0 && sum/float64(n) <= 0.1
}

// DIRACCorrection returns each entity's correction factor C_e from its
// expected share S[e] and its usage H[k][e] in each slice k (see DIRAC).
// Entities with S[e] = 0 take no part and get 1.
func DIRACCorrection(S []float64, H [][]float64, slices []DIRACSlice, maxGlobal float64) []float64 {
	C := make([]float64, len(S))
	sumS := 0.0
	for _, s := range S {
		sumS += s
	}
	sum := make([]float64, len(S))
	weights := 0.0
	for k, sl := range slices {
		T := 0.0
		for e := range S {
			if S[e] > 0 {
				T += H[k][e]
			}
		}
		if T == 0 || sl.Weight <= 0 {
			continue // no usage in this slice: nothing to correct from
		}
		M := max(sl.MaxCorrection, 1)
		weights += sl.Weight
		for e := range S {
			if S[e] == 0 {
				continue
			}
			c := M // no usage at all: as far below its share as allowed
			if H[k][e] > 0 {
				c = min(max((S[e]/sumS)/(H[k][e]/T), 1/M), M)
			}
			sum[e] += sl.Weight * c
		}
	}
	G := max(maxGlobal, 1)
	for e := range S {
		C[e] = 1
		if weights > 0 && S[e] > 0 {
			C[e] = min(max(sum[e]/weights, 1/G), G)
		}
	}
	return C
}

// Charge implements Policy: the usage goes into every slice's window, of
// the share (a user's, for the user level) and of its group.
func (p *DIRAC) Charge(now time.Time, state dtr.State, d *dtr.DTR, held time.Duration, bytes int64) {
	if len(p.cfg.Slices) == 0 && len(p.cfg.UserSlices) == 0 {
		return
	}
	var amount float64
	switch p.cfg.Unit {
	case UnitBytes:
		amount = float64(bytes)
	case UnitFiles:
		amount = 1
	default:
		amount = held.Seconds()
	}
	if amount <= 0 {
		return
	}
	e, suffix := p.entity(d.Share)
	if e.user != "" {
		chargeWindows(p.history, state, d.Share, p.cfg.UserSlices, now, amount)
	}
	chargeWindows(p.groups, state, e.group+suffix, p.cfg.Slices, now, amount)
}

// chargeWindows adds amount to the windows of name in state, made for
// spans if it has none.
func chargeWindows(h map[dtr.State]map[string][]*window, state dtr.State, name string, spans []DIRACSlice, now time.Time, amount float64) {
	if len(spans) == 0 {
		return
	}
	byName := h[state]
	if byName == nil {
		byName = map[string][]*window{}
		h[state] = byName
	}
	ws := byName[name]
	if ws == nil {
		for _, sl := range spans {
			ws = append(ws, newWindow(sl.Span))
		}
		byName[name] = ws
	}
	for _, w := range ws {
		w.add(now, amount)
	}
}

// window sums amounts over the last span in 60 buckets: an amount leaves
// the sum between span and span·61/60 after it was added.
type window struct {
	width   time.Duration
	buckets [60]float64
	// head is the index, since the epoch, of the newest bucket.
	head int64
}

func newWindow(span time.Duration) *window {
	return &window{width: max(span/60, time.Nanosecond)}
}

func (w *window) advance(now time.Time) {
	i := now.UnixNano() / int64(w.width)
	if i <= w.head {
		return
	}
	for j := w.head + 1; j <= i && j <= w.head+60; j++ {
		w.buckets[j%60] = 0
	}
	w.head = i
}

func (w *window) add(now time.Time, amount float64) {
	w.advance(now)
	w.buckets[w.head%60] += amount
}

func (w *window) sum(now time.Time) float64 {
	w.advance(now)
	s := 0.0
	for _, b := range w.buckets {
		s += b
	}
	return s
}

// ParseDIRACGroups reads "group=priority[:sharing][:background],..." as
// in "lhcb_prod=100:sharing,lhcb_user=50:background".
func ParseDIRACGroups(s string) (map[string]DIRACGroup, error) {
	out := map[string]DIRACGroup{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, rest, ok := strings.Cut(item, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("DIRAC group %q: want group=priority[:sharing]", item)
		}
		parts := strings.Split(rest, ":")
		var g DIRACGroup
		var err error
		if g.Priority, err = strconv.ParseFloat(parts[0], 64); err != nil || !(g.Priority > 0) || math.IsInf(g.Priority, 0) {
			return nil, fmt.Errorf("DIRAC group %q: priority %q is not a positive number", name, parts[0])
		}
		for _, flag := range parts[1:] {
			switch flag {
			case "sharing":
				g.JobSharing = true
			case "background":
				g.AllowBackground = true
			default:
				return nil, fmt.Errorf("DIRAC group %q: flag %q is not \"sharing\" or \"background\"", name, flag)
			}
		}
		out[name] = g
	}
	return out, nil
}

// ParseDIRACSlices reads "span:weight:maxcorrection,..." as in
// "168h:80:2,1h:20:5".
func ParseDIRACSlices(s string) ([]DIRACSlice, error) {
	var out []DIRACSlice
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		parts := strings.Split(item, ":")
		if len(parts) != 3 {
			return nil, fmt.Errorf("DIRAC slice %q: want span:weight:maxcorrection", item)
		}
		span, err := time.ParseDuration(parts[0])
		if err != nil || span <= 0 {
			return nil, fmt.Errorf("DIRAC slice %q: span %q is not a positive duration", item, parts[0])
		}
		var sl DIRACSlice
		sl.Span = span
		if sl.Weight, err = strconv.ParseFloat(parts[1], 64); err != nil || !(sl.Weight > 0) || math.IsInf(sl.Weight, 0) {
			return nil, fmt.Errorf("DIRAC slice %q: weight %q is not a positive number", item, parts[1])
		}
		if sl.MaxCorrection, err = strconv.ParseFloat(parts[2], 64); err != nil || !(sl.MaxCorrection >= 1) || math.IsInf(sl.MaxCorrection, 0) {
			return nil, fmt.Errorf("DIRAC slice %q: max correction %q is not a number ≥ 1", item, parts[2])
		}
		out = append(out, sl)
	}
	return out, nil
}
