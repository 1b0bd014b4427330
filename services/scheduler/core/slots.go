package core

// The slot classes: what a grant in each queue state takes besides its slot,
// as data. The states themselves and their legal moves are pkg/dtr's state
// table; this one says how the core counts and limits the grants of each,
// so that no other code asks "is this TRANSFER?".

import "github.com/sluice-dtr/sluice/pkg/dtr"

// slotClass is how the core treats the grants of one queue state.
type slotClass struct {
	// limit is the Config field that caps how many grants of the state
	// run at once.
	limit func(*Config) int
	// perHost says the grants count against MaxPerHost at the storage
	// endpoints of the DTR's ends (hosts.go).
	perHost bool
	// chargesBytes says the policy is charged the bytes a grant moved, not
	// just the time it held the slot.
	chargesBytes bool
	// pins says a grant stages a copy of the source that the DTR holds
	// until RELEASE_REQUEST, counted against its share's MaxPrepared
	// (pins.go).
	pins bool
	// transfer says a grant is the DTR's transfer: it is recorded as
	// TransferGrant, and its result brings when the transfer started and
	// ended.
	transfer bool
	// cleansUp says a grant for a DTR that failed or was cancelled asks
	// its worker to clean up what the transfer left, instead of doing the
	// step (Grant.Cleanup), unless a finalise is being tried again.
	cleansUp bool
	// cancelling is the active state a running grant moves to when its DTR
	// is cancelled (0: it stays in its active state until its result).
	cancelling dtr.State
	// cancelTo is where a DTR queued in the state goes when it is
	// cancelled (ARC's cancel mapping); 0 for post-processing, which runs
	// on to clean up.
	cancelTo dtr.State
	// hungTo is where a running DTR goes whose worker stopped answering
	// (ARC's hung-worker mapping), from its active or cancelling state.
	hungTo dtr.State
}

func processorLimit(c *Config) int { return c.MaxProcessor }
func deliveryLimit(c *Config) int  { return c.MaxDelivery }

// slotClasses has one row per queue state (dtr.QueueStates).
var slotClasses = map[dtr.State]slotClass{
	dtr.CheckCache:   {limit: processorLimit, cancelTo: dtr.CacheProcessed, hungTo: dtr.ReplicaRegistered},
	dtr.Resolve:      {limit: processorLimit, cancelTo: dtr.ReplicaRegistered, hungTo: dtr.RequestReleased},
	dtr.QueryReplica: {limit: processorLimit, cancelTo: dtr.RequestReleased, hungTo: dtr.RequestReleased},
	dtr.PreClean:     {limit: processorLimit, cancelTo: dtr.RequestReleased, hungTo: dtr.RequestReleased},
	dtr.StagePrepare: {limit: processorLimit, pins: true, cancelTo: dtr.RequestReleased, hungTo: dtr.Transferred},
	dtr.Transfer: {limit: deliveryLimit, perHost: true, chargesBytes: true, transfer: true,
		cancelling: dtr.TransferringCancel, cancelTo: dtr.Transferred, hungTo: dtr.Transferred},
	dtr.ReleaseRequest:  {limit: processorLimit, hungTo: dtr.RequestReleased},
	dtr.FinaliseReplica: {limit: processorLimit, hungTo: dtr.ReplicaFinalised},
	dtr.RegisterReplica: {limit: processorLimit, cleansUp: true, hungTo: dtr.ReplicaRegistered},
	dtr.ProcessCache:    {limit: processorLimit, cleansUp: true, hungTo: dtr.CacheProcessed},
}

// slotTable is slotClasses indexed by state, and slotQueue the queue state
// whose slot each active or cancelling state holds, for lookups on the
// hot path without a map.
var (
	slotTable [256]*slotClass
	slotQueue [256]dtr.State
	hasSlot   [256]bool
)

func init() {
	for _, q := range dtr.QueueStates {
		k, ok := slotClasses[q]
		if !ok {
			panic("core: no slot class for queue state " + q.String())
		}
		slotTable[q] = &k
		for _, s := range []dtr.State{q, q.Active(), k.cancelling} {
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

// Limit returns the slot limit of a queue state.
func (c *Core) Limit(s dtr.State) int {
	if k := classOf(s); k != nil {
		return k.limit(&c.cfg)
	}
	return c.cfg.MaxProcessor
}

// stageOf returns the worker stage of a queue, active or cancelling state,
// "" for the states the scheduler handles itself.
func stageOf(s dtr.State) dtr.Stage {
	if q, ok := queueOf(s); ok {
		return q.Stage()
	}
	return ""
}
