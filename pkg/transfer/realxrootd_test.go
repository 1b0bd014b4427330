package transfer_test

import (
	"cmp"
	"context"
	"net/url"
	"testing"

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
