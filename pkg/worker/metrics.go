package worker

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// instruments are a pool's metrics.
type instruments struct {
	stage attribute.KeyValue
	// The attribute sets of every grant, made once (a set made at each
	// call cost more than the rest of a 1 KiB file's metrics).
	ofStage, ok metric.MeasurementOption
	grants      metric.Int64Counter
	// active counts the grants in hand, read when metrics are collected
	// (an up-down counter's two measurements per grant cost more).
	active   atomic.Int64
	bytes    metric.Int64Counter
	duration metric.Float64Histogram
}

func newInstruments(meter metric.Meter, stage dtr.Stage) (*instruments, error) {
	if meter == nil {
		meter = otel.GetMeterProvider().Meter("github.com/sluice-dtr/sluice/pkg/worker")
	}
	in := &instruments{stage: attribute.String("stage", string(stage))}
	in.ofStage = metric.WithAttributeSet(attribute.NewSet(in.stage))
	in.ok = metric.WithAttributeSet(attribute.NewSet(in.stage, attribute.String("outcome", "ok")))
	var err error
	if in.grants, err = meter.Int64Counter("sluice.worker.grants",
		metric.WithDescription("grants handled, by stage and outcome (ok, or the error kind)")); err != nil {
		return nil, fmt.Errorf("worker metrics: %w", err)
	}
	// Every pool of a process (pre, post and delivery under `sluice all`)
	// shares one meter, which hands each the same instrument: a callback
	// given when making it would be the first pool's alone, so each pool
	// registers its own.
	active, err := meter.Int64ObservableUpDownCounter("sluice.worker.active",
		metric.WithDescription("grants being handled now"))
	if err != nil {
		return nil, fmt.Errorf("worker metrics: %w", err)
	}
	if _, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(active, in.active.Load(), in.ofStage)
		return nil
	}, active); err != nil {
		return nil, fmt.Errorf("worker metrics: %w", err)
	}
	if in.bytes, err = meter.Int64Counter("sluice.worker.bytes",
		metric.WithDescription("bytes moved (delivery: the transfer rate is this counter's rate)"), metric.WithUnit("By")); err != nil {
		return nil, fmt.Errorf("worker metrics: %w", err)
	}
	if in.duration, err = meter.Float64Histogram("sluice.worker.duration",
		metric.WithDescription("time to handle a grant"), metric.WithUnit("s")); err != nil {
		return nil, fmt.Errorf("worker metrics: %w", err)
	}
	return in, nil
}

// started records a grant taken in hand; ended records its end.
func (in *instruments) started() { in.active.Add(1) }

// ended records the end of a grant started, its result res after took.
func (in *instruments) ended(ctx context.Context, res api.Result, took time.Duration) {
	outcome := in.ok
	if res.Error != nil {
		outcome = metric.WithAttributes(in.stage, attribute.String("outcome", string(res.Error.Kind)))
	}
	in.active.Add(-1)
	in.grants.Add(ctx, 1, outcome)
	in.duration.Record(ctx, took.Seconds(), in.ofStage)
	if t := res.Then; t != nil {
		// A chained grant's next step is a grant of its own, run in
		// the same hands (its time is in the chained grant's).
		outcome = in.ok
		if t.Error != nil {
			outcome = metric.WithAttributes(in.stage, attribute.String("outcome", string(t.Error.Kind)))
		}
		in.grants.Add(ctx, 1, outcome)
	}
}

// moved records bytes moved.
func (in *instruments) moved(ctx context.Context, n int64) {
	if n > 0 {
		in.bytes.Add(ctx, n, in.ofStage)
	}
}
