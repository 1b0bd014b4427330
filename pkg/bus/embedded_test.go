package bus

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEmbeddedServerSaysWhyItCannotStart(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		dir  string
		port int
		want string
	}{
		{"its port is taken", t.TempDir(), port, "is in use"},
		{"its store is under a file", filepath.Join(file, "store"), 0, "store " + filepath.Join(file, "store")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns, err := Embedded(tt.dir, tt.port)
			if err == nil {
				ns.Shutdown()
				t.Fatal("it started")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want it to say %q", err, tt.want)
			}
		})
	}
	ns, err := Embedded(t.TempDir(), 0)
	if err != nil {
		t.Fatalf("a free port and a writable store: %v", err)
	}
	ns.Shutdown()
}
