package tracing

import (
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// Sluice's own span attributes, beside the semantic conventions'
// (messaging.*, error.type). A DTR has two ends, and every span of its
// trace is a messaging span, whose server.address would be the NATS
// server's: the ends' hosts have attributes of their own.
const (
	// KeyDTRID is the DTR's id: every span of a DTR's trace has it.
	KeyDTRID = attribute.Key("sluice.dtr.id")
	// KeyJobID is the id of the job the DTR belongs to, if any.
	KeyJobID = attribute.Key("sluice.job.id")
	// KeyShare is the share the scheduler put the DTR in.
	KeyShare = attribute.Key("sluice.share")
	// KeyStage is the worker stage of a grant: pre, delivery or post.
	KeyStage = attribute.Key("sluice.stage")
	// KeyBytes is the bytes a grant moved.
	KeyBytes = attribute.Key("sluice.bytes")
	// KeySourceAddress and KeyDestinationAddress are the hosts of the
	// DTR's source and destination (none for a local file): hosts only,
	// never a URL, its credentials or its query.
	KeySourceAddress      = attribute.Key("sluice.source.address")
	KeyDestinationAddress = attribute.Key("sluice.destination.address")
)

// SetDTR sets on span, if it is recorded, what makes the spans of d
// searchable: its id, its job, its share, the stage (if not empty) and
// the hosts of its ends. Nothing is built for a span not recorded.
func SetDTR(span trace.Span, d *dtr.DTR, stage dtr.Stage) {
	if d == nil || !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 6)
	attrs = append(attrs, KeyDTRID.String(d.ID.String()))
	if d.JobID != "" {
		attrs = append(attrs, KeyJobID.String(d.JobID))
	}
	if d.Share != "" {
		attrs = append(attrs, KeyShare.String(d.Share))
	}
	if stage != "" {
		attrs = append(attrs, KeyStage.String(string(stage)))
	}
	src, dst := Host(d.Source), Host(d.Destination)
	if src != "" {
		attrs = append(attrs, KeySourceAddress.String(src))
	}
	if dst != "" {
		attrs = append(attrs, KeyDestinationAddress.String(dst))
	}
	span.SetAttributes(attrs...)
}

// SetResult sets on span, if it is recorded, the bytes a grant moved (if
// any) and, for a failure, its kind as error.type.
func SetResult(span trace.Span, bytes int64, failure *dtr.Failure) {
	if !span.IsRecording() {
		return
	}
	if bytes > 0 {
		span.SetAttributes(KeyBytes.Int64(bytes))
	}
	if failure != nil && failure.Kind != "" {
		span.SetAttributes(semconv.ErrorTypeKey.String(string(failure.Kind)))
	}
}

// Host returns the host of a storage URL, without its port, user,
// password, path or query; "" for a local file or what is not a URL.
func Host(rawURL string) string {
	scheme, _, ok := strings.Cut(rawURL, "://")
	if !ok || strings.EqualFold(scheme, "file") {
		return ""
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	return u.Hostname()
}
