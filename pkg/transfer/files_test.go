package transfer

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// loopback lets this package's tests reach their servers, all on
// loopback, which a Client's default Guard refuses.
var loopback = func() *Guard {
	g, err := NewGuard("127.0.0.0/8", "::1")
	if err != nil {
		panic(err)
	}
	return g
}()

func TestFileRootsRefuseEveryWayOut(t *testing.T) {
	dir := t.TempDir()
	allowed, secret := filepath.Join(dir, "allowed"), filepath.Join(dir, "secret")
	for _, d := range []string{allowed, secret} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(allowed, "in"), "inside")
	write(filepath.Join(secret, "key"), "secret")
	if err := os.Symlink(filepath.Join(secret, "key"), filepath.Join(allowed, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(allowed, "dirlink")); err != nil {
		t.Fatal(err)
	}
	files, err := OpenFiles(allowed)
	if err != nil {
		t.Fatal(err)
	}
	c := New(nil).WithFiles(files)
	ctx := context.Background()
	u := func(p string) string { return "file://" + p }

	if info, err := c.Stat(ctx, u(filepath.Join(allowed, "in"))); err != nil || !info.Exists {
		t.Fatalf("a file under the root: %+v, %v", info, err)
	}
	if _, err := c.Copy(ctx, u(filepath.Join(allowed, "in")), u(filepath.Join(allowed, "sub", "copy")), CopyOptions{}); err != nil {
		t.Fatalf("a copy within the root: %v", err)
	}
	tests := []struct {
		name string
		op   func() error
	}{
		{"reading a file outside", func() error {
			_, err := c.Copy(ctx, u(filepath.Join(secret, "key")), u(filepath.Join(allowed, "x")), CopyOptions{})
			return err
		}},
		{"stat of a file outside", func() error { _, err := c.Stat(ctx, u(filepath.Join(secret, "key"))); return err }},
		{"a .. that leaves the root", func() error { _, err := c.Stat(ctx, u(allowed+"/../secret/key")); return err }},
		{"a symbolic link to a file outside", func() error {
			_, err := c.Copy(ctx, u(filepath.Join(allowed, "link")), u(filepath.Join(allowed, "y")), CopyOptions{})
			return err
		}},
		{"writing through a link to a directory outside", func() error {
			_, err := c.Copy(ctx, u(filepath.Join(allowed, "in")), u(filepath.Join(allowed, "dirlink", "planted")), CopyOptions{})
			return err
		}},
		{"writing outside", func() error {
			_, err := c.Copy(ctx, u(filepath.Join(allowed, "in")), u(filepath.Join(secret, "planted")), CopyOptions{})
			return err
		}},
		{"deleting outside", func() error { return c.Delete(ctx, u(filepath.Join(secret, "key"))) }},
		{"renaming out of the root", func() error { return c.Rename(ctx, u(filepath.Join(allowed, "in")), u(filepath.Join(secret, "moved"))) }},
		{"making directories outside", func() error { return c.MakeParents(ctx, u(filepath.Join(secret, "d", "f"))) }},
		{"a checksum of a file outside", func() error { _, err := c.Checksum(ctx, u(filepath.Join(secret, "key")), "adler32"); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.op()
			var te *Error
			if !errors.Is(err, ErrOutsideRoots) || !errors.As(err, &te) || te.Kind != dtr.ErrLocalFile {
				t.Fatalf("error %v, want a LOCAL_FILE error wrapping ErrOutsideRoots", err)
			}
			if !strings.Contains(err.Error(), "outside the allowed file roots") {
				t.Fatalf("error %q does not say why", err)
			}
		})
	}
	// Nothing outside changed.
	if b, err := os.ReadFile(filepath.Join(secret, "key")); err != nil || string(b) != "secret" {
		t.Fatalf("the file outside was changed: %q, %v", b, err)
	}
	for _, p := range []string{"planted", "moved", "d"} {
		if _, err := os.Lstat(filepath.Join(secret, p)); err == nil {
			t.Fatalf("%s was created outside the root", p)
		}
	}
	// Without roots every path is reachable.
	if info, err := New(nil).Stat(ctx, u(filepath.Join(secret, "key"))); err != nil || !info.Exists {
		t.Fatalf("without roots: %+v, %v", info, err)
	}
}

func TestOpenFilesRefusesARelativeRoot(t *testing.T) {
	if _, err := OpenFiles("relative/dir"); err == nil || !strings.Contains(err.Error(), "not an absolute path") {
		t.Fatalf("error %v", err)
	}
}

func TestBearerTokensGoOnlyToTheirHostAndNeverIntoErrors(t *testing.T) {
	const token = "s3cr3t-t0ken"
	var got []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization"))
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		w.Write([]byte("data"))
	}))
	defer srv.Close()
	other := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, "other:"+r.Header.Get("Authorization"))
	}))
	defer other.Close()
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(srv.URL, "https://")
	tokens, err := ParseTokens(host + "=" + file)
	if err != nil {
		t.Fatal(err)
	}
	// srv.Client() trusts both servers (httptest's one certificate).
	tls := New(srv.Client()).WithGuard(loopback)
	c := tls.WithTokens(tokens)
	ctx := context.Background()
	if _, err := c.Copy(ctx, srv.URL+"/f", "file://"+filepath.Join(dir, "out"), CopyOptions{}); err != nil {
		t.Fatalf("with the token: %v", err)
	}
	if _, err := c.Copy(ctx, "file://"+filepath.Join(dir, "out"), srv.URL+"/up", CopyOptions{}); err != nil {
		t.Fatalf("an upload with the token: %v", err)
	}
	if _, err := c.Stat(ctx, other.URL+"/f"); err != nil {
		t.Fatal(err)
	}
	if got[len(got)-1] != "other:" {
		t.Fatalf("another host got %q, want no token", got[len(got)-1])
	}
	// Without the token the server refuses, and the error does not quote it.
	_, err = tls.Copy(ctx, srv.URL+"/f", "file://"+filepath.Join(dir, "out2"), CopyOptions{})
	if err == nil || strings.Contains(err.Error(), token) {
		t.Fatalf("without the token: %v", err)
	}
	// An unreadable token file is this site's problem: LOCAL_FILE, no retry.
	bad := tls.WithTokens(map[string]string{host: filepath.Join(dir, "missing")})
	_, err = bad.Stat(ctx, srv.URL+"/f")
	var te *Error
	if !errors.As(err, &te) || te.Kind != dtr.ErrLocalFile {
		t.Fatalf("missing token file: %v, want LOCAL_FILE", err)
	}
	if _, err := ParseTokens("host=relative"); err == nil {
		t.Fatal("a relative token path was accepted")
	}
}
