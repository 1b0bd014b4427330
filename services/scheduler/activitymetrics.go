package scheduler

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// registerActivityMetrics publishes the activity limits and their use
// (SLUICE_ACTIVITY_LIMITS), as two gauges with the same labels so that one
// divides by the other: one series per limit at its endpoint, or, for a
// limit at every endpoint ("*"), per endpoint where its transfers run.
func (s *Service) registerActivityMetrics(meter metric.Meter) error {
	limit, err := meter.Int64ObservableGauge("sluice.scheduler.activity.limit",
		metric.WithDescription("the transfers of an activity that may run at once at an endpoint as their source or destination"))
	if err != nil {
		return err
	}
	running, err := meter.Int64ObservableGauge("sluice.scheduler.activity.running",
		metric.WithDescription("the transfers of an activity running at an endpoint that an activity limit counts"))
	if err != nil {
		return err
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, l := range s.mon.activityLimits() {
			observe := func(endpoint string, n int) {
				at := metric.WithAttributes(attribute.String("activity", l.Activity), attribute.String("side", l.Side()),
					attribute.String("endpoint", endpoint))
				o.ObserveInt64(limit, int64(l.Max), at)
				o.ObserveInt64(running, int64(n), at)
			}
			if ep := l.Endpoint(); ep != core.AnyEndpoint {
				observe(ep, l.Running[ep])
				continue
			}
			for ep, n := range l.Running {
				observe(ep, n)
			}
		}
		return nil
	}, limit, running)
	if err != nil {
		return fmt.Errorf("scheduler activity metrics: %w", err)
	}
	return nil
}

// activityLimits returns the activity limits and their use at the latest
// sample (each sample makes new maps, never changed after).
func (m *monitor) activityLimits() []core.ActivityLimitUse {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now.ActivityLimits
}
