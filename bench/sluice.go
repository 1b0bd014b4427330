package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
	"github.com/sluice-dtr/sluice/services/delivery"
	"github.com/sluice-dtr/sluice/services/generator"
	"github.com/sluice-dtr/sluice/services/processor"
	"github.com/sluice-dtr/sluice/services/scheduler"
)

// config is the services' configuration in the measurements: the defaults
// of the environment, with slots and workers for a busy site. Ageing is the
// scheduler's default: AGE_AFTER_STATES left empty keeps ARC's per-state
// deadlines, and CACHE_WAIT_TIMEOUT left zero is its day.
func config(slots int) app.Config {
	return app.Config{
		// The measurements' storage servers are on loopback.
		AllowNetworks: []string{"127.0.0.0/8"},
		Config: scheduler.Config{MaxProcessor: slots, MaxDelivery: slots, MaxEmergency: 1, MaxTransferTries: 10,
			RetryBase: time.Second, Lease: 2 * time.Minute, Tick: 50 * time.Millisecond, AgeAfter: time.Hour, AgeEvery: 5 * time.Minute,
			ChainPreClean: true}, // SLUICE_CHAIN_PRECLEAN's default
		Generator: generator.Config{MaxFiles: 100_000},
		Processor: processor.Config{PreWorkers: slots, PostWorkers: slots},
		Delivery:  delivery.Config{Workers: slots + 1, MaxInactivity: 5 * time.Minute, MinSpeedTime: 5 * time.Minute},
	}
}

// configEnv is config(slots) for roles run as child processes.
func configEnv(slots int) []string {
	n := strconv.Itoa(slots)
	return []string{"SLUICE_MAXPROCESSOR=" + n, "SLUICE_MAXDELIVERY=" + n, "SLUICE_PROCESSOR_PRE_WORKERS=" + n,
		"SLUICE_PROCESSOR_POST_WORKERS=" + n, "SLUICE_DELIVERY_WORKERS=" + strconv.Itoa(slots+1),
		"SLUICE_GENERATOR_MAX_FILES=100000", "SLUICE_RETRY_BASE=1s", "SLUICE_ALLOW_NETWORKS=127.0.0.0/8",
		// The benchmark measures the scheduler with every slot usable:
		// no per-link limit.
		"SLUICE_OPTIMIZER=off"}
}

// ThroughputSlots is the number of slots of each state (and workers of
// each pool) of a throughput run: as deep as the baseline's pipeline, whose
// consumers each pull up to 500 messages ahead. More DTRs in flight make
// larger batches of grants and results; with 50 slots a DTR costs about a
// third more CPU (BENCHMARKS.md, "Where the end-to-end time goes").
const ThroughputSlots = 500

// Throughput moves n 1 KiB files file→file as one job, with slots slots in
// each state, and returns DTRs per second from submission to the job's
// end. With exe set the four roles run as separate processes of that
// binary; otherwise all in this process.
func Throughput(ctx context.Context, dir string, n, slots int, exe string) (float64, error) {
	rate, _, err := throughput(ctx, dir, n, slots, exe)
	return rate, err
}

// ThisProcess is the key, among the CPU times throughput returns, of this
// process's: the NATS server and the harness, and the roles too when they
// run in this process.
const ThisProcess = "this-process"

// throughput is Throughput that also returns the CPU time used during the
// job: by each role's process (for separate processes) and by this one
// (ThisProcess).
func throughput(ctx context.Context, dir string, n, slots int, exe string) (float64, map[string]time.Duration, error) {
	s, err := start(ctx, dir, config(slots), exe, configEnv(slots), process{roles: app.Roles})
	if err != nil {
		return 0, nil, err
	}
	defer s.stop()
	j, err := files(dir, "f", n, 1024, nil)
	if err != nil {
		return 0, nil, err
	}
	before, selfBefore := s.childCPU(), processCPU()
	begin := time.Now()
	ev, err := s.run(ctx, j)
	if err != nil {
		return 0, nil, err
	}
	if ev.Done != n {
		return 0, nil, fmt.Errorf("throughput: %d of %d files done", ev.Done, n)
	}
	cpu, self := s.childCPU(), processCPU()
	for role, t := range before {
		cpu[role] -= t
	}
	if cpu == nil {
		cpu = map[string]time.Duration{}
	}
	cpu[ThisProcess] = self - selfBefore
	// Up to the job's end event (reading its per-file statistics is the
	// observer's work).
	return float64(n) / s.ended.Sub(begin).Seconds(), cpu, nil
}

// processCPU is the user and system CPU time this process has used.
func processCPU() time.Duration { return rusage(syscall.RUSAGE_SELF) }

func rusage(who int) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Latency submits n DTRs one at a time to an idle Sluice (plain JSON on
// dtr.submit, as any publisher would) and returns each one's time from
// the publish to the start of its transfer, sorted.
func Latency(ctx context.Context, dir string, n int) ([]time.Duration, error) {
	s, err := start(ctx, dir, config(10), "", nil, process{roles: app.Roles})
	if err != nil {
		return nil, err
	}
	defer s.stop()
	finals := make(chan dtr.DTR, 16)
	sub, err := s.nc.Subscribe(api.SubjectDTRFinal, func(m *nats.Msg) {
		fs, _ := codec.DecodeFinals(context.Background(), m)
		for _, f := range fs {
			finals <- f.DTR
		}
	})
	if err != nil {
		return nil, fmt.Errorf("latency: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	j, err := files(dir, "l", n+5, 1024, nil)
	if err != nil {
		return nil, err
	}
	var out []time.Duration
	for i, f := range j.Inputs {
		id := uuid.New()
		body, _ := json.Marshal(map[string]any{"id": id, "source": f.Source, "destination": f.Destination,
			"owner": map[string]any{"dn": "/CN=bench"}, "direction": "download"})
		m := nats.NewMsg(api.SubjectSubmit)
		m.Data, m.Header = body, nats.Header{"Nats-Msg-Id": []string{id.String()}}
		sent := time.Now()
		if _, err := s.js.PublishMsg(ctx, m); err != nil {
			return nil, fmt.Errorf("latency: %w", err)
		}
		for {
			select {
			case d := <-finals:
				if d.ID != id {
					continue
				}
				if d.State != dtr.Done {
					return nil, fmt.Errorf("latency: DTR %s ended %s: %v", id, d.State, d.Error)
				}
				if i >= 5 { // the first ones warm the services up
					out = append(out, d.Started.Sub(sent))
				}
			case <-time.After(time.Minute):
				return nil, fmt.Errorf("latency: DTR %s not final after a minute", id)
			}
			break
		}
	}
	slices.Sort(out)
	return out, nil
}

// Percentile returns the p-th percentile (0–100) of sorted durations.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}

// Saturation is what a saturated run shows.
type Saturation struct {
	// Utilisation is the part of the transfer slots granted while DTRs
	// waited for one; Transferring the part of slot-time in which bytes
	// moved (from each transfer's start and end) while the slots were
	// saturated, TransferringAll over the whole run, with the slots
	// filling at its start and emptying at its end (slotTimeMoving).
	Utilisation, Transferring, TransferringAll float64
	// Split is each share's part of the running transfers over the same
	// seconds, and Configured the part its priority gives it.
	Split, Configured map[string]float64
	Seconds           int
	// ToDecision is, for each transfer, the time from its end (by its
	// worker's clock) to the scheduler's decision on its result, and
	// ToStart the time from the scheduler's decision to grant it to its
	// start: together, what a slot stands idle between two transfers.
	// Sorted; from the DTRs' history.
	ToDecision, ToStart []time.Duration
}

// Saturate runs two VOs' jobs (atlas=60, cms=40) of HTTP downloads that
// each take delay, with more work than 10 transfer slots, and measures the
// slots' use and the realised split.
func Saturate(ctx context.Context, dir string, perShare int, delay time.Duration) (Saturation, error) {
	var sat Saturation
	cfg := config(10)
	cfg.MaxProcessor = 50
	cfg.Processor.PreWorkers, cfg.Processor.PostWorkers = 50, 50
	cfg.SharePolicy, cfg.SharePriority = "voms:vo", "atlas=60,cms=40"
	s, err := start(ctx, dir, cfg, "", nil, process{roles: app.Roles})
	if err != nil {
		return sat, err
	}
	defer s.stop()
	base, stopSrc, err := slowSource(dir, delay)
	if err != nil {
		return sat, err
	}
	defer stopSrc()
	var mu sync.Mutex
	var spans [][2]time.Time
	transfers := map[uuid.UUID][2]time.Time{}
	sub, err := s.nc.Subscribe(api.SubjectDTRFinal, func(m *nats.Msg) {
		fs, _ := codec.DecodeFinals(context.Background(), m)
		mu.Lock()
		for _, f := range fs {
			spans = append(spans, [2]time.Time{f.DTR.Started, f.DTR.Ended})
			transfers[f.DTR.ID] = [2]time.Time{f.DTR.Started, f.DTR.Ended}
		}
		mu.Unlock()
	})
	if err != nil {
		return sat, fmt.Errorf("saturate: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	jobs := map[string]*job.Job{}
	for _, vo := range []string{"atlas", "cms"} {
		j, err := files(dir, vo, perShare, 4096, func(name string) string { return base + "/" + name })
		if err != nil {
			return sat, err
		}
		j.Owner = dtr.Identity{DN: "/CN=" + vo, FQANs: []string{"/" + vo}}
		jobs[vo] = j
	}
	errs := make(chan error, 2)
	for _, j := range jobs {
		go func() {
			ev, err := s.run(ctx, j)
			if err == nil && ev.Done != perShare {
				err = fmt.Errorf("saturate: job %s: %d of %d done", j.Name, ev.Done, perShare)
			}
			errs <- err
		}()
	}
	for range jobs {
		if err := <-errs; err != nil {
			return sat, err
		}
	}
	time.Sleep(1100 * time.Millisecond) // one more sample
	ov, err := s.overview()
	if err != nil {
		return sat, err
	}
	// The seconds in which every share had transfers waiting.
	var busy, limit float64
	running := map[string]float64{}
	for _, smp := range ov.History {
		waiting := len(smp.Queued) == 2
		for _, q := range smp.Queued {
			waiting = waiting && q > 0
		}
		if !waiting {
			continue
		}
		sat.Seconds++
		limit += float64(cfg.MaxDelivery)
		for share, r := range smp.Running {
			busy += float64(r)
			running[share] += float64(r)
		}
	}
	if sat.Seconds == 0 {
		return sat, fmt.Errorf("saturate: no second with both shares waiting")
	}
	sat.Utilisation = min(busy, limit) / limit
	sat.Split = map[string]float64{}
	for share, r := range running {
		sat.Split[share] = r / busy
	}
	sat.Configured = map[string]float64{"atlas-download": 0.6, "cms-download": 0.4}
	// Slot-time with bytes moving.
	mu.Lock()
	defer mu.Unlock()
	sat.Transferring, sat.TransferringAll = slotTimeMoving(spans, cfg.MaxDelivery)
	if sat.ToDecision, sat.ToStart, err = turnarounds(ctx, s.js, transfers); err != nil {
		return sat, fmt.Errorf("saturate: %w", err)
	}
	return sat, nil
}

// turnarounds reads every DTR's history and returns, for each transfer of
// transfers (by DTR), the time from its end to the decision on its result
// (the time of the event that left TRANSFERRING), and from its grant (the
// event that entered it) to its start, each sorted.
func turnarounds(ctx context.Context, js jetstream.JetStream, transfers map[uuid.UUID][2]time.Time) (toDecision, toStart []time.Duration, err error) {
	st, err := js.Stream(ctx, bus.StreamHistory)
	if err != nil {
		return nil, nil, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, nil, err
	}
	cons, err := js.OrderedConsumer(ctx, bus.StreamHistory, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, nil, err
	}
	events := map[uuid.UUID][]api.HistoryEvent{}
	for read := uint64(0); read < info.State.Msgs; read++ {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			return nil, nil, fmt.Errorf("history: %w", err)
		}
		id, err := uuid.Parse(strings.TrimPrefix(m.Subject(), bus.SubjectHistoryPrefix))
		if err != nil {
			continue
		}
		var rec struct {
			Events []api.HistoryEvent `json:"events"`
		}
		if err := json.Unmarshal(m.Data(), &rec); err != nil {
			return nil, nil, fmt.Errorf("history of %s: %w", id, err)
		}
		events[id] = append(events[id], rec.Events...)
	}
	for id, span := range transfers {
		// The last transfer's grant: the DTR's final DTR says when that
		// one began and ended (an earlier, failed one is not measured).
		evs := events[id]
		for i := len(evs) - 2; i >= 0; i-- {
			if evs[i].State == dtr.Transferring {
				toStart = append(toStart, span[0].Sub(evs[i].Time))
				toDecision = append(toDecision, evs[i+1].Time.Sub(span[1]))
				break
			}
		}
	}
	slices.Sort(toDecision)
	slices.Sort(toStart)
	return toDecision, toStart, nil
}

// ScaleOut moves perReplica·replicas HTTP downloads that each take delay
// with the given number of delivery replicas of workers transfers each, the
// other roles in one process, and returns files per second.
func ScaleOut(ctx context.Context, dir string, replicas, workers, perReplica int, delay time.Duration) (float64, error) {
	cfg := config(4 * workers)
	cfg.Delivery.Workers = workers
	procs := []process{{roles: []string{"scheduler", "generator", "processor"}}}
	for range replicas {
		procs = append(procs, process{roles: []string{"delivery"}})
	}
	s, err := start(ctx, dir, cfg, "", nil, procs...)
	if err != nil {
		return 0, err
	}
	defer s.stop()
	base, stopSrc, err := slowSource(dir, delay)
	if err != nil {
		return 0, err
	}
	defer stopSrc()
	n := perReplica * replicas
	j, err := files(dir, "s"+strconv.Itoa(replicas), n, 4096, func(name string) string { return base + "/" + name })
	if err != nil {
		return 0, err
	}
	begin := time.Now()
	ev, err := s.run(ctx, j)
	if err != nil {
		return 0, err
	}
	if ev.Done != n {
		return 0, fmt.Errorf("scale-out: %d of %d done", ev.Done, n)
	}
	return float64(n) / time.Since(begin).Seconds(), nil
}

// subdir makes a fresh directory for one measurement.
func subdir(dir, name string) (string, error) {
	d := filepath.Join(dir, name)
	if err := os.RemoveAll(d); err != nil {
		return "", err
	}
	return d, os.MkdirAll(d, 0o755)
}
