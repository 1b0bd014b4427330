package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestStatusOfADTRSaysHowItsBytesMovedAndWhyItsChecksumWasNotVerified(t *testing.T) {
	var out bytes.Buffer
	printDTR(&out, dtr.DTR{ID: uuid.New(), State: dtr.Done, TransferMethod: dtr.TransferPull,
		ChecksumUnverified: "the destination storage gives no adler32 checksum and the job expects none"}, "")
	for _, want := range []string{"transfer             third-party pull",
		"checksum unverified  the destination storage gives no adler32 checksum and the job expects none"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
}
