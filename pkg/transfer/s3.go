package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// S3 URLs are ARC's: s3://host[:port]/bucket/key over HTTP and
// s3s://host[:port]/bucket/key over HTTPS, path-style. Credentials come
// from a file per endpoint (WithS3Credentials: "ACCESS_KEY SECRET_KEY"),
// else from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; never from URLs.
// Objects larger than s3PartSize are uploaded in parts.

// envS3Keys returns the keys of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY
// (and AWS_SESSION_TOKEN) as they are now. New reads them once, when the
// composition root builds the client, not on each endpoint's first use.
func envS3Keys() *credentials.Credentials {
	v, _ := (&credentials.EnvAWS{}).Retrieve() // never fails
	return credentials.NewStaticV4(v.AccessKeyID, v.SecretAccessKey, v.SessionToken)
}

// s3PartSize is the part size of multipart uploads.
const s3PartSize = 16 << 20

// s3Object splits an S3 URL into its bucket and key.
func s3Object(u *url.URL) (bucket, key string, err error) {
	bucket, key, _ = strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
	if bucket == "" || key == "" {
		return "", "", errors.New("an S3 URL is s3://host[:port]/bucket/key")
	}
	return bucket, key, nil
}

// WithS3Credentials returns a copy of c that signs S3 requests to each
// endpoint (host or host:port) with the keys in its file.
func (c *Client) WithS3Credentials(files map[string]string) *Client {
	cp := *c
	cp.s3Creds = files
	cp.s3 = &s3Clients{byHost: map[string]*minio.Client{}}
	return &cp
}

type s3Clients struct {
	mu     sync.Mutex
	byHost map[string]*minio.Client
}

// s3Client returns the client of an endpoint, made on first use, once
// the Guard allows one of the endpoint's addresses. minio-go follows no
// redirect (its http.Client answers ErrUseLastResponse), so its signed
// requests go to this endpoint only; the Guard checks its every
// connection as well. Keys configured for "host" are those of the
// scheme's default port (80 for s3, 443 for s3s).
func (c *Client) s3Client(ctx context.Context, u *url.URL) (*minio.Client, error) {
	// Checked before minio-go is asked: it would retry a refused
	// connection ten times before giving up.
	port, _ := strconv.ParseUint(portOf(u), 10, 16)
	if _, err := c.guard.resolve(ctx, u.Hostname(), uint16(port), false); err != nil {
		return nil, err
	}
	c.s3.mu.Lock()
	defer c.s3.mu.Unlock()
	key := u.Scheme + "://" + u.Host
	if mc, ok := c.s3.byHost[key]; ok {
		return mc, nil
	}
	creds := c.s3Default
	if file, ok := lookupHost(c.s3Creds, u); ok {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("%w: S3 keys for %s: %v", errCredentials, u.Host, err)
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			return nil, fmt.Errorf("%w: S3 keys for %s: the file must hold \"ACCESS_KEY SECRET_KEY\"", errCredentials, u.Host)
		}
		creds = credentials.NewStaticV4(f[0], f[1], "")
	}
	mc, err := minio.New(u.Host, &minio.Options{Creds: creds, Secure: u.Scheme == "s3s",
		BucketLookup: minio.BucketLookupPath, Transport: c.roundTrip})
	if err != nil {
		return nil, err
	}
	c.s3.byHost[key] = mc
	return mc, nil
}

// s3Error classifies a failed S3 call like the HTTP status it carries.
func s3Error(ctx context.Context, op, rawURL string, err error, moved int64) *Error {
	if errors.Is(err, errCredentials) {
		return &Error{Kind: dtr.ErrLocalFile, Op: op, URL: rawURL, Err: err}
	}
	var er minio.ErrorResponse
	if errors.As(err, &er) && er.StatusCode != 0 {
		return remoteError(ctx, op, rawURL, fmt.Errorf("%w: %s", &StatusError{Code: er.StatusCode, Status: fmt.Sprintf("%d %s", er.StatusCode, er.Code)}, er.Message), moved)
	}
	return remoteError(ctx, op, rawURL, err, moved)
}

func isS3Missing(err error) bool {
	var er minio.ErrorResponse
	return errors.As(err, &er) && (er.StatusCode == http.StatusNotFound || er.Code == "NoSuchKey")
}

// s3Stat describes an object. Its ETag is not taken as a checksum: it is
// the md5 only of objects stored in one part without SSE-KMS.
func (c *Client) s3Stat(ctx context.Context, op, rawURL string, u *url.URL) (Info, error) {
	missing := Info{Size: -1}
	mc, err := c.s3Client(ctx, u)
	if err != nil {
		return missing, s3Error(ctx, op, rawURL, err, 0)
	}
	bucket, key, err := s3Object(u)
	if err != nil {
		return missing, &Error{Kind: dtr.ErrInternalLogic, Op: op, URL: rawURL, Err: err}
	}
	oi, err := mc.StatObject(ctx, bucket, key, minio.StatObjectOptions{})
	if isS3Missing(err) {
		return missing, nil
	}
	if err != nil {
		return missing, s3Error(ctx, op, rawURL, err, 0)
	}
	return Info{Exists: true, Size: oi.Size}, nil
}

// s3Delete removes an object; a missing one is not an error.
func (c *Client) s3Delete(ctx context.Context, op, rawURL string, u *url.URL) error {
	mc, err := c.s3Client(ctx, u)
	if err != nil {
		return s3Error(ctx, op, rawURL, err, 0)
	}
	bucket, key, err := s3Object(u)
	if err != nil {
		return &Error{Kind: dtr.ErrInternalLogic, Op: op, URL: rawURL, Err: err}
	}
	if err := mc.RemoveObject(ctx, bucket, key, minio.RemoveObjectOptions{}); err != nil && !isS3Missing(err) {
		return s3Error(ctx, op, rawURL, err, 0)
	}
	return nil
}

// s3Open opens an object for reading.
func (c *Client) s3Open(ctx context.Context, rawURL string, u *url.URL) (*source, error) {
	const op = "copy"
	info, err := c.s3Stat(ctx, op, rawURL, u)
	if err != nil {
		return nil, err
	}
	if !info.Exists {
		return nil, sourceNotFound(ctx, rawURL, "404 NoSuchKey")
	}
	mc, err := c.s3Client(ctx, u)
	if err != nil {
		return nil, s3Error(ctx, op, rawURL, err, 0)
	}
	bucket, key, _ := s3Object(u)
	obj, err := mc.GetObject(ctx, bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, s3Error(ctx, op, rawURL, err, 0)
	}
	return &source{body: obj, size: info.Size, checksum: info.Checksum}, nil
}

// copyToS3 streams the source into an object, in parts if it is large.
func (c *Client) copyToS3(ctx context.Context, in *source, p *pump, src, dst string, u *url.URL) (int64, *Error) {
	const op = "copy"
	mc, err := c.s3Client(ctx, u)
	if err != nil {
		return 0, s3Error(ctx, op, dst, err, 0)
	}
	bucket, key, err := s3Object(u)
	if err != nil {
		return 0, &Error{Kind: dtr.ErrInternalLogic, Op: op, URL: dst, Err: err}
	}
	// The object appears only once its upload completes (one PUT, or the
	// completion of a multipart upload, which minio-go aborts on failure),
	// so a failed attempt leaves nothing of its own and deletes nothing.
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := mc.PutObject(ctx, bucket, key, pr, in.size, minio.PutObjectOptions{
			PartSize: s3PartSize, ContentType: "application/octet-stream",
			// UNSIGNED-PAYLOAD rather than aws-chunked streaming signatures,
			// which not every S3 server decodes; the copy is checksummed anyway.
			DisableContentSha256: true})
		pr.CloseWithError(err) // unblock the pump
		done <- err
	}()
	n, side, err := p.run(ctx, in.body, pw)
	pw.CloseWithError(err)
	putErr := <-done
	switch {
	case side == sideFence:
		return n, fenceError(op, dst, err)
	case ctx.Err() != nil:
		return n, cancelled(ctx, op, src)
	case side == sideSource:
		return n, sourceError(ctx, in, src, err, n)
	case putErr != nil:
		return n, s3Error(ctx, op, dst, putErr, n)
	case err != nil:
		return n, remoteError(ctx, op, dst, err, n)
	}
	return n, nil
}

// sourceNotFound is the PERMANENT_REMOTE error of a source a remote
// storage does not have.
func sourceNotFound(ctx context.Context, rawURL, status string) *Error {
	return remoteError(ctx, "copy", rawURL, fmt.Errorf("source not found: %w", &StatusError{Code: http.StatusNotFound, Status: status}), 0)
}

// s3Protocol speaks S3 (s3.go).
type s3Protocol struct{ c *Client }

func (s s3Protocol) stat(ctx context.Context, op string, e endpoint) (Info, error) {
	return s.c.s3Stat(ctx, op, e.raw, e.url)
}

func (s s3Protocol) remove(ctx context.Context, op string, e endpoint) error {
	return s.c.s3Delete(ctx, op, e.raw, e.url)
}

func (s3Protocol) makeParents(context.Context, string, endpoint) error { return nil }

func (s s3Protocol) open(ctx context.Context, e endpoint) (*source, error) {
	return s.c.s3Open(ctx, e.raw, e.url)
}

func (s s3Protocol) write(ctx context.Context, in *source, p *pump, src string, dst endpoint, _ CopyOptions) (int64, *Error) {
	return s.c.copyToS3(ctx, in, p, src, dst.raw, dst.url)
}

// rename is never asked: S3 objects appear whole, in place.
func (s3Protocol) rename(_ context.Context, op, from, _ string, _, _ *url.URL) error {
	return &Error{Kind: dtr.ErrInternalLogic, Op: op, URL: from, Err: errors.New("S3 objects are not renamed")}
}
