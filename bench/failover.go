package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/netcut"
	"github.com/sluice-dtr/sluice/pkg/worker"
	"github.com/sluice-dtr/sluice/services/scheduler"
)

// FailoverResult is what Failover measured.
type FailoverResult struct {
	// Warm is how long the standby took to be ready to take over: to
	// read the DTRs the leader's restart index names (it reads the rest
	// of the n stored meanwhile), or all n where there is no index; Gap
	// how long after the leader was lost the standby's first grant went
	// out.
	Warm, Gap time.Duration
	// Held is the number of DTRs the new leader held once it led, Final
	// those announced final (by either); none is lost if they add up to
	// at least the DTRs stored (a DTR whose final record the old leader
	// could not store before it was lost is both, until its result comes
	// back to the new one). Twice counts DTR states granted under two
	// grants.
	Held, Final, Twice int
}

// failoverWork is how long each grant of the failover measurement takes.
const failoverWork = 20 * time.Millisecond

// FailoverTTL is the leader key's TTL of the failover measurement (the
// default, SLUICE_LEADER_TTL).
const FailoverTTL = bus.DefaultLeaderTTL

// Failover stores n DTRs as queued for transfer, starts a leading
// scheduler and a standby, each on its own connection, with workers that
// answer every grant at once, and then loses the leader: its connection
// is cut, and it is stopped (as if SIGKILLed) or, with cutOff, left
// running without NATS (a network partition), to step down by itself.
// It returns how long the standby took to grant, and whether any DTR was
// lost or granted twice.
func Failover(ctx context.Context, dir string, n int, cutOff bool) (FailoverResult, error) {
	var r FailoverResult
	ns, err := bus.Embedded(dir, 0)
	if err != nil {
		return r, err
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return r, fmt.Errorf("failover: %w", err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := bus.Ensure(ctx, js, bus.Setup{}); err != nil {
		return r, err
	}
	if err := storeQueued(ctx, js, n); err != nil {
		return r, err
	}
	// Workers that answer every grant of every stage at once.
	wctx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, st := range dtr.Stages {
		p, err := worker.NewPool(nc, st, 20, func(ctx context.Context, _ api.Grant, _ func(int64, int64)) api.Result {
			select { // a transfer's time: the job lasts past the failover
			case <-time.After(failoverWork):
			case <-ctx.Done():
			}
			return api.Result{}
		}, quiet, nil)
		if err != nil {
			return r, err
		}
		go func() { _ = p.Run(wctx) }()
	}
	grants := &grantWatch{granted: map[string]string{}}
	sub, err := nc.Subscribe("sluice.grant.>", grants.take)
	if err != nil {
		return r, fmt.Errorf("failover: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	finals := &finalCount{}
	fsub, err := nc.Subscribe(api.SubjectDTRFinal, finals.take)
	if err != nil {
		return r, fmt.Errorf("failover: %w", err)
	}
	defer func() { _ = fsub.Unsubscribe() }()

	cfg := scheduler.Config{MaxDelivery: 10, MaxProcessor: 10, MaxEmergency: 1, MaxTransferTries: 10,
		RetryBase: time.Second, Lease: time.Hour, LeaderTTL: FailoverTTL, ChainPreClean: true}
	// The leader reaches NATS through a proxy that is cut to lose it.
	proxy, err := netcut.New(ns.Addr().String())
	if err != nil {
		return r, err
	}
	defer proxy.Close()
	ncA, err := nats.Connect("nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return r, fmt.Errorf("failover: %w", err)
	}
	defer ncA.Close()
	cfg.Name = "a"
	a, err := scheduler.New(cfg, ncA, quiet)
	if err != nil {
		return r, err
	}
	actx, stopA := context.WithCancel(ctx)
	defer stopA()
	go func() { _ = a.Run(actx) }()
	if err := until(ctx, 5*time.Minute, func() bool { return a.Role() == "leader" && grants.count() > 0 }); err != nil {
		return r, fmt.Errorf("failover: the first scheduler did not lead and grant: %w", err)
	}
	ncB, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1))
	if err != nil {
		return r, fmt.Errorf("failover: %w", err)
	}
	defer ncB.Close()
	cfg.Name = "b"
	b, err := scheduler.New(cfg, ncB, quiet)
	if err != nil {
		return r, err
	}
	bctx, stopB := context.WithCancel(ctx)
	defer stopB()
	start := time.Now()
	go func() { _ = b.Run(bctx) }()
	if err := until(ctx, 10*time.Minute, func() bool { return b.Role() == "standby" && b.Ready() }); err != nil {
		return r, fmt.Errorf("failover: the standby did not warm up: %w", err)
	}
	r.Warm = time.Since(start)
	time.Sleep(FailoverTTL) // the leader goes on granting meanwhile, the standby following

	lost, lostTerm := time.Now(), grants.lastTerm()
	proxy.Cut()
	if !cutOff {
		stopA() // its connection is gone: it can neither write nor resign
	}
	newGrants := func() int { n, _ := grants.after(lost, lostTerm); return n }
	if err := until(ctx, time.Minute, func() bool { return b.Role() == "leader" && newGrants() > 0 }); err != nil {
		return r, fmt.Errorf("failover: the standby did not take over (it is %q; %d grants of a later term since; %s): %w", b.Role(), newGrants(), failoverState(ctx, js, nc), err)
	}
	_, first := grants.after(lost, lostTerm)
	r.Gap = first.Sub(lost)
	// Let the new leader grant for a while, then stop the workers and let
	// the results sent settle, so that no DTR ends while it counts: one
	// that did would be counted twice (held, then final), which could
	// hide one lost.
	time.Sleep(2 * time.Second)
	stopWorkers()
	time.Sleep(time.Second)
	// Counted once the new leader has read every stored DTR: one that
	// took over on its restart index reads the rest as it leads.
	var shares api.SharesReply
	if err := until(ctx, 5*time.Minute, func() bool {
		shares = api.SharesReply{}
		return requestJSON(ctx, nc, api.SubjectShares, &shares) == nil && !shares.Reading
	}); err != nil {
		return r, fmt.Errorf("failover: the new leader did not read every stored DTR: %w", err)
	}
	for _, st := range shares.Shares {
		r.Held += st.Queued + st.Running
	}
	for _, k := range shares.Retrying {
		r.Held += k
	}
	// The last DTRs to end have left the core, but their Finals event
	// may still be gathered with others (for up to 10 ms) or on its way.
	time.Sleep(500 * time.Millisecond)
	r.Final = finals.count()
	r.Twice = grants.twice()
	return r, nil
}

// storeQueued puts n DTRs queued for transfer in the checkpoint bucket.
func storeQueued(ctx context.Context, js jetstream.JetStream, n int) error {
	out := bus.NewBatch(ctx, js)
	now := time.Now()
	for i := 0; i < n; i++ {
		d := queuedDTR(i, 1000, now)
		m := nats.NewMsg("$KV." + bus.BucketDTRs + "." + d.ID.String())
		m.Data, _ = json.Marshal(d)
		out.Add(m)
		if out.Len() == 5000 {
			if err := out.Wait(ctx); err != nil {
				return err
			}
		}
	}
	return out.Wait(ctx)
}

// until polls cond every 20 ms for at most limit.
func until(ctx context.Context, limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

func requestJSON(ctx context.Context, nc *nats.Conn, subject string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, subject, []byte("{}"))
	if err != nil {
		return err
	}
	if code := m.Header.Get("Nats-Service-Error-Code"); code != "" {
		return fmt.Errorf("%s %s", code, m.Header.Get("Nats-Service-Error"))
	}
	return json.Unmarshal(m.Data, v)
}

// grantWatch records the grants published: when, and each DTR state's
// grant ids.
type grantWatch struct {
	mu sync.Mutex
	// times are when each grant was heard, and terms the term of the
	// scheduler that gave it.
	times   []time.Time
	terms   []uint64
	granted map[string]string // DTR id and state → grant id
	dup     int
}

func (g *grantWatch) take(m *nats.Msg) {
	ev, err := codec.Decode(context.Background(), m)
	if err != nil {
		return
	}
	var gs api.Grants
	if json.Unmarshal(ev.Data(), &gs) != nil {
		return
	}
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, gr := range gs.Grants {
		g.times, g.terms = append(g.times, now), append(g.terms, gr.Term)
		key := gr.DTR.ID.String() + " " + gr.State.String()
		if id, ok := g.granted[key]; ok && id != gr.ID {
			g.dup++
		}
		g.granted[key] = gr.ID
	}
}

func (g *grantWatch) count() int { g.mu.Lock(); defer g.mu.Unlock(); return len(g.times) }
func (g *grantWatch) twice() int { g.mu.Lock(); defer g.mu.Unlock(); return g.dup }

// lastTerm is the latest term of a grant heard so far.
func (g *grantWatch) lastTerm() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Max(append([]uint64{0}, g.terms...))
}

// after returns how many grants of a later term than term were heard
// after t, and when the first was: a grant the lost leader gave before it
// was lost, heard after, is not the new leader's.
func (g *grantWatch) after(t time.Time, term uint64) (n int, first time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, at := range g.times {
		if at.After(t) && g.terms[i] > term {
			if n == 0 {
				first = at
			}
			n++
		}
	}
	return n, first
}

// finalCount counts the DTRs announced final (each once: a DTR whose
// final record the old leader could not store before it was lost is
// announced again by the new one).
type finalCount struct {
	mu  sync.Mutex
	ids map[uuid.UUID]bool
}

func (f *finalCount) take(m *nats.Msg) {
	fs, err := codec.DecodeFinals(context.Background(), m)
	if err != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ids == nil {
		f.ids = map[uuid.UUID]bool{}
	}
	for _, d := range fs {
		f.ids[d.DTR.ID] = true
	}
}

func (f *finalCount) count() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.ids) }

// failoverState says what a failover that did not happen left: the
// consumers of the scheduler's inputs and of the workers' grants, and what
// the leader says of its shares.
func failoverState(ctx context.Context, js jetstream.JetStream, nc *nats.Conn) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out []string
	for _, c := range []struct{ stream, name string }{{bus.StreamResults, bus.ConsumerSched}, {bus.StreamSubmit, bus.ConsumerSched},
		{bus.StreamGrants, string(dtr.StagePre)}, {bus.StreamGrants, string(dtr.StageDelivery)}, {bus.StreamGrants, string(dtr.StagePost)}} {
		cons, err := js.Consumer(ctx, c.stream, c.name)
		if err != nil {
			out = append(out, fmt.Sprintf("%s/%s: %v", c.stream, c.name, err))
			continue
		}
		i, err := cons.Info(ctx)
		if err != nil {
			out = append(out, fmt.Sprintf("%s/%s: %v", c.stream, c.name, err))
			continue
		}
		out = append(out, fmt.Sprintf("%s/%s: pending %d, unacknowledged %d, redelivered %d, pulls waiting %d",
			c.stream, c.name, i.NumPending, i.NumAckPending, i.NumRedelivered, i.NumWaiting))
	}
	// What every goroutine of this process (both schedulers run in it)
	// was doing, for whoever looks into it.
	if f, err := os.CreateTemp("", "sluice-failover-goroutines-*.txt"); err == nil {
		_ = pprof.Lookup("goroutine").WriteTo(f, 1)
		_ = f.Close()
		out = append(out, "goroutines in "+f.Name())
	}
	var shares api.SharesReply
	if err := requestJSON(ctx, nc, api.SubjectShares, &shares); err != nil {
		out = append(out, "shares: "+err.Error())
	} else {
		running, queued := 0, 0
		for _, st := range shares.Shares {
			running += st.Running
			queued += st.Queued
		}
		out = append(out, fmt.Sprintf("the leader's shares: %d running, %d queued, reading %v", running, queued, shares.Reading))
	}
	return strings.Join(out, "; ")
}
