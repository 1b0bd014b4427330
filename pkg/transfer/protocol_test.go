package transfer

import (
	"slices"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// TestEverySchemeOfTheTableHasAProtocolAndNoOther: the scheme table of
// pkg/dtr and the protocols here name the same schemes.
func TestEverySchemeOfTheTableHasAProtocolAndNoOther(t *testing.T) {
	var table, registered []string
	for _, s := range dtr.SchemeTable {
		table = append(table, s.Name)
	}
	for name := range protocols {
		registered = append(registered, name)
	}
	slices.Sort(table)
	slices.Sort(registered)
	if !slices.Equal(table, registered) {
		t.Fatalf("dtr.SchemeTable has %v; protocols registers %v", table, registered)
	}
}
