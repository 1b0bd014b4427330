package transfer_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/net/webdav"

	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// davServer is a plain WebDAV server (golang.org/x/net/webdav), which
// knows COPY only as a copy within itself.
func davServer(t *testing.T) (dir string, srv *httptest.Server) {
	t.Helper()
	dir = t.TempDir()
	srv = httptest.NewServer(&webdav.Handler{FileSystem: webdav.Dir(dir), LockSystem: webdav.NewMemLS()})
	t.Cleanup(srv.Close)
	return dir, srv
}

func TestPlainWebDAVServersAnswerThirdPartyCopyAsARefusal(t *testing.T) {
	aDir, a := davServer(t)
	_, b := davServer(t)
	os.WriteFile(filepath.Join(aDir, "f"), []byte("webdav"), 0o644)
	c := transfer.New(nil).WithGuard(loopback)
	for _, mode := range []transfer.ThirdPartyMode{transfer.ThirdPartyPull, transfer.ThirdPartyPush} {
		_, err := c.ThirdPartyCopy(context.Background(), a.URL+"/f", b.URL+"/g", transfer.ThirdPartyOptions{Mode: mode})
		if !errors.Is(err, transfer.ErrNoThirdPartyCopy) {
			t.Errorf("%s: error %v; want a refusal of third-party copy", mode, err)
		}
	}
}

func TestAPlainWebDAVServerPushingToItselfCopiesAndTheCopyIsVerified(t *testing.T) {
	dir, srv := davServer(t)
	os.WriteFile(filepath.Join(dir, "f"), []byte("webdav copies within itself"), 0o644)
	res, err := transfer.New(nil).WithGuard(loopback).ThirdPartyCopy(context.Background(), srv.URL+"/f", srv.URL+"/g",
		transfer.ThirdPartyOptions{Mode: transfer.ThirdPartyPush, ExpectedSize: 27, Checksum: "adler32:91ed0a77"})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "g")); string(b) != "webdav copies within itself" || res.Bytes != 27 {
		t.Fatalf("the copy holds %q, result %+v", b, res)
	}
	// x/net/webdav gives no Digest: the job's checksum was had by reading
	// the copy back.
	if res.ReadBack != 27 || res.Checksum != "adler32:91ed0a77" {
		t.Errorf("result %+v; want the checksum read back", res)
	}
}
