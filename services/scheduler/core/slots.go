package core

// The slot classes: what a grant in each queue state takes besides its slot.
// They are data in pkg/dtr's state table, beside the states' moves; here
// they are indexed for the hot path and their pools read from the Config,
// so that no code of the core asks "is this TRANSFER?".

import (
	"fmt"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// slotClass is a queue state's slot class (pkg/dtr's state table) with the
// Config field that its pool names.
type slotClass struct {
	dtr.SlotClass
	// limit reads the state's limit from the Config.
	limit func(*Config) int
}

func processorLimit(c *Config) int { return c.MaxProcessor }
func deliveryLimit(c *Config) int  { return c.MaxDelivery }

// poolLimits reads each slot pool's limit from the Config.
var poolLimits = map[dtr.SlotPool]func(*Config) int{
	dtr.ProcessorSlots: processorLimit,
	dtr.DeliverySlots:  deliveryLimit,
}

// slotTable is the slot classes indexed by state, and slotQueue the queue state
// whose slot each active or cancelling state holds, for lookups on the
// hot path without a map.
var (
	slotTable [256]*slotClass
	slotQueue [256]dtr.State
	hasSlot   [256]bool
)

func init() {
	for _, q := range dtr.QueueStates {
		limit, ok := poolLimits[q.Slots().Pool]
		if !ok {
			panic("core: no limit for the slot pool of queue state " + q.String())
		}
		k := slotClass{SlotClass: q.Slots(), limit: limit}
		slotTable[q] = &k
		for _, s := range []dtr.State{q, q.Active(), k.Cancelling} {
			if s != 0 {
				slotQueue[s], hasSlot[s] = q, true
			}
		}
	}
}

// classOf returns the slot class of a queue state (nil for another state).
func classOf(q dtr.State) *slotClass { return slotTable[q] }

// queueOf returns the queue state whose slot a queue, active or cancelling
// state waits for or holds.
func queueOf(s dtr.State) (dtr.State, bool) { return slotQueue[s], hasSlot[s] }

// Limit returns the slot limit of a queue state: the one SetLimit set, else
// its pool's from the Config.
func (c *Core) Limit(s dtr.State) int {
	if n := c.limits[s]; n > 0 {
		return int(n - 1)
	}
	if k := classOf(s); k != nil {
		return k.limit(&c.cfg)
	}
	return c.cfg.MaxProcessor
}

// SetLimit sets the slot limit of one queue state in place of its pool's
// (MaxProcessor or MaxDelivery), for a scheduler whose slots are leased to
// it from a budget shared with others; n < 0 goes back to the Config's. The
// split follows at the next tick. Grants above a lowered limit run to their
// end, and no new one starts until the state is below it.
func (c *Core) SetLimit(s dtr.State, n int) error {
	if classOf(s) == nil {
		return fmt.Errorf("set the slot limit of %s: not a queue state", s)
	}
	c.limits[s] = int32(max(n+1, 0))
	return nil
}

// stageOf returns the worker stage of a queue, active or cancelling state,
// "" for the states the scheduler handles itself.
func stageOf(s dtr.State) dtr.Stage {
	if q, ok := queueOf(s); ok {
		return q.Stage()
	}
	return ""
}
