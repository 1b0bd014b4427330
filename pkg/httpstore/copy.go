package httpstore

// HTTP third-party copy, as WLCG storages make it: a COPY request with a
// Source header asks the store to fetch that URL into the request's path
// (pull); one with a Destination header asks it to send the file at the
// request's path there (push). The store answers 201 at once and streams
// perf markers while the bytes move, then "success: Created" or
// "failure: <reason>". Headers named TransferHeader<Name> are sent to the
// remote side as <Name> (TransferHeaderAuthorization as Authorization).
// When the client goes away the copy stops and a partial file is removed,
// as a real storage does.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Refusal is how a store refuses third-party copy.
type Refusal int

// The refusals.
const (
	// RefuseNone makes the copies asked.
	RefuseNone Refusal = iota
	// RefuseStatus answers COPY with 501 Not Implemented.
	RefuseStatus
	// RefuseFailureLine answers 201 and then the failure line of a
	// storage whose third-party copy is turned off.
	RefuseFailureLine
)

// CopyOptions make a store answer COPY. Set them up before the store
// serves; the counters are safe for concurrent use.
type CopyOptions struct {
	// Client makes the requests to the remote storage (nil:
	// http.DefaultClient).
	Client *http.Client
	// MarkerEvery is how often a perf marker is sent: 100 ms if zero
	// (real storages send one every few seconds).
	MarkerEvery time.Duration
	// Stripes splits each marker's count over this many stripes (1 if
	// zero), as a storage moving the file over several streams reports it.
	Stripes int
	// Refuse makes every COPY fail as a storage without third-party copy.
	Refuse Refusal

	copies, aborted atomic.Int32
	mu              sync.Mutex
	headers         []http.Header
}

// Copies is the number of COPY requests that started a copy.
func (o *CopyOptions) Copies() int { return int(o.copies.Load()) }

// Aborted is the number of copies stopped because the client went away.
func (o *CopyOptions) Aborted() int { return int(o.aborted.Load()) }

// Headers are the headers of every COPY request received, in order.
func (o *CopyOptions) Headers() []http.Header {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]http.Header(nil), o.headers...)
}

func (o *CopyOptions) serve(w http.ResponseWriter, r *http.Request, p string) {
	o.mu.Lock()
	o.headers = append(o.headers, r.Header.Clone())
	o.mu.Unlock()
	src, dst := r.Header.Get("Source"), r.Header.Get("Destination")
	if (src == "") == (dst == "") {
		http.Error(w, "COPY needs a Source or a Destination header, not both", http.StatusBadRequest)
		return
	}
	if o.Refuse == RefuseStatus {
		http.Error(w, "third-party copy is not implemented here", http.StatusNotImplemented)
		return
	}
	remote := http.Header{}
	for k, v := range r.Header {
		if name, ok := cutPrefixFold(k, "TransferHeader"); ok && name != "" {
			remote[http.CanonicalHeaderKey(name)] = v
		}
	}
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusCreated)
	rc := http.NewResponseController(w)
	rc.Flush()
	if o.Refuse == RefuseFailureLine {
		io.WriteString(w, "failure: third-party copy is not supported by this storage\n")
		return
	}
	o.copies.Add(1)

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var moved atomic.Int64
	done := make(chan error, 1)
	go func() {
		if src != "" {
			done <- o.pull(ctx, src, remote, p, &moved)
		} else {
			done <- o.push(ctx, dst, remote, p, &moved)
		}
	}()
	every := o.MarkerEvery
	if every <= 0 {
		every = 100 * time.Millisecond
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			o.marker(w, moved.Load())
			if err != nil {
				if r.Context().Err() != nil {
					o.aborted.Add(1)
					return
				}
				fmt.Fprintf(w, "failure: %v\n", err)
				return
			}
			io.WriteString(w, "success: Created\n")
			return
		case <-t.C:
			o.marker(w, moved.Load())
			if rc.Flush() != nil {
				cancel()
			}
		}
	}
}

// marker writes one perf marker per stripe, moved split between them.
func (o *CopyOptions) marker(w io.Writer, moved int64) {
	n := int64(max(o.Stripes, 1))
	for i := range n {
		part := moved / n
		if i == n-1 {
			part = moved - part*(n-1)
		}
		fmt.Fprintf(w, "Perf Marker\n Timestamp: %d\n Stripe Index: %d\n Stripe Bytes Transferred: %d\n Total Stripe Count: %d\nEnd\n",
			time.Now().Unix(), i, part, n)
	}
}

func (o *CopyOptions) client() *http.Client {
	if o.Client != nil {
		return o.Client
	}
	return http.DefaultClient
}

// pull fetches src into p, through a partial file that a failed or
// stopped copy removes.
func (o *CopyOptions) pull(ctx context.Context, src string, header http.Header, p string, moved *atomic.Int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, src, nil)
	if err != nil {
		return err
	}
	req.Header = header
	resp, err := o.client().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("remote side failed with status code %d", resp.StatusCode)
	}
	part := p + ".tpc-part"
	f, err := os.Create(part)
	if err != nil {
		return err
	}
	_, err = io.Copy(countingWriter{f, moved}, resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(part, p)
	}
	if err != nil {
		os.Remove(part)
	}
	return err
}

// push sends p to dst with PUT.
func (o *CopyOptions) push(ctx context.Context, dst string, header http.Header, p string, moved *atomic.Int64) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, dst, countingReader{f, moved})
	if err != nil {
		return err
	}
	req.Header = header
	req.ContentLength = st.Size()
	if st.Size() == 0 {
		req.Body = http.NoBody
	}
	resp, err := o.client().Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("remote side failed with status code %d", resp.StatusCode)
	}
	return nil
}

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// cutPrefixFold is strings.CutPrefix ignoring case.
func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return s, false
	}
	return s[len(prefix):], true
}
