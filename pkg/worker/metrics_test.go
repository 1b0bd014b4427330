package worker

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// activeByStage collects sluice.worker.active from reader, by stage.
func activeByStage(t *testing.T, reader sdkmetric.Reader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "sluice.worker.active" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				stage, _ := dp.Attributes.Value(attribute.Key("stage"))
				got[stage.AsString()] += dp.Value
			}
		}
	}
	return got
}

func TestEveryPoolOfAProcessReportsItsOwnActiveGrantsOnOneMeter(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	meter := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test")
	want := map[string]int64{"pre": 1, "delivery": 3, "post": 2}
	var ends []func(api.Result, time.Duration)
	for _, stage := range []dtr.Stage{dtr.StagePre, dtr.StageDelivery, dtr.StagePost} {
		in, err := newInstruments(meter, stage)
		if err != nil {
			t.Fatal(err)
		}
		for range want[string(stage)] {
			in.started()
			ends = append(ends, func(res api.Result, took time.Duration) { in.ended(context.Background(), res, took) })
		}
	}
	got := activeByStage(t, reader)
	for stage, n := range want {
		if got[stage] != n {
			t.Errorf("sluice.worker.active{stage=%q} = %d, want %d (all: %v)", stage, got[stage], n, got)
		}
	}
	for _, end := range ends {
		end(api.Result{}, time.Millisecond)
	}
	for stage, n := range activeByStage(t, reader) {
		if n != 0 {
			t.Errorf("sluice.worker.active{stage=%q} = %d once every grant ended, want 0", stage, n)
		}
	}
}

// grantsByOutcome collects sluice.worker.grants from reader, by outcome.
func grantsByOutcome(t *testing.T, reader sdkmetric.Reader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "sluice.worker.grants" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				outcome, _ := dp.Attributes.Value(attribute.Key("outcome"))
				got[outcome.AsString()] += dp.Value
			}
		}
	}
	return got
}

// A chained grant's result carries two grants' outcomes: both count.
func TestAChainedGrantsResultCountsBothGrantsHandled(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	in, err := newInstruments(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test"), dtr.StagePre)
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range []api.Result{
		{Then: &api.Result{}},
		{Then: &api.Result{Error: &dtr.Failure{Kind: dtr.ErrPermanentRemote}}},
		{Error: &dtr.Failure{Kind: dtr.ErrTemporaryRemote}},
	} {
		in.started()
		in.ended(context.Background(), res, time.Millisecond)
	}
	got := grantsByOutcome(t, reader)
	want := map[string]int64{"ok": 3, string(dtr.ErrPermanentRemote): 1, string(dtr.ErrTemporaryRemote): 1}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("sluice.worker.grants{outcome=%q} = %d, want %d (all: %v)", k, got[k], n, got)
		}
	}
}
