// Package dtr holds the Data Transfer Request model: ARC's states, the legal
// transitions between them as data, identities, options and error kinds.
package dtr

import (
	"fmt"
	"strings"
)

// State is one of ARC's DTR states.
type State uint8

// The states, in ARC's order. Queue states (CHECK_CACHE, RESOLVE, ...) are
// where a DTR waits for a slot; the paired "-ING" state is when a worker owns
// it; the "-ED" states are handled by the scheduler alone.
const (
	New State = iota
	CheckCache
	CheckingCache
	CacheWait
	CacheChecked
	Resolve
	Resolving
	Resolved
	QueryReplica
	QueryingReplica
	ReplicaQueried
	PreClean
	PreCleaning
	PreCleaned
	StagePrepare
	StagingPreparing
	StagingPreparingWait
	StagedPrepared
	Transfer
	Transferring
	TransferringCancel
	Transferred
	ReleaseRequest
	ReleasingRequest
	RequestReleased
	FinaliseReplica
	FinalisingReplica
	ReplicaFinalised
	RegisterReplica
	RegisteringReplica
	ReplicaRegistered
	ProcessCache
	ProcessingCache
	CacheProcessed
	Done
	Cancelled
	Error
	numStates
)

var stateNames = [numStates]string{
	"NEW", "CHECK_CACHE", "CHECKING_CACHE", "CACHE_WAIT", "CACHE_CHECKED",
	"RESOLVE", "RESOLVING", "RESOLVED",
	"QUERY_REPLICA", "QUERYING_REPLICA", "REPLICA_QUERIED",
	"PRE_CLEAN", "PRE_CLEANING", "PRE_CLEANED",
	"STAGE_PREPARE", "STAGING_PREPARING", "STAGING_PREPARING_WAIT", "STAGED_PREPARED",
	"TRANSFER", "TRANSFERRING", "TRANSFERRING_CANCEL", "TRANSFERRED",
	"RELEASE_REQUEST", "RELEASING_REQUEST", "REQUEST_RELEASED",
	"FINALISE_REPLICA", "FINALISING_REPLICA", "REPLICA_FINALISED",
	"REGISTER_REPLICA", "REGISTERING_REPLICA", "REPLICA_REGISTERED",
	"PROCESS_CACHE", "PROCESSING_CACHE", "CACHE_PROCESSED",
	"DONE", "CANCELLED", "ERROR",
}

func (s State) String() string {
	if s < numStates {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// ParseState reads a state by its ARC name.
func ParseState(name string) (State, error) {
	for i, n := range stateNames {
		if n == name {
			return State(i), nil
		}
	}
	return 0, fmt.Errorf("unknown DTR state %q", name)
}

// MarshalText writes the state as its ARC name (a JSON string).
func (s State) MarshalText() ([]byte, error) {
	if s >= numStates {
		return nil, fmt.Errorf("DTR state %d is not a state", uint8(s))
	}
	return stateTexts[s], nil
}

// stateTexts are the states' names as MarshalText returns them, made once:
// a DTR's state is written many times on its way. Their capacity is their
// length, so that appending to one copies it.
var stateTexts = func() (t [numStates][]byte) {
	for i, n := range stateNames {
		t[i] = []byte(n)[:len(n):len(n)]
	}
	return t
}()

// UnmarshalText reads a state from its ARC name, in any case.
func (s *State) UnmarshalText(b []byte) error {
	for i, n := range stateNames {
		if n == string(b) { // as written: no copy made
			*s = State(i)
			return nil
		}
	}
	v, err := ParseState(strings.ToUpper(string(b)))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// Final reports whether no further transition can leave s.
func (s State) Final() bool { return s == Done || s == Cancelled || s == Error }

// Stage names the kind of worker that owns a DTR in a given active state.
type Stage string

// The worker stages. Each has its own grant subject.
const (
	StagePre      Stage = "pre"
	StageDelivery Stage = "delivery"
	StagePost     Stage = "post"
)

// Stages lists the worker stages. Each has its grant, result and progress
// subjects and a durable grant consumer of its name, shared by all the
// workers of that stage.
var Stages = []Stage{StagePre, StageDelivery, StagePost}

// queueStates is the table of steps: each queue state with the active state
// a grant moves it to, the "-ED" state a successful result moves it to, the
// stage of the worker that does the work, and its slot class. Adding a step
// is one row here, its moves in transitions, its routing in the scheduler's
// core (route.go) and its handler in the worker of its stage.
var queueStates = map[State]struct {
	active, done State
	stage        Stage
	slots        SlotClass
}{
	CheckCache: {CheckingCache, CacheChecked, StagePre,
		SlotClass{CancelTo: CacheProcessed, HungTo: ReplicaRegistered}},
	Resolve: {Resolving, Resolved, StagePre,
		SlotClass{CancelTo: ReplicaRegistered, HungTo: RequestReleased}},
	QueryReplica: {QueryingReplica, ReplicaQueried, StagePre,
		SlotClass{CancelTo: RequestReleased, HungTo: RequestReleased}},
	PreClean: {PreCleaning, PreCleaned, StagePre,
		SlotClass{CancelTo: RequestReleased, HungTo: RequestReleased}},
	StagePrepare: {StagingPreparing, StagedPrepared, StagePre,
		SlotClass{Pins: true, CancelTo: RequestReleased, HungTo: Transferred}},
	Transfer: {Transferring, Transferred, StageDelivery,
		SlotClass{Pool: DeliverySlots, PerHost: true, ChargesBytes: true, IsTransfer: true,
			Cancelling: TransferringCancel, CancelTo: Transferred, HungTo: Transferred}},
	ReleaseRequest: {ReleasingRequest, RequestReleased, StagePost,
		SlotClass{HungTo: RequestReleased}},
	FinaliseReplica: {FinalisingReplica, ReplicaFinalised, StagePost,
		SlotClass{HungTo: ReplicaFinalised}},
	RegisterReplica: {RegisteringReplica, ReplicaRegistered, StagePost,
		SlotClass{CleansUp: true, HungTo: ReplicaRegistered}},
	ProcessCache: {ProcessingCache, CacheProcessed, StagePost,
		SlotClass{CleansUp: true, HungTo: CacheProcessed}},
}

// SlotPool names the configured limit that a queue state's grants count
// against.
type SlotPool int

const (
	// ProcessorSlots is MAXPROCESSOR, per pre- and post-processing state.
	ProcessorSlots SlotPool = iota
	// DeliverySlots is MAXDELIVERY, the transfer slots.
	DeliverySlots
)

// SlotClass says how the scheduler counts and limits the grants of one
// queue state, and where its DTRs go when cancelled or lost, so that no
// code asks "is this TRANSFER?".
type SlotClass struct {
	// Pool is the configured limit the state's grants count against.
	Pool SlotPool
	// PerHost says the grants count against MAXPERHOST at the storage
	// endpoints of the DTR's ends.
	PerHost bool
	// ChargesBytes says the policy is charged the bytes a grant moved, not
	// just the time it held the slot.
	ChargesBytes bool
	// Pins says a grant stages a copy of the source that the DTR holds
	// until RELEASE_REQUEST, counted against its share's MAXPREPARED.
	Pins bool
	// IsTransfer says a grant is the DTR's transfer: it is recorded as
	// TransferGrant, and its result brings when the transfer started and
	// ended.
	IsTransfer bool
	// CleansUp says a grant for a DTR that failed or was cancelled asks
	// its worker to clean up what the transfer left instead of doing the
	// step, unless a finalise is being tried again.
	CleansUp bool
	// Cancelling is the state a running grant moves to when its DTR is
	// cancelled (0: it stays in its active state until its result).
	Cancelling State
	// CancelTo is where a DTR queued in the state goes when it is
	// cancelled (ARC's cancel mapping); 0 for post-processing, which runs
	// on to clean up.
	CancelTo State
	// HungTo is where a running DTR goes whose worker stopped answering
	// (ARC's hung-worker mapping), from its active or cancelling state.
	HungTo State
}

// Slots returns the slot class of queue state s (the zero class for any
// other state).
func (s State) Slots() SlotClass { return queueStates[s].slots }

// QueueStates lists the states in which DTRs wait for a slot, in ARC's order.
var QueueStates = []State{CheckCache, Resolve, QueryReplica, PreClean, StagePrepare,
	Transfer, ReleaseRequest, FinaliseReplica, RegisterReplica, ProcessCache}

// IsQueue reports whether s is a state in which a DTR waits for a slot.
func (s State) IsQueue() bool { _, ok := queueStates[s]; return ok }

// Active returns the state a grant moves a queued DTR to.
func (s State) Active() State { return queueStates[s].active }

// Completed returns the "-ED" state a successful result moves a queued
// state's DTR to.
func (s State) Completed() State { return queueStates[s].done }

// Stage returns the worker stage that serves queue state s.
func (s State) Stage() Stage { return queueStates[s].stage }

// IsActive reports whether a worker owns a DTR in state s.
func (s State) IsActive() bool {
	for _, q := range queueStates {
		if q.active == s {
			return true
		}
	}
	return s == TransferringCancel
}

// QueueOf returns the queue state whose active state is s.
func QueueOf(active State) (State, bool) {
	for q, v := range queueStates {
		if v.active == active {
			return q, true
		}
	}
	return 0, false
}

// transitions is the table of legal moves. It follows ARC's scheduler
// (ARC's DTR state machine): queue → active → "-ED" → next queue, the skips
// ARC takes when a step does not apply (no cache, no index, not stageable),
// the cancel and hung-worker mappings, the retry from CACHE_PROCESSED back
// to NEW (or on to CACHE_CHECKED without the cache, after a wait for
// another DTR's cache download timed out), and (Sluice's) an active state back to its queue when the worker
// gives its grant back unfinished.
var transitions = map[State][]State{
	New:                  {CacheChecked, CheckCache, CacheWait, CacheProcessed, Error},
	CheckCache:           {CheckingCache, CacheProcessed},
	CheckingCache:        {CacheChecked, CacheWait, ReplicaRegistered, CheckCache},
	CacheWait:            {CheckCache, CacheProcessed},
	CacheChecked:         {ProcessCache, Resolve, Resolved, ReplicaRegistered},
	Resolve:              {Resolving, ReplicaRegistered},
	Resolving:            {Resolved, RequestReleased, Resolve},
	Resolved:             {QueryReplica, ProcessCache, CacheProcessed, RequestReleased},
	QueryReplica:         {QueryingReplica, RequestReleased},
	QueryingReplica:      {ReplicaQueried, RequestReleased, QueryReplica},
	ReplicaQueried:       {PreClean, StagedPrepared, Transferred, QueryReplica, FinaliseReplica, RequestReleased},
	PreClean:             {PreCleaning, RequestReleased},
	PreCleaning:          {PreCleaned, RequestReleased, PreClean},
	PreCleaned:           {StagePrepare, StagedPrepared, CacheProcessed, RequestReleased},
	StagePrepare:         {StagingPreparing, RequestReleased},
	StagingPreparing:     {StagingPreparingWait, StagedPrepared, Transferred, StagePrepare},
	StagingPreparingWait: {StagePrepare, ReleaseRequest, Transferred},
	StagedPrepared:       {Transfer, ReleaseRequest, Transferred},
	Transfer:             {Transferring, Transferred},
	Transferring:         {Transferred, TransferringCancel, Transfer},
	TransferringCancel:   {Transferred},
	Transferred:          {ReleaseRequest, RequestReleased},
	ReleaseRequest:       {ReleasingRequest},
	ReleasingRequest:     {RequestReleased, ReleaseRequest},
	RequestReleased:      {FinaliseReplica, ReplicaFinalised},
	FinaliseReplica:      {FinalisingReplica},
	FinalisingReplica:    {ReplicaFinalised, FinaliseReplica},
	ReplicaFinalised:     {RegisterReplica, ReplicaRegistered, QueryReplica},
	RegisterReplica:      {RegisteringReplica},
	RegisteringReplica:   {ReplicaRegistered, RegisterReplica},
	ReplicaRegistered:    {ProcessCache, CacheProcessed},
	ProcessCache:         {ProcessingCache},
	ProcessingCache:      {CacheProcessed, ProcessCache},
	CacheProcessed:       {Done, Cancelled, Error, New, RegisterReplica, CacheChecked},
}

// CanTransition reports whether from → to is a legal move.
func CanTransition(from, to State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// ErrIllegalTransition is wrapped by every refused transition.
var ErrIllegalTransition = fmt.Errorf("illegal DTR transition")
