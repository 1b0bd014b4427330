// Package fairshare holds the fair-share policies besides ARC's (which is
// the core's default): DIRAC's, SAM's and Enstore's, and the byte-fair
// wrapper that goes over any of them. Each implements core.Policy and is
// made from its own settings, in the manner of Nomad's BuiltinSchedulers:
// Factories maps each name SLUICE_POLICY may take to the function that
// makes that policy from its settings.
//
// Adding a policy is a file here (the policy, its settings struct with
// its SLUICE_* variables, and a method that parses them into a
// core.PolicyMaker), its settings embedded in Settings, and one entry in
// Factories.
package fairshare

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// Settings are every policy's settings, each policy's in a struct of its
// own. They are filled from the environment with the rest of the
// scheduler's configuration (which embeds them): the structs are embedded
// so that the variables keep their names, SLUICE_DIRAC_GROUPS and so on.
type Settings struct {
	DIRACSettings
	ByteFairSettings
	SAMSettings
	EnstoreSettings
}

// Slots are the slots the policy will divide: per pre- and post-processing
// state (SLUICE_MAXPROCESSOR) and for transfers (SLUICE_MAXDELIVERY).
type Slots struct {
	Processor, Delivery int
}

// Factory makes a policy from its settings; a nil maker is ARC's, the
// core's default.
type Factory func(Settings, Slots) (core.PolicyMaker, error)

// Factories are the policies SLUICE_POLICY may name.
var Factories = map[string]Factory{
	"arc":     func(Settings, Slots) (core.PolicyMaker, error) { return nil, nil },
	"dirac":   func(s Settings, _ Slots) (core.PolicyMaker, error) { return s.DIRACSettings.Maker() },
	"sam":     func(s Settings, _ Slots) (core.PolicyMaker, error) { return s.SAMSettings.Maker() },
	"enstore": func(s Settings, slots Slots) (core.PolicyMaker, error) { return s.EnstoreSettings.Maker(slots) },
}

// Default is the policy of an empty SLUICE_POLICY.
const Default = "arc"

// Make returns the maker of the policy named name (any case; empty is
// Default) from its settings, made byte-fair if SLUICE_BYTEFAIR is set.
func Make(name string, s Settings, slots Slots) (core.PolicyMaker, error) {
	factory, ok := Factories[cmp.Or(strings.ToLower(name), Default)]
	if !ok {
		return nil, fmt.Errorf("policy %q is not %s", name, Names())
	}
	p, err := factory(s, slots)
	if err != nil {
		return nil, err
	}
	return s.ByteFairSettings.Wrap(p)
}

// Names is the names of Factories for messages, the default first and
// the others in alphabetical order: "arc, dirac, enstore or sam".
func Names() string {
	var names []string
	for n := range Factories {
		if n != Default {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	names = append([]string{Default}, names...)
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// userPriority is a DTR's user priority within 1–100 (0 means 50): the
// priority inside a share under the policies that take it as it is.
func userPriority(d *dtr.DTR) int {
	if d.UserPriority == 0 {
		return 50
	}
	return max(1, min(100, d.UserPriority))
}
