package fairshare

import (
	"fmt"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// ByteFairSettings make the transfer shares of any policy fair in bytes.
type ByteFairSettings struct {
	ByteFair    time.Duration `envconfig:"BYTEFAIR" desc:"make transfer shares fair in bytes under any policy, learning each share's bytes per slot-second over this span (e.g. 10m); empty: off"`
	ByteFairMax float64       `envconfig:"BYTEFAIR_MAX" default:"20" desc:"byte-fair shares: the most a share's transfer weight is multiplied or divided by"`
}

// Wrap returns inner made byte-fair if the span is set, else inner.
func (s ByteFairSettings) Wrap(inner core.PolicyMaker) (core.PolicyMaker, error) {
	if s.ByteFair < 0 {
		return nil, fmt.Errorf("byte-fair span %s is negative", s.ByteFair)
	}
	if s.ByteFair == 0 {
		return inner, nil
	}
	return ByteFair(inner, s.ByteFair, s.ByteFairMax), nil
}

// ByteFair wraps any policy so that its transfer shares are fair in bytes
// rather than in slots. Over the last span it learns each share's rate,
// the bytes its transfers moved per second of slot held, and divides the
// share's weight in TRANSFER by that rate relative to the mean of all
// shares' rates (within [1/M, M]): a share of many small files, which
// moves few bytes per slot, gets more slots, one of large files fewer, so
// that the bytes each moves follow the policy's weights. A flood of small
// files then cannot crowd out large ones, nor the other way round. Other
// states are weighed as the policy weighs them. A nil inner is ARC's.
func ByteFair(inner core.PolicyMaker, span time.Duration, maxCorrection float64) core.PolicyMaker {
	return func(env core.PolicyEnv) core.Policy {
		p := core.NewARC(env)
		if inner != nil {
			p = inner(env)
		}
		return &byteFair{Policy: p, span: span, max: max(maxCorrection, 1),
			moved: map[string]*window{}, held: map[string]*window{}}
	}
}

type byteFair struct {
	core.Policy
	span time.Duration
	max  float64
	// Per share over the span: bytes moved, and seconds of slot held.
	moved, held map[string]*window
}

// Name implements Policy.
func (p *byteFair) Name() string { return p.Policy.Name() + "+bytes" }

// Unwrap returns the wrapped policy.
func (p *byteFair) Unwrap() core.Policy { return p.Policy }

// Weigh implements Policy.
func (p *byteFair) Weigh(now time.Time, state dtr.State, shares []core.ShareDemand) {
	p.Policy.Weigh(now, state, shares)
	if state != dtr.Transfer {
		return
	}
	rates := make([]float64, len(shares))
	sum, known := 0.0, 0
	for i, s := range shares {
		if m, h := p.moved[s.Name], p.held[s.Name]; m != nil && h != nil {
			if b, sec := m.sum(now), h.sum(now); b > 0 && sec > 0 {
				rates[i] = b / sec
				sum += rates[i]
				known++
			}
		}
	}
	if known == 0 {
		return
	}
	mean := sum / float64(known)
	for i := range shares {
		c := 1.0
		if rates[i] > 0 {
			c = min(max(mean/rates[i], 1/p.max), p.max)
		}
		shares[i].Weight = max(1, int64(float64(shares[i].Weight)*1000*c))
	}
}

// Charge implements Policy.
func (p *byteFair) Charge(now time.Time, state dtr.State, d *dtr.DTR, held time.Duration, bytes int64) {
	p.Policy.Charge(now, state, d, held, bytes)
	if state != dtr.Transfer || bytes <= 0 || held <= 0 {
		return
	}
	add := func(m map[string]*window, v float64) {
		w := m[d.Share]
		if w == nil {
			w = newWindow(p.span)
			m[d.Share] = w
		}
		w.add(now, v)
	}
	add(p.moved, float64(bytes))
	add(p.held, held.Seconds())
}
