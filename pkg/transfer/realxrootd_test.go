package transfer_test

import (
	"bytes"
	"cmp"
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/token"
	"github.com/sluice-dtr/sluice/pkg/token/tokentest"
	"github.com/sluice-dtr/sluice/pkg/transfer"
	"github.com/sluice-dtr/sluice/pkg/transfer/xrootdtest"
)

// realXrootdStores are the conformance rows of the grid's own storage
// server, the real xrootd (Debian's 5.5): over root://, and over
// HTTPS/WebDAV (davs:// and https://) with SciTokens authorisation on and
// no checksum configured, as many grid storages run. The client there
// gets a token from a real issuer for each request, as Sluice's workers
// do (SLUICE_STORAGE_TOKEN_*): its audience the storage, its scope the
// path. Without xrootd installed the rows are left out, saying so.
func realXrootdStores(t *testing.T) []protocolStore {
	t.Helper()
	if why := xrootdtest.Missing(xrootdtest.Options{HTTP: true, Tokens: &xrootdtest.Tokens{}}); why != "" {
		t.Log(why)
		return nil
	}
	root := xrootdtest.Start(t, xrootdtest.Options{})
	is := tokentest.Start(t)
	web := xrootdtest.Start(t, xrootdtest.Options{HTTP: true, Tokens: &xrootdtest.Tokens{Issuer: is.URL}})
	web.MkdirAll(t, "/davs")
	web.MkdirAll(t, "/https")
	tokens := storageTokens(t, is)
	host := web.HTTPS[len("https://"):]
	// xrootd 5.5 cannot authorise a path with a space by a token
	// (TestTheRealXrootdWithSciTokensRefusesAPathWhoseScopeIsEscaped).
	const spaced = "a_b"
	return []protocolStore{
		{name: "xrootd (the real xrootd)", base: root.Root, local: root.Dir, nested: true},
		{name: "davs:// (the real xrootd, SciTokens, no checksums)", base: "davs://" + host + "/davs", local: web.Path("/davs"), nested: true,
			http: web.Client(), tokens: tokens, spaced: spaced, keepsAbortedPuts: true},
		{name: "https:// (the real xrootd, SciTokens, no checksums)", base: web.HTTPS + "/https", local: web.Path("/https"), nested: true,
			http: web.Client(), tokens: tokens, spaced: spaced, keepsAbortedPuts: true},
	}
}

// storageTokens asks the issuer, as a client of its own, for a token per
// storage and path, as Sluice's workers do: storage.read:<path> to read,
// and to write storage.modify:<path> with storage.read:<path>, since
// xrootd stats what it is asked to delete and storage.modify alone does
// not allow that (TestTheRealXrootdWithSciTokensDeletesOnlyWithReadAndModify).
func storageTokens(t *testing.T, is *tokentest.Issuer) transfer.TokenSource {
	t.Helper()
	client := is.Client(t)
	src, err := token.NewStorageSource(token.StorageConfig{Issuer: is.URL, ClientID: client.ID, ClientSecretFile: client.SecretFile})
	if err != nil {
		t.Fatal(err)
	}
	return func(ctx context.Context, u *url.URL, access transfer.Access) (string, error) {
		p := cmp.Or(u.EscapedPath(), "/")
		scope := "storage.read:" + p
		if access != transfer.AccessRead {
			scope += " storage.modify:" + p
		}
		return src.Token(ctx, transfer.Audience(u), scope)
	}
}

// sciTokensXrootd starts the real xrootd over HTTPS with SciTokens
// authorisation and no checksums, with the file /data/f, and returns a
// function that gives a transfer client whose every request carries a
// token of the issuer with aud and scope.
func sciTokensXrootd(t *testing.T) (*xrootdtest.Server, func(aud, scope string) *transfer.Client) {
	t.Helper()
	is := tokentest.Start(t)
	s := xrootdtest.Start(t, xrootdtest.Options{HTTP: true, Tokens: &xrootdtest.Tokens{Issuer: is.URL}})
	s.WriteFile(t, "/data/f", []byte("scoped"))
	client := is.Client(t)
	src, err := token.NewStorageSource(token.StorageConfig{Issuer: is.URL, ClientID: client.ID, ClientSecretFile: client.SecretFile})
	if err != nil {
		t.Fatal(err)
	}
	return s, func(aud, scope string) *transfer.Client {
		return transfer.New(s.Client()).WithGuard(loopback).WithTokenSource(func(ctx context.Context, _ *url.URL, _ transfer.Access) (string, error) {
			return src.Token(ctx, aud, scope)
		})
	}
}

func TestTheRealXrootdWithSciTokensRefusesTokensForAnotherAudienceOrPath(t *testing.T) {
	s, with := sciTokensXrootd(t)
	obj := s.HTTPS + "/data/f"
	ctx := context.Background()
	if info, err := with(s.HTTPS, "storage.read:/data/f").Stat(ctx, obj); err != nil || !info.Exists {
		t.Fatalf("with the right token: %+v, %v", info, err)
	}
	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, src, []byte("not to be written"))
	for _, tc := range []struct{ name, aud, scope string }{
		{"another audience", "https://elsewhere.example:443", "storage.read:/data/f storage.modify:/data/f"},
		{"another path", s.HTTPS, "storage.read:/other storage.modify:/other"},
		{"a file beside it", s.HTTPS, "storage.read:/data/g storage.modify:/data/g"},
	} {
		c := with(tc.aud, tc.scope)
		_, err := c.Stat(ctx, obj)
		if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), "HTTP 403") {
			t.Errorf("%s: stat: %v (%s), want 403, PERMANENT_REMOTE", tc.name, err, transfer.KindOf(err))
		}
		_, err = c.Copy(ctx, fileURL(src), s.HTTPS+"/data/new", transfer.CopyOptions{})
		if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), "HTTP 403") {
			t.Errorf("%s: upload: %v (%s), want 403, PERMANENT_REMOTE", tc.name, err, transfer.KindOf(err))
		}
		if _, err := os.Stat(s.Path("/data/new")); err == nil {
			t.Errorf("%s: the refused upload left a file", tc.name)
		}
	}
	// xrootd 5.5 matches a scope's path as a string prefix, not by path
	// elements: a token for /dat reaches /data/f, and one for /data/f
	// reaches /data/f.part and /data/f2 (docs/security.md).
	if info, err := with(s.HTTPS, "storage.read:/dat").Stat(ctx, obj); err != nil || !info.Exists {
		t.Errorf("a scope that only starts the path: %+v, %v; xrootd 5.5 allows it", info, err)
	}
}

func TestTheRealXrootdWithSciTokensRefusesAPathWhoseScopeIsEscaped(t *testing.T) {
	// The WLCG and SciTokens profiles write a scope's path URL-encoded,
	// as Sluice asks for it (a space would end the scope), but xrootd 5.5
	// compares it with the decoded path: a file-scoped token cannot name
	// a path with a space there. A token for a directory above it can.
	s, with := sciTokensXrootd(t)
	s.WriteFile(t, "/data/a b/f", []byte("spaced"))
	obj := s.HTTPS + "/data/a%20b/f"
	ctx := context.Background()
	_, err := with(s.HTTPS, "storage.read:/data/a%20b/f").Stat(ctx, obj)
	if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), "HTTP 403") {
		t.Fatalf("an escaped scope: %v (%s), want xrootd 5.5's 403", err, transfer.KindOf(err))
	}
	if info, err := with(s.HTTPS, "storage.read:/data").Stat(ctx, obj); err != nil || !info.Exists {
		t.Fatalf("a scope of the directory above: %+v, %v", info, err)
	}
}

func TestTheRealXrootdWithSciTokensDeletesOnlyWithReadAndModify(t *testing.T) {
	// XrdHttp stats what it deletes, and storage.modify alone does not
	// allow a stat: a write token needs storage.read beside it.
	s, with := sciTokensXrootd(t)
	ctx := context.Background()
	err := with(s.HTTPS, "storage.modify:/data/f").Delete(ctx, s.HTTPS+"/data/f")
	if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), "HTTP 403") {
		t.Fatalf("a delete with storage.modify alone: %v (%s), want 403", err, transfer.KindOf(err))
	}
	if err := with(s.HTTPS, "storage.read:/data/f storage.modify:/data/f").Delete(ctx, s.HTTPS+"/data/f"); err != nil {
		t.Fatalf("a delete with storage.read and storage.modify: %v", err)
	}
	if _, err := os.Stat(s.Path("/data/f")); err == nil {
		t.Fatal("the file is still there")
	}
}

func TestAnUploadOfUnknownSizeReachesTheRealXrootd(t *testing.T) {
	// Chunked, waiting for 100 Continue: xrootd 5.5 answers a chunked body
	// sent at once "400 Invalid chunked encoding".
	s := xrootdtest.Start(t, xrootdtest.Options{HTTP: true})
	c := transfer.New(s.Client()).WithGuard(loopback)
	for _, n := range []int{1, 1000, 600000} {
		src, _ := closeDelimitedServer(t, sized(n))
		res, err := c.Copy(context.Background(), src+"/f", s.HTTPS+"/unsized", transfer.CopyOptions{})
		if err != nil || res.Bytes != int64(n) {
			t.Fatalf("%d bytes of unknown size: %d moved, %v", n, res.Bytes, err)
		}
		if fi, err := os.Stat(s.Path("/unsized")); err != nil || fi.Size() != int64(n) {
			t.Fatalf("%d bytes of unknown size: stored %v, %v", n, fi, err)
		}
	}
}

func TestTheRealXrootdGivesItsChecksumOnlyWhenConfiguredToKeepThem(t *testing.T) {
	data := bytes.Repeat([]byte("checksummed "), 10000)
	for _, tc := range []struct {
		name, checksum string
		stated         bool // the storage states the checksum
	}{
		{"without xrootd.chksum", "", false},
		{"with xrootd.chksum adler32", "adler32", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := xrootdtest.Start(t, xrootdtest.Options{HTTP: true, Checksum: tc.checksum})
			s.WriteFile(t, "/f", data)
			want, _ := checksum.File(s.Path("/f"), "adler32")
			c := transfer.New(s.Client()).WithGuard(loopback)
			ctx := context.Background()
			info, err := c.Stat(ctx, s.HTTPS+"/f")
			if err != nil || !info.Exists || info.Size != int64(len(data)) {
				t.Fatalf("stat: %+v, %v", info, err)
			}
			res, err := c.Copy(ctx, s.HTTPS+"/f", fileURL(filepath.Join(t.TempDir(), "back")), transfer.CopyOptions{})
			if err != nil || res.Checksums["adler32"] != want {
				t.Fatalf("download: %v, %v; want %s", res.Checksums, err, want)
			}
			if tc.stated {
				if info.Checksum != want || res.SourceChecksum != want {
					t.Fatalf("the storage stated %q on HEAD and %q on GET, want %s", info.Checksum, res.SourceChecksum, want)
				}
			} else if info.Checksum != "" || res.SourceChecksum != "" {
				t.Fatalf("a storage without checksums stated %q and %q", info.Checksum, res.SourceChecksum)
			}
			// A missing file is missing, whatever xrootd answers a GET
			// of it that asks for its checksum (500).
			_, err = c.Copy(ctx, s.HTTPS+"/missing", fileURL(filepath.Join(t.TempDir(), "x")), transfer.CopyOptions{})
			if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), "404") {
				t.Fatalf("a missing source: %v (%s), want 404, PERMANENT_REMOTE", err, transfer.KindOf(err))
			}
		})
	}
}
