package scheduler

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// registerMetrics publishes the monitor's latest overview as OpenTelemetry
// instruments, read when the metrics are collected.
func (s *Service) registerMetrics(meter metric.Meter) error {
	dtrs, err := meter.Int64ObservableGauge("sluice.scheduler.dtrs",
		metric.WithDescription("DTRs per share and queue state, queued or running"))
	if err != nil {
		return err
	}
	retrying, err := meter.Int64ObservableGauge("sluice.scheduler.retrying",
		metric.WithDescription("DTRs per share waiting to be tried again"))
	if err != nil {
		return err
	}
	// A limit and the use made of it are two gauges with the same labels,
	// so that one divides by the other and neither sums to nonsense.
	limit, err := meter.Int64ObservableGauge("sluice.scheduler.slots.limit",
		metric.WithDescription("the slots a queue state may use at once"))
	if err != nil {
		return err
	}
	used, err := meter.Int64ObservableGauge("sluice.scheduler.slots.used",
		metric.WithDescription("the slots of a queue state in use, emergency slots included"))
	if err != nil {
		return err
	}
	emergency, err := meter.Int64ObservableGauge("sluice.scheduler.slots.emergency",
		metric.WithDescription("the slots of a queue state in use above its limit"))
	if err != nil {
		return err
	}
	configured, err := meter.Float64ObservableGauge("sluice.scheduler.slots.configured",
		metric.WithDescription("the slots a share's configured weight gives it in a queue state"))
	if err != nil {
		return err
	}
	grants, err := meter.Int64ObservableCounter("sluice.scheduler.grants",
		metric.WithDescription("grants given; emergency=true those on emergency slots"))
	if err != nil {
		return err
	}
	retries, err := meter.Int64ObservableCounter("sluice.scheduler.retries",
		metric.WithDescription("failed attempts that are tried again"))
	if err != nil {
		return err
	}
	expiries, err := meter.Int64ObservableCounter("sluice.scheduler.lease.expiries",
		metric.WithDescription("grants whose worker stopped giving signs of life"))
	if err != nil {
		return err
	}
	finished, err := meter.Int64ObservableCounter("sluice.scheduler.finished",
		metric.WithDescription("DTRs that ended, by outcome: done, failed (ERROR) or cancelled"))
	if err != nil {
		return err
	}
	moved, err := meter.Int64ObservableCounter("sluice.scheduler.moved",
		metric.WithDescription("bytes of the DTRs that ended DONE, per share"), metric.WithUnit("By"))
	if err != nil {
		return err
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		ov := s.mon.overview()
		for _, l := range ov.Shares {
			share, state := attribute.String("share", l.Share), attribute.String("state", l.State.String())
			o.ObserveInt64(dtrs, int64(l.Queued), metric.WithAttributes(share, state, attribute.String("status", "queued")))
			o.ObserveInt64(dtrs, int64(l.Running), metric.WithAttributes(share, state, attribute.String("status", "running")))
			o.ObserveFloat64(configured, l.Configured, metric.WithAttributes(share, state))
		}
		for share, n := range ov.Retrying {
			o.ObserveInt64(retrying, int64(n), metric.WithAttributes(attribute.String("share", share)))
		}
		for _, st := range ov.States {
			state := attribute.String("state", st.State.String())
			ofState := metric.WithAttributes(state)
			o.ObserveInt64(limit, int64(st.Limit), ofState)
			o.ObserveInt64(used, int64(st.Busy), ofState)
			o.ObserveInt64(emergency, int64(st.Emergency), ofState)
		}
		c := ov.Counts
		o.ObserveInt64(grants, int64(c.Grants-c.EmergencyGrants), metric.WithAttributes(attribute.Bool("emergency", false)))
		o.ObserveInt64(grants, int64(c.EmergencyGrants), metric.WithAttributes(attribute.Bool("emergency", true)))
		o.ObserveInt64(retries, int64(c.Retries))
		o.ObserveInt64(expiries, int64(c.LeaseExpiries))
		o.ObserveInt64(finished, int64(c.Done), metric.WithAttributes(attribute.String("outcome", "done")))
		o.ObserveInt64(finished, int64(c.Failed), metric.WithAttributes(attribute.String("outcome", "failed")))
		o.ObserveInt64(finished, int64(c.Cancelled), metric.WithAttributes(attribute.String("outcome", "cancelled")))
		for share, f := range ov.Finished {
			o.ObserveInt64(moved, f.Bytes, metric.WithAttributes(attribute.String("share", share)))
		}
		return nil
	}, dtrs, retrying, limit, used, emergency, configured, grants, retries, expiries, finished, moved)
	if err != nil {
		return fmt.Errorf("scheduler metrics: %w", err)
	}
	return nil
}
