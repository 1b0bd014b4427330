package xrootdtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The key cache written for xrootd's SciTokens library is a database
// SQLite itself reads whole: its integrity check passes, and the row of
// each issuer reads back, also one with a key set of several keys.
func TestTheKeyCacheIsADatabaseSQLiteReadsBack(t *testing.T) {
	sqlite, err := exec.LookPath("sqlite3")
	if err != nil {
		t.Skip("no sqlite3 to read the key cache back with; install sqlite3")
	}
	keys := `{"keys":[` + strings.Repeat(`{"kty":"RSA","kid":"k","n":"`+strings.Repeat("x", 342)+`","e":"AQAB"},`, 5) + `{}]}`
	for _, jwks := range []string{`{"keys":[]}`, keys} {
		entry, err := keyCacheEntry([]byte(jwks), 1_800_000_000, 1_800_086_400)
		if err != nil {
			t.Fatal(err)
		}
		db, err := keyCacheDB("http://127.0.0.1:8080", entry)
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "scitokens_cpp.sqllite")
		if err := os.WriteFile(file, db, 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(sqlite, file, "PRAGMA integrity_check; SELECT issuer, keys FROM keycache WHERE issuer = 'http://127.0.0.1:8080';").CombinedOutput()
		if err != nil {
			t.Fatalf("sqlite3: %v: %s", err, out)
		}
		if want := "ok\nhttp://127.0.0.1:8080|" + string(entry) + "\n"; string(out) != want {
			t.Fatalf("sqlite3 read\n%s\nwant\n%s", out, want)
		}
	}
	// A key set past one page is refused, not written wrong.
	big := `{"keys":["` + strings.Repeat("x", 5000) + `"]}`
	entry, _ := keyCacheEntry([]byte(big), 0, 0)
	if _, err := keyCacheDB("http://127.0.0.1:8080", entry); err == nil || !strings.Contains(err.Error(), "does not fit") {
		t.Fatalf("a key set of 5000 bytes: %v, want it refused", err)
	}
}
