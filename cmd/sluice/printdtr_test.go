package main

import (
	"strings"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestStatusOfADTRSaysWhatItsChecksumWasCheckedAgainst(t *testing.T) {
	for source, want := range map[string]string{
		dtr.ChecksumFromStorage: "adler32:0a0b0c0d (confirmed by the storage's own)",
		dtr.ChecksumFromStream:  "adler32:0a0b0c0d (computed on the stream only: the storage stated none)",
		"":                      "adler32:0a0b0c0d\n",
	} {
		var b strings.Builder
		printDTR(&b, dtr.DTR{Checksum: "adler32:0a0b0c0d", ChecksumSource: source}, "")
		if !strings.Contains(b.String(), want) {
			t.Errorf("checksum source %q: status says\n%s\nwant %q", source, b.String(), want)
		}
	}
}
