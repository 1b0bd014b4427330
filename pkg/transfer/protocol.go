package transfer

import (
	"context"
	"net/url"
)

// protocol is what Sluice needs of a storage protocol; each URL scheme has
// one (file; http, https, dav, davs; s3, s3s; root). Client's exported
// methods parse the URL, pick the protocol and call it; Copy opens the
// source with one protocol and writes with another. The conformance suite
// (conformance_test.go) runs the same operations against every one.
type protocol interface {
	// stat describes an object; a missing one is Info{Exists: false}.
	stat(ctx context.Context, op string, e endpoint) (Info, error)
	// remove deletes an object; a missing one is not an error.
	remove(ctx context.Context, op string, e endpoint) error
	// makeParents makes what must exist before an object can be written.
	makeParents(ctx context.Context, op string, e endpoint) error
	// open opens an object for reading.
	open(ctx context.Context, e endpoint) (*source, error)
	// write streams a source into an object through the pump and, on
	// failure, leaves nothing of its own behind.
	write(ctx context.Context, in *source, p *pump, src string, dst endpoint, opt CopyOptions) (int64, *Error)
	// rename puts the object from (parsed: fu) in place at to (tu),
	// replacing what is there; only schemes that dtr.SchemeTable says
	// rename are asked.
	rename(ctx context.Context, op, from, to string, fu, tu *url.URL) error
}

// protocols holds the protocol of every scheme of dtr.SchemeTable: adding
// a protocol is a file that implements it, an entry here, a row of the
// scheme table and a row of the conformance suite.
var protocols = map[string]func(*Client) protocol{
	"file":  func(c *Client) protocol { return fileProtocol{c} },
	"http":  func(c *Client) protocol { return httpProtocol{c} },
	"https": func(c *Client) protocol { return httpProtocol{c} },
	"dav":   func(c *Client) protocol { return httpProtocol{c} },
	"davs":  func(c *Client) protocol { return httpProtocol{c} },
	"s3":    func(c *Client) protocol { return s3Protocol{c} },
	"s3s":   func(c *Client) protocol { return s3Protocol{c} },
	"root":  func(c *Client) protocol { return xrootdProtocol{c} },
}

// protocol returns the protocol of a URL that parseURL accepted.
func (c *Client) protocol(u *url.URL) protocol {
	if p, ok := protocols[u.Scheme]; ok {
		return p(c)
	}
	return httpProtocol{c} // parseURL refused every other scheme
}
