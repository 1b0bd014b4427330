package job

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzParse checks that no input makes the parsers panic, that every
// reported position lies within the input, and that whatever parses can be
// normalized, validated and turned into DTRs.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.*"))
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`&(a=$(B)#"c"(d)^xex)`))
	f.Add([]byte(`{"inputs":[{"source":"","destination":""}],"owner":{"fqans":[]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		j, err := Parse(data, XRSLOptions{SessionDir: "/s"})
		checkPositions(t, data, err)
		if err != nil {
			return
		}
		j.Normalize()
		if j.Validate() == nil {
			for _, d := range j.DTRs(time.Now()) {
				if err := d.Validate(); err != nil {
					t.Fatalf("a valid job made an invalid DTR: %v", err)
				}
			}
		}
	})
}

// checkPositions fails if a ParseError in err points outside data.
func checkPositions(t *testing.T, data []byte, err error) {
	t.Helper()
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else if err != nil {
		list = []error{err}
	}
	for _, e := range list {
		var pe *ParseError
		if errors.As(e, &pe) && (pe.Offset < 0 || pe.Offset > len(data) || pe.Line < 1 || pe.Column < 1) {
			t.Fatalf("position out of range in %v (input %d bytes)", pe, len(data))
		}
	}
}
