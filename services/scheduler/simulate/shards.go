package simulate

import (
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"net/url"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// ShardBy says how shares are assigned to shards (docs/scale.md).
type ShardBy string

const (
	// ShardByLoad is an explicit map made from the workload: the shares by
	// their number of files, most first, each to the shard with the fewest
	// files so far (ties to the lower shard), as an operator would balance
	// them by hand.
	ShardByLoad ShardBy = "load"
	// ShardByHash is a stable hash: FNV-1a of the share's name modulo the
	// number of shards.
	ShardByHash ShardBy = "hash"
)

// Sharding shapes a run whose shares are split between several cores, each
// with its own slot budget from a global allocator (docs/scale.md).
type Sharding struct {
	// Shards is how many cores the shares are split between; 0 or 1 is one
	// core, today's scheduler.
	Shards int
	// By is how shares are assigned to shards (default ShardByLoad).
	By ShardBy
	// Period is how often the allocator leases budgets (default 1 s); it is
	// rounded up to a whole number of Options.Step.
	Period time.Duration
}

func (s *Sharding) defaults() error {
	s.Shards = max(s.Shards, 1)
	if s.By == "" {
		s.By = ShardByLoad
	}
	if s.By != ShardByLoad && s.By != ShardByHash {
		return fmt.Errorf("shard by %q: want %s or %s", s.By, ShardByLoad, ShardByHash)
	}
	if s.Period <= 0 {
		s.Period = time.Second
	}
	return nil
}

// ShareSplit is one share's part of the transfer slot-time, against its
// part of the configured priorities, while every share had files waiting.
type ShareSplit struct {
	Share      string  `json:"share"`
	Shard      int     `json:"shard"`
	Priority   int     `json:"priority"`
	Configured float64 `json:"configured_pct"`
	Realised   float64 `json:"realised_pct"`
	// ErrorPP is realised less configured, in percentage points.
	ErrorPP float64 `json:"error_pp"`
}

// ShardedResult is a run whose shares were split between shards.
type ShardedResult struct {
	Result
	Shards int           `json:"shards"`
	By     ShardBy       `json:"shard_by"`
	Period time.Duration `json:"budget_period_ns"`
	// Saturated is the virtual time during which every share had files
	// waiting for their transfer: the split is measured over it.
	Saturated time.Duration `json:"saturated_ns"`
	Split     []ShareSplit  `json:"split"`
	// MaxErrorPP is the largest error of a share's split, in percentage
	// points (absolute).
	MaxErrorPP float64 `json:"max_error_pp"`
	// Decisions counts the cores' decisions: grants, and DTRs ended.
	Decisions uint64 `json:"decisions"`
}

// RunSharded replays work through sh.Shards cores made with cfg, the shares
// split between them and the slots leased to them by an Allocator every
// sh.Period, all on one virtual clock; between leases the shards run in
// parallel goroutines. With one shard it decides exactly as Run does.
func RunSharded(cfg core.Config, work []Arrival, opt Options, sh Sharding) (ShardedResult, error) {
	if err := sh.defaults(); err != nil {
		return ShardedResult{}, err
	}
	opt.defaults()
	r := newRun(cfg, work, opt, sh, true)
	if err := r.run(); err != nil {
		return ShardedResult{}, err
	}
	out := ShardedResult{Result: r.result(), Shards: sh.Shards, By: sh.By, Period: r.period, Decisions: r.decisions()}
	out.Saturated, out.Split = r.split()
	for _, s := range out.Split {
		out.MaxErrorPP = max(out.MaxErrorPP, math.Abs(s.ErrorPP))
	}
	return out, nil
}

// shareInfo is one share of a run: its name (with the direction), the base
// its shard is chosen by, its shard and configured priority.
type shareInfo struct {
	name, base string
	shard      int
	priority   int
}

// multiRun is one run over one or more shards.
type multiRun struct {
	cfg    core.Config
	opt    Options
	sh     Sharding
	period time.Duration
	steps  int // steps per period
	start  time.Time
	total  int // files
	shards []*shard
	shares []shareInfo
	alloc  *Allocator
	policy string
	track  bool // record the split per step
	// timeShards runs the shards of a period one after another and adds
	// the slowest one's time to slowest, every one's to shardTime.
	// held and saturated are the split so far (addSplit).
	timeShards         bool
	slowest, shardTime time.Duration
	held               []int64
	saturated          int
}

func newRun(cfg core.Config, work []Arrival, opt Options, sh Sharding, track bool) *multiRun {
	cfg.Optimizer.Enabled = false // workloads have no link model (links.go)
	cfg.MaxDelivery = opt.Slots
	cfg.MaxProcessor = max(cfg.MaxProcessor, 10*opt.Slots) // processing is instant here
	cfg.Lease = 365 * 24 * time.Hour
	r := &multiRun{cfg: cfg, opt: opt, sh: sh, total: len(work), track: track,
		start: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	r.steps = max(1, int((sh.Period+opt.Step-1)/opt.Step))
	r.period = time.Duration(r.steps) * opt.Step
	// Which share each arrival is in, as the cores' policy names it.
	router := core.New(cfg)
	r.policy = router.Policy().Name()
	work = append([]Arrival(nil), work...)
	sort.SliceStable(work, func(i, j int) bool { return work[i].At < work[j].At })
	shareOf := make([]int, len(work))
	index := map[string]int{}
	files := map[string]int{} // by base share
	dtrs := make([]*dtr.DTR, len(work))
	for i, a := range work {
		d := arrivalDTR(i, a)
		dtrs[i] = d
		base := router.Policy().Share(d)
		name := core.SubShare(base, d.Direction)
		k, ok := index[name]
		if !ok {
			k = len(r.shares)
			index[name] = k
			r.shares = append(r.shares, shareInfo{name: name, base: base, priority: router.SharePriority(name)})
		}
		shareOf[i] = k
		files[base]++
	}
	shardOf := assignShards(files, sh)
	for k := range r.shares {
		r.shares[k].shard = shardOf[r.shares[k].base]
	}
	for n := 0; n < sh.Shards; n++ {
		r.shards = append(r.shards, &shard{c: core.New(cfg), stats: map[string]*GroupResult{}, waits: map[string]time.Duration{},
			transfers: map[string]int{}, byShare: make([]int32, len(r.shares))})
	}
	for i, a := range work {
		s := r.shards[r.shares[shareOf[i]].shard]
		s.work = append(s.work, arrival{Arrival: a, index: i, share: shareOf[i], group: a.groupUnder(cfg.SharePolicy, r.shares[shareOf[i]].name), dtr: dtrs[i]})
	}
	for _, s := range r.shards {
		s.byID = make(map[uuid.UUID]*info, len(s.work))
		s.infos = make([]info, len(s.work))
	}
	if sh.Shards > 1 {
		total := map[dtr.State]int{}
		for _, s := range dtr.QueueStates {
			total[s] = r.shards[0].c.Limit(s)
		}
		r.alloc = NewAllocator(total, sh.Shards)
	}
	return r
}

// assignShards maps each base share to its shard.
func assignShards(files map[string]int, sh Sharding) map[string]int {
	out := map[string]int{}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	switch sh.By {
	case ShardByHash:
		for _, name := range names {
			h := fnv.New32a()
			h.Write([]byte(name))
			out[name] = int(h.Sum32() % uint32(sh.Shards))
		}
	default:
		sort.Slice(names, func(i, j int) bool {
			if files[names[i]] != files[names[j]] {
				return files[names[i]] > files[names[j]]
			}
			return names[i] < names[j]
		})
		load := make([]int, sh.Shards)
		for _, name := range names {
			k := 0
			for j := range load {
				if load[j] < load[k] {
					k = j
				}
			}
			out[name] = k
			load[k] += files[name]
		}
	}
	return out
}

// arrivalDTR is the DTR of the i-th arrival (in order of arrival).
func arrivalDTR(i int, a Arrival) *dtr.DTR {
	d := &dtr.DTR{ID: uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "sim-%d", i)),
		Source:      fmt.Sprintf("https://source.example/%s/%d", url.PathEscape(a.Group()), i),
		Destination: fmt.Sprintf("file:///sim/%d", i),
		Owner:       dtr.Identity{DN: a.DN}, UserPriority: a.Priority, Direction: a.Direction}
	d.Options.Activity = a.Activity
	if a.FQAN != "" {
		d.Owner.FQANs = []string{a.FQAN}
	}
	return d
}

// errLimit says a shard ran past Options.Limit.
var errLimit = errors.New("past the limit of virtual time")

// run drives every shard to its end, period by period.
func (r *multiRun) run() error {
	var wg sync.WaitGroup
	errs := make([]error, len(r.shards))
	loads := make([]*ShardLoad, len(r.shards))
	for k := range loads {
		loads[k] = &ShardLoad{} // nothing yet: the first lease spreads the slots
	}
	for step := 0; ; step += r.steps {
		live := false
		for _, s := range r.shards {
			live = live || s.done < len(s.work)
		}
		if !live {
			return nil
		}
		if r.alloc != nil {
			for k, b := range r.alloc.Lease(r.start.Add(time.Duration(step)*r.opt.Step), loads) {
				for state, n := range b {
					if err := r.shards[k].c.SetLimit(state, n); err != nil {
						return fmt.Errorf("shard %d: %w", k, err)
					}
				}
			}
		}
		switch {
		case len(r.shards) == 1:
			errs[0] = r.shards[0].steps(r, step, step+r.steps)
		case r.timeShards:
			// One shard after another, each timed: the period takes as long
			// as its slowest shard would with a processor of its own.
			slowest := time.Duration(0)
			for k, s := range r.shards {
				began := time.Now()
				errs[k] = s.steps(r, step, step+r.steps)
				stats, _ := s.c.Shares()
				loads[k] = &ShardLoad{Shares: stats}
				took := time.Since(began)
				slowest = max(slowest, took)
				r.shardTime += took
			}
			r.slowest += slowest
		default:
			for k, s := range r.shards {
				wg.Go(func() {
					errs[k] = s.steps(r, step, step+r.steps)
					stats, _ := s.c.Shares()
					loads[k] = &ShardLoad{Shares: stats}
				})
			}
			wg.Wait()
		}
		if r.track {
			r.addSplit()
		}
		for k, err := range errs {
			if errors.Is(err, errLimit) {
				done := 0
				for _, s := range r.shards {
					done += s.done
				}
				return fmt.Errorf("%s: %d of %d files done after %s of virtual time", r.policy, done, r.total, r.opt.Limit)
			}
			if err != nil && len(r.shards) > 1 {
				return fmt.Errorf("shard %d: %w", k, err)
			}
			if err != nil {
				return err // one core: the error as Run always gave it
			}
		}
	}
}

// arrival is an arrival with its place in the whole workload, its share,
// its group and its DTR.
type arrival struct {
	Arrival
	index, share int
	group        string
	dtr          *dtr.DTR
}

// info is what a shard knows of one of its files: the arrival, and whether
// its transfer has started (its wait ends at the first).
type info struct {
	a       arrival
	started bool
}

// running is a grant a worker holds until end.
type running struct {
	g   core.Grant
	end time.Time
}

// stepLoad is what one step of one shard saw of the transfers.
type stepLoad struct {
	queued, running int32
}

// shard is one core and the files of its shares.
type shard struct {
	c          *core.Core
	work       []arrival
	next, done int
	byID       map[uuid.UUID]*info
	infos      []info // what byID points to, one per arrival
	held       []running
	stats      map[string]*GroupResult
	waits      map[string]time.Duration
	loads      []stepLoad
	samples    []Sample
	nextSample time.Duration
	duration   time.Duration
	// For the split: per share index, files not yet started on their
	// transfer, and per step the transfers each share held (-1: none of its
	// files waited).
	pending map[int]int
	// split holds splitRows steps since the last addSplit, then its rows
	// to reuse, each by share index (only this shard's are set).
	split     [][]int32
	splitRows int
	// Buffers of a step.
	transfers map[string]int
	byShare   []int32
	due       []running
}

func (s *shard) group(name string) *GroupResult {
	if s.stats[name] == nil {
		s.stats[name] = &GroupResult{Group: name}
	}
	return s.stats[name]
}

// steps runs the shard from step from until step to, or its end.
func (s *shard) steps(r *multiRun, from, to int) error {
	opt := r.opt
	for i := from; i < to && s.done < len(s.work); i++ {
		now := r.start.Add(time.Duration(i) * opt.Step)
		el := now.Sub(r.start)
		if el > opt.Limit {
			return errLimit
		}
		for ; s.next < len(s.work) && s.work[s.next].At <= el; s.next++ {
			a := s.work[s.next]
			if err := s.c.Submit(now, a.dtr); err != nil {
				return fmt.Errorf("workload arrival %d: %w", a.index+1, err)
			}
			s.infos[s.next] = info{a: a}
			s.byID[a.dtr.ID] = &s.infos[s.next]
			s.work[s.next].dtr = nil // the core has it now
			s.group(a.group)
			if r.track {
				if s.pending == nil {
					s.pending = map[int]int{}
				}
				s.pending[a.share]++
			}
		}
		s.c.Tick(now)
		out := s.c.Take()
		for _, g := range out.Grants {
			end := now
			if g.State == dtr.Transferring {
				in := s.byID[g.DTR.ID]
				end = now.Add(opt.Overhead + time.Duration(float64(in.a.Bytes)/opt.SlotRate*float64(time.Second)))
				if !in.started {
					in.started = true
					w := now.Sub(r.start) - in.a.At
					gr := s.group(in.a.group)
					s.waits[gr.Group] += w
					gr.MaxWait = max(gr.MaxWait, w)
					if r.track {
						s.pending[in.a.share]--
					}
				}
			}
			s.held = append(s.held, running{g: g, end: end})
		}
		for _, f := range out.Final {
			in := s.byID[f.ID]
			gr := s.group(in.a.group)
			if f.State == dtr.Done {
				gr.Files++
				gr.Bytes += in.a.Bytes
			}
			gr.Finished = now.Sub(r.start)
			s.done++
		}
		// The step: slots held, then what ends.
		transfers, byShare := s.transfers, s.byShare
		clear(transfers)
		clear(byShare)
		for _, h := range s.held {
			if h.g.State == dtr.Transferring {
				in := s.byID[h.g.DTR.ID]
				transfers[in.a.group]++
				s.group(in.a.group).SlotTime += opt.Step
				byShare[in.a.share]++
			}
		}
		n := 0
		for _, v := range transfers {
			n += v
		}
		s.loads = append(s.loads, stepLoad{queued: int32(s.c.Queued(dtr.Transfer)), running: int32(n)})
		if r.track {
			if s.splitRows == len(s.split) {
				s.split = append(s.split, make([]int32, len(r.shares)))
			}
			row := s.split[s.splitRows]
			s.splitRows++
			for k := range row {
				row[k] = -1
				if s.pending[k] > 0 {
					row[k] = byShare[k]
				}
			}
		}
		if el >= s.nextSample {
			s.samples = append(s.samples, Sample{At: el, Running: maps.Clone(transfers)})
			s.nextSample += opt.Sample
		}
		after := now.Add(opt.Step)
		kept := s.held[:0]
		due := s.due[:0]
		for _, h := range s.held {
			if h.end.After(after) {
				kept = append(kept, h)
			} else {
				due = append(due, h)
			}
		}
		s.held = kept
		s.due = due
		sort.Slice(due, func(i, j int) bool { return due[i].g.ID < due[j].g.ID })
		for _, h := range due {
			in := s.byID[h.g.DTR.ID]
			result := core.Result{DTR: h.g.DTR.ID, Grant: h.g.ID, Size: in.a.Bytes}
			if h.g.State == dtr.Transferring {
				result.Bytes = in.a.Bytes
			}
			if err := s.c.Result(after, result); err != nil {
				return fmt.Errorf("result: %w", err)
			}
		}
		s.duration = after.Sub(r.start)
	}
	return nil
}

// result merges the shards' results into one.
func (r *multiRun) result() Result {
	res := Result{Policy: r.policy}
	stats := map[string]*GroupResult{}
	waits := map[string]time.Duration{}
	var offered, busy time.Duration
	for _, s := range r.shards {
		res.Duration = max(res.Duration, s.duration)
		for name, g := range s.stats {
			m := stats[name]
			if m == nil {
				m = &GroupResult{Group: name}
				stats[name] = m
			}
			m.Files += g.Files
			m.Bytes += g.Bytes
			m.SlotTime += g.SlotTime
			m.MaxWait = max(m.MaxWait, g.MaxWait)
			m.Finished = max(m.Finished, g.Finished)
			waits[name] += s.waits[name]
		}
	}
	for i := 0; ; i++ {
		var queued, n int32
		any := false
		for _, s := range r.shards {
			if i < len(s.loads) {
				any = true
				queued += s.loads[i].queued
				n += s.loads[i].running
			}
		}
		if !any {
			break
		}
		if queued > 0 {
			offered += time.Duration(r.opt.Slots) * r.opt.Step
			busy += time.Duration(min(int(n), r.opt.Slots)) * r.opt.Step
		}
	}
	if len(r.shards) == 1 {
		res.Samples = r.shards[0].samples
	} else {
		for i := 0; ; i++ {
			var sample *Sample
			for _, s := range r.shards {
				if i >= len(s.samples) {
					continue
				}
				if sample == nil {
					sample = &Sample{At: s.samples[i].At, Running: map[string]int{}}
				}
				for g, v := range s.samples[i].Running {
					sample.Running[g] += v
				}
			}
			if sample == nil {
				break
			}
			res.Samples = append(res.Samples, *sample)
		}
	}
	for name, gr := range stats {
		if gr.Files > 0 {
			gr.MeanWait = waits[name] / time.Duration(gr.Files)
		}
		res.Groups = append(res.Groups, *gr)
	}
	sort.Slice(res.Groups, func(i, j int) bool { return res.Groups[i].Group < res.Groups[j].Group })
	if offered > 0 {
		res.Utilisation = float64(busy) / float64(offered)
	}
	return res
}

// decisions counts the grants the cores gave and the DTRs they ended.
func (r *multiRun) decisions() uint64 {
	var n uint64
	for _, s := range r.shards {
		c := s.c.Counts()
		n += c.Grants + c.Done + c.Failed + c.Cancelled
	}
	return n
}

// split measures each share's part of the transfer slot-time over the
// steps in which every share had files waiting, against its part of the
// configured priorities.
func (r *multiRun) split() (time.Duration, []ShareSplit) {
	held := r.held
	var sumHeld int64
	var sumPrio int
	for k, sh := range r.shares {
		sumHeld += held[k]
		sumPrio += sh.priority
	}
	out := make([]ShareSplit, len(r.shares))
	for k, sh := range r.shares {
		out[k] = ShareSplit{Share: sh.name, Shard: sh.shard, Priority: sh.priority}
		if sumPrio > 0 {
			out[k].Configured = 100 * float64(sh.priority) / float64(sumPrio)
		}
		if sumHeld > 0 {
			out[k].Realised = 100 * float64(held[k]) / float64(sumHeld)
			out[k].ErrorPP = out[k].Realised - out[k].Configured
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Share < out[j].Share })
	if sumHeld == 0 {
		return 0, nil
	}
	return time.Duration(r.saturated) * r.opt.Step, out
}

// addSplit adds the steps the shards recorded since the last call to the
// split: each share's transfers in the steps where every share had files
// waiting. A shard that has ended recorded fewer steps; its shares wait
// for nothing after them.
func (r *multiRun) addSplit() {
	if r.held == nil {
		r.held = make([]int64, len(r.shares))
	}
	for i := 0; ; i++ {
		any, all := false, true
		for k := range r.shares {
			s := r.shards[r.shares[k].shard]
			if i < s.splitRows {
				any = true
				all = all && s.split[i][k] >= 0
			} else {
				all = false
			}
		}
		if !any {
			break
		}
		if !all {
			continue
		}
		r.saturated++
		for k := range r.shares {
			r.held[k] += int64(r.shards[r.shares[k].shard].split[i][k])
		}
	}
	for _, s := range r.shards {
		s.splitRows = 0
	}
}
