package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
)

// LoadResult is what a load of DTRs on dtr.submit showed.
type LoadResult struct {
	// Published is the number of DTRs published, Bad the malformed ones
	// among them, CLI the ones published with the NATS CLI.
	Published, Bad, CLI int
	// PublishRate is the DTRs per second JetStream acknowledged to the
	// publisher (its backpressure: at most a window of unacknowledged
	// publishes); IntakeRate the DTRs per second the scheduler took in,
	// from the first publish until it held them all.
	PublishRate, IntakeRate float64
	// Held is the number of DTRs the scheduler holds at the end, Rejected
	// the rejection events.
	Held, Rejected int
	// PeakRSS is the scheduler process's largest resident memory (0 when
	// it ran in this process).
	PeakRSS int64
}

// Load publishes n DTRs to dtr.submit as any publisher would (plain JSON
// with a Nats-Msg-Id, asynchronously with a window of unacknowledged
// publishes), bad of them malformed, and, if cli names the NATS CLI,
// cliCount more with `nats pub`. Only the scheduler runs (from exe, if
// set, so that its memory can be read), so the DTRs stay queued.
func Load(ctx context.Context, dir string, n, bad int, exe, cli string, cliCount int) (LoadResult, error) {
	res := LoadResult{Bad: bad}
	env := []string{"SLUICE_MAXPROCESSOR=10"}
	s, err := start(ctx, dir, config(10), exe, env, process{roles: []string{"scheduler"}})
	if err != nil {
		return res, err
	}
	defer s.stop()
	var rejected atomic.Int64
	sub, err := s.nc.Subscribe(api.SubjectRejected, func(*nats.Msg) { rejected.Add(1) })
	if err != nil {
		return res, fmt.Errorf("load: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// The scheduler has set up the streams once it answers.
	var sh api.SharesReply
	if err := s.request(ctx, api.SubjectShares, nil, &sh); err != nil {
		return res, err
	}
	pid := 0
	if exe != "" && len(s.pids) > 0 {
		pid = s.pids[0]
	}
	var peak atomic.Int64
	stopRSS := make(chan struct{})
	defer close(stopRSS)
	if pid != 0 {
		go func() {
			for {
				if kb := rssKB(pid); kb*1024 > peak.Load() {
					peak.Store(kb * 1024)
				}
				select {
				case <-stopRSS:
					return
				case <-time.After(200 * time.Millisecond):
				}
			}
		}()
	}

	begin := time.Now()
	out := bus.NewBatch(ctx, s.js)
	for i := 0; i < n; i++ {
		id := uuid.New()
		m := nats.NewMsg(api.SubjectSubmit)
		m.Header = nats.Header{"Nats-Msg-Id": []string{id.String()}}
		if bad > 0 && i%(n/bad) == 0 && i/(n/bad) < bad {
			m.Data = []byte(`{"id":"` + id.String() + `","source":"gopher://nowhere","destination":"relative/path"}`)
		} else {
			m.Data, _ = json.Marshal(map[string]any{"id": id, "source": "https://data.example.org/load/" + strconv.Itoa(i),
				"destination": "file:///scratch/load/" + strconv.Itoa(i), "owner": map[string]any{"fqans": []string{[]string{"/atlas", "/cms", "/lhcb"}[i%3]}},
				"direction": "download", "user_priority": 1 + i%100})
		}
		out.Add(m)
		if out.Len() == 10_000 {
			if err := out.Wait(ctx); err != nil {
				return res, fmt.Errorf("load: %w", err)
			}
		}
	}
	if err := out.Wait(ctx); err != nil {
		return res, fmt.Errorf("load: %w", err)
	}
	res.Published = n
	res.PublishRate = float64(n) / time.Since(begin).Seconds()
	if cli != "" && cliCount > 0 {
		body := `{"id":"6c1d8ea0-0000-4000-8000-{{ printf "%012d" Count }}","source":"https://data.example.org/cli/{{ Count }}",` +
			`"destination":"file:///scratch/cli/{{ Count }}","owner":{"fqans":["/cms"]},"direction":"download"}`
		cmd := exec.CommandContext(ctx, cli, "--server", s.ns.ClientURL(), "pub", api.SubjectSubmit, body, "--count", strconv.Itoa(cliCount))
		if b, err := cmd.CombinedOutput(); err != nil {
			return res, fmt.Errorf("load: nats pub: %w: %s", err, b)
		}
		res.CLI = cliCount
		res.Published += cliCount
	}

	// The scheduler has taken everything in when its consumer of
	// SLUICE_SUBMIT has nothing pending and nothing unacknowledged.
	cons, err := s.js.Consumer(ctx, bus.StreamSubmit, bus.ConsumerSched)
	if err != nil {
		return res, fmt.Errorf("load: %w", err)
	}
	for {
		info, err := cons.Info(ctx)
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("load: the scheduler did not take everything in: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	res.IntakeRate = float64(res.Published) / time.Since(begin).Seconds()
	if err := s.request(ctx, api.SubjectShares, nil, &sh); err != nil {
		return res, err
	}
	for _, st := range sh.Shares {
		res.Held += st.Queued + st.Running
	}
	for _, n := range sh.Retrying {
		res.Held += n
	}
	time.Sleep(200 * time.Millisecond) // the last rejection events
	res.Rejected = int(rejected.Load())
	res.PeakRSS = peak.Load()
	return res, nil
}

// rssKB reads a process's resident memory in KiB.
func rssKB(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb
		}
	}
	return 0
}
