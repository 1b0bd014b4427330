package job

import (
	"errors"
	"strings"
	"testing"
)

// Found by FuzzParseRefusesWithAReasonOrGivesAJobThatRoundTrips: an xRSL
// URL with a byte that is not UTF-8 was taken as it was, and became another
// URL (with U+FFFD) once the job was stored as JSON; the JSON parser turned
// such bytes into U+FFFD without a word.
func TestDescriptionsThatAreNotUTF8AreRefusedAtTheBadByte(t *testing.T) {
	tests := []struct {
		name, in string
		want     string // "" means accepted
	}{
		{"xRSL with a bad byte in a URL", "&(inputfiles=(\"a\" \"http://h/\xff\"))",
			`xrsl line 1, column 29 (byte 28): byte 0xFF is not UTF-8`},
		{"xRSL with a bad byte in a comment", "(* \xfe *)\n&(inputfiles=(\"a\" \"http://h/a\"))",
			`xrsl line 1, column 4 (byte 3): byte 0xFE is not UTF-8`},
		{"JSON with a bad byte in a URL", "{\"inputs\":[{\"source\":\"http://h/\xc3\",\"destination\":\"file:///a\"}]}",
			`json line 1, column 32 (byte 31): byte 0xC3 is not UTF-8`},
		{"JSON with a bad byte on the second line", "{\n\"name\":\"\xe2\x82\",\"inputs\":[{\"source\":\"http://h/a\",\"destination\":\"file:///a\"}]}",
			`json line 2, column 9 (byte 10): byte 0xE2 is not UTF-8`},
		{"JSON with UTF-8 text and a byte order mark", "\xEF\xBB\xBF{\"name\":\"réco\",\"inputs\":[{\"source\":\"http://h/é\",\"destination\":\"file:///a\"}]}", ""},
		{"xRSL with UTF-8 text", "&(jobname=\"réco\")(inputfiles=(\"é\" \"http://h/é\"))", ""},
		{"a percent-encoded byte", "&(inputfiles=(\"a\" \"http://h/%FF\"))", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, err := Parse([]byte(tt.in), XRSLOptions{SessionDir: "/s"})
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				j.Normalize()
				if err := j.Validate(); err != nil {
					t.Fatalf("invalid: %v", err)
				}
				return
			}
			var pe *ParseError
			if err == nil || !errors.As(err, &pe) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want a *ParseError saying %q", err, tt.want)
			}
		})
	}
}
