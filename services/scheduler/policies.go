package scheduler

// The fair-share policies by name (SLUICE_POLICY), each made from its own
// settings, in the manner of Nomad's BuiltinSchedulers. Adding a policy is
// one entry here and its settings in Config.

import (
	"fmt"

	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// PolicyFactory makes a policy from the configuration; nil is ARC's.
type PolicyFactory func(Config) (core.PolicyMaker, error)

// Policies are the policies SLUICE_POLICY may name.
var Policies = map[string]PolicyFactory{
	"arc":     func(Config) (core.PolicyMaker, error) { return nil, nil },
	"dirac":   diracPolicy,
	"sam":     samPolicy,
	"enstore": enstorePolicy,
}

// policyOrder is the order policyNames lists them in.
var policyOrder = []string{"arc", "dirac", "sam", "enstore"}

// policyNames is "arc, dirac, sam or enstore", for error messages.
func policyNames() string {
	s := ""
	for i, n := range policyOrder {
		switch {
		case i == 0:
		case i == len(policyOrder)-1:
			s += " or "
		default:
			s += ", "
		}
		s += n
	}
	return s
}

// diracPolicy reads SLUICE_DIRAC_*.
func diracPolicy(c Config) (core.PolicyMaker, error) {
	var err error
	dc := core.DIRACConfig{MaxGlobalCorrection: c.DIRACMaxCorrection}
	if dc.Groups, err = core.ParseDIRACGroups(c.DIRACGroups); err != nil {
		return nil, err
	}
	if dc.Slices, err = core.ParseDIRACSlices(c.DIRACSlices); err != nil {
		return nil, err
	}
	if dc.Unit, err = core.ParseUnit(c.DIRACUnit); err != nil {
		return nil, fmt.Errorf("DIRAC: %w", err)
	}
	return core.NewDIRAC(dc), nil
}

// samPolicy reads SLUICE_SAM_*.
func samPolicy(c Config) (core.PolicyMaker, error) {
	sc, err := core.ParseSAMGroups(c.SAMGroups)
	if err != nil {
		return nil, err
	}
	if sc.Unit, err = core.ParseUnit(c.SAMUnit); err != nil {
		return nil, fmt.Errorf("SAM: %w", err)
	}
	return core.NewSAM(sc), nil
}

// enstorePolicy reads SLUICE_ENSTORE_*; the slots groups own must fit in
// the smallest state.
func enstorePolicy(c Config) (core.PolicyMaker, error) {
	var err error
	var ec core.EnstoreConfig
	if ec.Admin, err = core.ParseEnstoreAdmin(c.EnstoreAdmin); err != nil {
		return nil, err
	}
	if ec.Owned, err = core.ParseOwned(c.EnstoreOwned); err != nil {
		return nil, err
	}
	owned := 0
	for _, n := range ec.Owned {
		owned += n
	}
	if owned > min(c.MaxDelivery, c.MaxProcessor) && c.MaxDelivery > 0 && c.MaxProcessor > 0 {
		return nil, fmt.Errorf("Enstore owned slots add up to %d, more than the %d slots of the smallest state", owned, min(c.MaxDelivery, c.MaxProcessor))
	}
	return core.NewEnstore(ec), nil
}
