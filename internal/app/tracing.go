package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/sluice-dtr/sluice/pkg/bus/tracing"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// Tracing installs an OpenTelemetry tracer provider, so that every DTR's
// trace has real ids that the logs can name. Spans are exported, in
// batches, only when OTEL_TRACES_EXPORTER names an exporter (otlp, console;
// none: no export) or, if it is unset, when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (then over OTLP). The exporter
// is made by OpenTelemetry's autoexport from the standard variables:
// OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL (http/protobuf, the default, or
// grpc), _ENDPOINT, _HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE and
// the others. The service is named "sluice-<role>", or "sluice" for "all"
// and "demo", unless OTEL_SERVICE_NAME says otherwise; the sampler is
// OTEL_TRACES_SAMPLER's. The returned function exports what is left and
// stops.
func Tracing(ctx context.Context, role string) (shutdown func(context.Context) error, err error) {
	name := "sluice-" + role
	if role == "all" || role == "demo" {
		name = "sluice"
	}
	// Later options win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// over the role's name.
	res, err := resource.New(ctx, resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(name)), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("tracing resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	exp, err := spanExporter(ctx)
	if err != nil {
		return nil, err
	}
	if exp == nil {
		// Nowhere to send spans: a trace this process starts is not
		// sampled, so its spans carry ids for the logs but record nothing
		// (recording was an eighth of a scheduler's CPU). One that comes
		// in sampled, from a publisher or a role that exports, is still
		// recorded and passed on sampled. OTEL_TRACES_SAMPLER wins.
		if os.Getenv("OTEL_TRACES_SAMPLER") == "" {
			opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())))
		}
	} else {
		opts = append(opts, sdktrace.WithBatcher(exp))
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			// The exporter's errors may quote its endpoint's URL.
			slog.Warn("OpenTelemetry", "err", dtr.RedactText(err.Error()))
		}))
	}
	otel.SetTextMapPropagator(tracing.Propagator())
	tp := sdktrace.NewTracerProvider(opts...)
	otel.SetTracerProvider(tp)
	// The default sampler, and every "parentbased_*" one, drops what an
	// unsampled parent's child would be.
	sampler := os.Getenv("OTEL_TRACES_SAMPLER")
	tracing.SkipUnsampledSpans(sampler == "" || strings.HasPrefix(sampler, "parentbased_"))
	return tp.Shutdown, nil
}

// spanExporter returns the exporter the OTEL_* variables ask for, or nil
// when spans go nowhere: OTEL_TRACES_EXPORTER is "none", or it is unset
// and no OTLP endpoint is set either.
func spanExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	if os.Getenv("OTEL_TRACES_EXPORTER") == "" &&
		os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return nil, nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		// The error may quote an endpoint's URL.
		return nil, fmt.Errorf("trace exporter (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_*): %s", dtr.RedactText(err.Error()))
	}
	if autoexport.IsNoneSpanExporter(exp) {
		return nil, nil
	}
	return exp, nil
}
