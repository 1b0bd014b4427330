package core

import (
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// Policy is a fair-share scheme: it names the share of each DTR, orders the
// DTRs inside a share, and weighs the shares that have work in a state.
// The core does the rest the same way for every policy: it turns the
// weights into slots (water-filling, leftovers by slot-time deficit,
// whole slots to pay back an over-served share),
// hands out emergency slots, applies maxprepared, leases, retries and
// ageing. ARC's proportional split (ARC) is the default.
type Policy interface {
	// Name is the policy's name in the configuration.
	Name() string
	// Share names the share of a new DTR; the core appends the direction
	// ("-download", "-upload"), so that uploads are never starved by
	// downloads.
	Share(d *dtr.DTR) string
	// Priority is a DTR's priority inside its share, 1–100: higher goes
	// first, equals in order of arrival.
	Priority(share string, d *dtr.DTR) int
	// Weigh sets the Weight of each share with work in a state. On entry
	// Weight holds the share's configured priority (ARC's weight).
	Weigh(now time.Time, state dtr.State, shares []ShareDemand)
	// Charge tells the policy that a grant of d ended: it held a slot of
	// state for held, and moved bytes (0 outside delivery).
	Charge(now time.Time, state dtr.State, d *dtr.DTR, held time.Duration, bytes int64)
}

// lottery is implemented by a policy that picks inside a share at random,
// each waiting DTR with a chance in proportion to PickWeight of its
// priority, instead of strictly by priority.
type lottery interface{ PickWeight(prio int) float64 }

// ageless is implemented by a policy that wants no priority ageing (SAM's
// scheme assumes the queue does not age).
type ageless interface{ Ageless() bool }

// innermost returns the policy a wrapper (one with an Unwrap() Policy
// method, such as the byte-fair wrapper) wraps, for the optional
// interfaces (lottery, ageless).
func innermost(p Policy) Policy {
	for {
		u, ok := p.(interface{ Unwrap() Policy })
		if !ok {
			return p
		}
		p = u.Unwrap()
	}
}

// PolicyEnv is what a policy may read of the core: how a DTR's share is
// named (the share policy), and the shares' configured priorities, which a
// reconfigure may change while the policy runs.
type PolicyEnv struct {
	ShareName     func(dtr.Identity) string
	SharePriority func(share string) int
	// ShareOf names a DTR's share under the share policy, with its
	// activity under an activity policy (SharePolicy.ShareOf); nil means
	// ShareName of its owner.
	ShareOf func(*dtr.DTR) string
}

// PolicyMaker makes a policy for a core (Config.Policy).
type PolicyMaker func(PolicyEnv) Policy

// ARC is ARC's policy: shares named by the share policy (dn, voms:vo, …),
// each weighted by its configured priority, a DTR's priority the share's
// priority times its user priority over 100. The other policies are in
// package fairshare.
type ARC struct{ env PolicyEnv }

// NewARC returns ARC's policy for a core, the one the core runs when
// Config.Policy is nil; a wrapper of the default policy starts from it.
func NewARC(env PolicyEnv) Policy { return ARC{env} }

// Name implements Policy.
func (ARC) Name() string { return "arc" }

// Share implements Policy.
func (p ARC) Share(d *dtr.DTR) string {
	if p.env.ShareOf != nil {
		return p.env.ShareOf(d)
	}
	return p.env.ShareName(d.Owner)
}

// Priority implements Policy.
func (p ARC) Priority(share string, d *dtr.DTR) int {
	return DTRPriority(p.env.SharePriority(share), d.UserPriority)
}

// Weigh implements Policy: the configured priorities are the weights.
func (ARC) Weigh(time.Time, dtr.State, []ShareDemand) {}

// Charge implements Policy: ARC keeps no history.
func (ARC) Charge(time.Time, dtr.State, *dtr.DTR, time.Duration, int64) {}

// Policy returns the policy in force.
func (c *Core) Policy() Policy { return c.policy }
