package checksum_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/checksum"
)

// Known vectors: adler32 from RFC 1950 / Wikipedia, md5 from RFC 1321,
// sha256 from FIPS 180-2.
var vectors = []struct {
	typ, data, want string
}{
	{"adler32", "Wikipedia", "adler32:11e60398"},
	{"adler32", "abc", "adler32:024d0127"}, // needs zero padding
	{"adler32", "", "adler32:00000001"},
	{"md5", "abc", "md5:900150983cd24fb0d6963f7d28e17f72"},
	{"md5", "", "md5:d41d8cd98f00b204e9800998ecf8427e"},
	{"sha256", "abc", "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
	{"SHA256", "abc", "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
	{"crc32c", "123456789", "crc32c:e3069283"}, // the Castagnoli check value
	{"crc32c", "", "crc32c:00000000"},
	{"Adler32", "Wikipedia", "adler32:11e60398"},
}

func TestFormatGivesKnownVectors(t *testing.T) {
	for _, v := range vectors {
		t.Run(v.typ+"/"+v.data, func(t *testing.T) {
			h, err := checksum.New(v.typ)
			if err != nil {
				t.Fatal(err)
			}
			h.Write([]byte(v.data))
			if got := checksum.Format(v.typ, h); got != v.want {
				t.Errorf("Format = %q, want %q", got, v.want)
			}
		})
	}
}

func TestFileStreamsKnownVectors(t *testing.T) {
	dir := t.TempDir()
	for i, v := range vectors {
		t.Run(v.typ+"/"+v.data, func(t *testing.T) {
			path := filepath.Join(dir, string(rune('a'+i)))
			if err := os.WriteFile(path, []byte(v.data), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := checksum.File(path, v.typ)
			if err != nil {
				t.Fatal(err)
			}
			if got != v.want {
				t.Errorf("File = %q, want %q", got, v.want)
			}
		})
	}
}

func TestFileOfLargeDataMatchesOneShotHash(t *testing.T) {
	// Larger than the 1 MiB read buffer, so the sum spans several reads.
	data := make([]byte, 3<<20+17)
	for i := range data {
		data[i] = byte(i * 7)
	}
	path := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"adler32", "md5", "sha256"} {
		h, _ := checksum.New(typ)
		h.Write(data)
		want := checksum.Format(typ, h)
		got, err := checksum.File(path, typ)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s: File = %q, want %q", typ, got, want)
		}
	}
}

func TestNewRejectsUnknownType(t *testing.T) {
	for _, typ := range []string{"crc32", "sha1", "", "sha-256"} {
		if _, err := checksum.New(typ); !errors.Is(err, checksum.ErrUnknownType) {
			t.Errorf("New(%q) error = %v, want ErrUnknownType", typ, err)
		}
	}
}

func TestFileReportsMissingFileAndUnknownType(t *testing.T) {
	dir := t.TempDir()
	if _, err := checksum.File(filepath.Join(dir, "missing"), "adler32"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: error = %v, want os.ErrNotExist", err)
	}
	path := filepath.Join(dir, "f")
	os.WriteFile(path, []byte("x"), 0o644)
	if _, err := checksum.File(path, "crc32"); !errors.Is(err, checksum.ErrUnknownType) {
		t.Errorf("unknown type: error = %v, want ErrUnknownType", err)
	}
}

func TestEqual(t *testing.T) {
	tests := []struct {
		name string
		a, b string
		want bool
	}{
		{"identical", "adler32:11e60398", "adler32:11e60398", true},
		{"value case differs", "md5:900150983CD24FB0D6963F7D28E17F72", "md5:900150983cd24fb0d6963f7d28e17f72", true},
		{"type case differs", "ADLER32:11e60398", "adler32:11e60398", true},
		{"adler32 leading zeros ignored", "adler32:0a0b0c0d", "adler32:a0b0c0d", true},
		{"adler32 zero value", "adler32:00000000", "adler32:0", true},
		{"md5 leading zeros matter", "md5:0abc", "md5:abc", false},
		{"values differ", "adler32:11e60398", "adler32:11e60399", false},
		{"types differ", "adler32:11e60398", "md5:11e60398", false},
		{"missing colon", "11e60398", "adler32:11e60398", false},
		{"empty value", "adler32:", "adler32:", false},
		{"both empty", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := checksum.Equal(tt.a, tt.b); got != tt.want {
				t.Errorf("Equal(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
			}
			if got := checksum.Equal(tt.b, tt.a); got != tt.want {
				t.Errorf("Equal(%q, %q) = %v, want %v (not symmetric)", tt.b, tt.a, got, tt.want)
			}
		})
	}
}
