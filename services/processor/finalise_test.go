package processor

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

func TestFinaliseVerifiesAndPlacesTheFileOrFindsItPlacedBefore(t *testing.T) {
	sum := func(data string) string {
		h, _ := checksum.New("adler32")
		h.Write([]byte(data))
		return checksum.Format("adler32", h)
	}
	tests := []struct {
		name              string
		tmp, dst          string // contents; "" is no file
		delivered         string // what delivery computed
		wantErr           bool
		wantDst, wantTemp string
	}{
		{"the temporary file is verified and renamed into place", "data", "", sum("data"), false, "data", ""},
		{"a file that changed on disk is refused and removed", "datA", "", sum("data"), true, "", ""},
		{"a file an earlier try put in place is done", "", "data", sum("data"), false, "data", ""},
		{"another file in place is not taken for it", "", "other", sum("data"), true, "other", ""},
		{"no file anywhere is an error", "", "", sum("data"), true, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			d := dtr.DTR{ID: uuid.New(), Source: "file:///nowhere", Destination: "file://" + filepath.Join(dir, "f"),
				Checksum: tt.delivered, TransferGrant: "g.3"}
			tmpPath := filepath.Join(dir, filepath.Base(transfer.TempURLOf(&d)))
			if tt.tmp != "" {
				write(t, tmpPath, tt.tmp)
			}
			if tt.dst != "" {
				write(t, filepath.Join(dir, "f"), tt.dst)
			}
			s := New(Config{}, nil, slog.New(slog.DiscardHandler))
			_, err := s.finalise(context.Background(), d)
			if (err != nil) != tt.wantErr {
				t.Fatalf("finalise: %v, want an error: %v", err, tt.wantErr)
			}
			if got := read(filepath.Join(dir, "f")); got != tt.wantDst {
				t.Errorf("destination holds %q, want %q", got, tt.wantDst)
			}
			if got := read(tmpPath); got != tt.wantTemp {
				t.Errorf("temporary file holds %q, want %q", got, tt.wantTemp)
			}
		})
	}
}

func read(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
