package transfer

import (
	"context"
	"net/http"
	"strconv"
)

// HeaderSciTag is the request header that carries a transfer's packet
// marking (SciTags: experiment id << 6 | activity id, in decimal) to
// storage, which marks the packets of the flow it serves.
const HeaderSciTag = "SciTag"

// sciTagKey is the context key of a transfer's SciTag.
type sciTagKey struct{}

// WithSciTag returns a context under which every HTTP request the Client
// sends (GET, PUT, and any other request of the transfer, a third-party
// COPY included) carries tag in its SciTag header, at every redirect hop.
// A tag of 0 marks nothing.
func WithSciTag(ctx context.Context, tag int) context.Context {
	if tag <= 0 {
		return ctx
	}
	return context.WithValue(ctx, sciTagKey{}, tag)
}

// sciTagTransport sets the SciTag header of requests whose context holds
// one, on a copy of the request.
type sciTagTransport struct{ base http.RoundTripper }

func (t *sciTagTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if tag, ok := req.Context().Value(sciTagKey{}).(int); ok {
		req = req.Clone(req.Context())
		req.Header.Set(HeaderSciTag, strconv.Itoa(tag))
	}
	return t.base.RoundTrip(req)
}

func (t *sciTagTransport) CloseIdleConnections() { closeIdle(t.base) }
