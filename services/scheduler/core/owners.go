package core

import (
	"math"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// OwnerUse is what one owner's unfinished DTRs hold: how many there are
// and about how many bytes their records take, in memory and in the store.
// The scheduler refuses new DTRs of an owner past its limits (admit.go).
type OwnerUse struct {
	DTRs  int   `json:"dtrs"`
	Bytes int64 `json:"bytes"`
}

// Owner returns what the unfinished DTRs of the owner with DN dn hold.
func (c *Core) Owner(dn string) OwnerUse { return c.owners[dn] }

// own counts e for its owner; disown stops counting it.
func (c *Core) own(e *entry) {
	e.footprint = int32(min(dtr.Footprint(e.d), math.MaxInt32))
	u := c.owners[e.d.Owner.DN]
	u.DTRs++
	u.Bytes += int64(e.footprint)
	c.owners[e.d.Owner.DN] = u
}

func (c *Core) disown(e *entry) {
	u := c.owners[e.d.Owner.DN]
	u.DTRs--
	u.Bytes -= int64(e.footprint)
	if u.DTRs <= 0 {
		delete(c.owners, e.d.Owner.DN)
		return
	}
	c.owners[e.d.Owner.DN] = u
}
