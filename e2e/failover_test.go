package e2e

// Failover: two schedulers, a and b, as processes of the real binary on
// one NATS server; a leads, b stands by. The leader fails in the middle of
// a job, in each of the ways a machine fails: killed, frozen past its
// term and then resumed, or cut off from NATS and then back. The standby
// must take over, and the job must finish with every file byte-exact,
// fetched once, final once, and every slot free; a leader that comes back
// must stand by.

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
	"github.com/sluice-dtr/sluice/pkg/netcut"
)

// failoverTTL is the leader key's TTL in these tests.
const failoverTTL = 1500 * time.Millisecond

func TestAStandbyTakesOverFromALeaderThatFails(t *testing.T) {
	for _, tt := range []struct {
		name string
		// fail makes the leader a fail; heal, if set, undoes it once the
		// job has finished.
		fail func(g *gauntlet, p *netcut.Proxy)
		heal func(g *gauntlet, p *netcut.Proxy)
	}{
		{name: "killed", fail: func(g *gauntlet, _ *netcut.Proxy) { g.kill("scheduler-a") }},
		{name: "frozen past its term, then resumed",
			fail: func(g *gauntlet, _ *netcut.Proxy) { g.signal("scheduler-a", syscall.SIGSTOP) },
			heal: func(g *gauntlet, _ *netcut.Proxy) { g.signal("scheduler-a", syscall.SIGCONT) }},
		{name: "cut off from NATS, then back",
			fail: func(_ *gauntlet, p *netcut.Proxy) { p.Cut() },
			heal: func(_ *gauntlet, p *netcut.Proxy) { p.Heal() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// A lease longer than the consumers' 30 s AckWait: inputs
			// that a failed leader took and never acknowledged come
			// back within it.
			g := newGauntlet(t, "SLUICE_LEADER_TTL="+failoverTTL.String(), "SLUICE_LEASE=40s")
			proxy, err := netcut.New(g.ns.Load().Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(proxy.Close)
			srcDir, dstDir := t.TempDir(), t.TempDir()
			src, gets := slowSource(t, srcDir, 256<<10)
			j := &job.Job{Name: "failover"}
			want := map[string][]byte{}
			for i := range 40 {
				name := "f" + strconv.Itoa(i)
				writeFile(t, filepath.Join(srcDir, name), 160<<10, i)
				want[name], _ = os.ReadFile(filepath.Join(srcDir, name))
				j.Inputs = append(j.Inputs, job.File{Source: src + "/" + name, Destination: fileURL(filepath.Join(dstDir, name))})
			}
			g.startAs("scheduler-a", "scheduler", "SLUICE_SCHEDULER_NAME=a", "NATS_URL=nats://"+proxy.Addr())
			waitFor(t, 30*time.Second, "a to lead", func() bool { return leaderOf(t, g.sys.nc).Name == "a" })
			first := leaderOf(t, g.sys.nc)
			g.startAs("scheduler-b", "scheduler", "SLUICE_SCHEDULER_NAME=b")
			for _, r := range []string{"generator", "processor", "delivery"} {
				g.start(r)
			}
			grants := watchGrants(t, g.sys.nc)
			r := g.sys.submit(j)
			waitFor(t, 30*time.Second, "ten transfers to run", func() bool {
				n := 0
				for i := range 40 {
					n += min(gets("/f"+strconv.Itoa(i)), 1)
				}
				return n >= 10
			})
			failed := time.Now()
			tt.fail(g, proxy)
			waitFor(t, 30*time.Second, "b to lead", func() bool {
				l := leaderOf(t, g.sys.nc)
				return l.Name == "b" && l.Term > first.Term
			})
			// The failed leader comes back while the job runs: whatever it
			// publishes or takes then must change nothing.
			if tt.heal != nil {
				time.Sleep(time.Second)
				tt.heal(g, proxy)
			}
			ev := g.sys.wait(r.JobID, 3*time.Minute)
			// The new leader answers for the job's DTRs. (Right after a
			// frozen leader resumes, a request may still reach its
			// endpoints for the moment it takes to find its term gone:
			// asked once the job is over.)
			var why api.DTRReply
			if err := g.sys.request(api.SubjectDTR, []byte(r.DTRs[0].String()), nil, &why); err != nil || why.DTR.ID != r.DTRs[0] {
				t.Errorf("sluice why after the failover: %+v, %v", why, err)
			}
			// Each DTR's history runs on across the two leaders: from its
			// submission, in order, to DONE. (An event the new leader
			// records again, or that a frozen leader stored after the new
			// one looked, may share its number with another.)
			for _, id := range r.DTRs {
				var h api.HistoryReply
				for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
					err := g.sys.request(api.SubjectHistory, []byte(id.String()), nil, &h)
					if n := len(h.Events); err == nil && n > 0 && h.Events[n-1].State == dtr.Done {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("history of %s after the failover: %v\n%s", id, err, timeline(h))
					}
				}
				// The new leader numbers on from the old one's last event:
				// only the submission is numbered 1 (a numbering that
				// started again would give a second event number 1).
				ones := 0
				for _, ev := range h.Events {
					if ev.Seq == 1 {
						ones++
					}
				}
				if ones != 1 || h.Events[0].Seq != 1 || h.Events[0].State != dtr.New {
					t.Errorf("history of %s does not begin with its submission in NEW, the only event numbered 1:\n%s", id, timeline(h))
				}
			}
			took, gap := grants.gapAfter(failed)
			t.Logf("b leads; its first grant came %s after the failure; the longest gap without grants was %s", took, gap)
			if tt.heal != nil {
				waitFor(t, 30*time.Second, "a to stand by again", func() bool {
					return g.logGrep("scheduler-a", "starting over as a standby", 1) != ""
				})
			}
			if ev.State != "finished" || ev.Done != len(want) {
				t.Errorf("job %s with %d of %d DONE", ev.State, ev.Done, len(want))
			}
			for name, data := range want {
				got, err := os.ReadFile(filepath.Join(dstDir, name))
				if err != nil || !bytes.Equal(got, data) {
					t.Errorf("destination %s: %d bytes, %v; want the source's %d", name, len(got), err, len(data))
				}
				if n := gets("/" + name); n != 1 {
					t.Errorf("source %s fetched %d times, want once", name, n)
				}
			}
			if l := leaderOf(t, g.sys.nc); l.Name != "b" {
				t.Errorf("after the leader came back, %q leads, want b still", l.Name)
			}
			if tt.heal != nil && g.logGrep("scheduler-a", "leading", 2) == "" {
				t.Error("a never said it led")
			}
			g.settled()
		})
	}
}

// leaderOf reads who leads from the leader key.
func leaderOf(t *testing.T, nc *nats.Conn) api.Leader {
	t.Helper()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, bus.BucketLeader)
	if err != nil {
		return api.Leader{}
	}
	e, err := kv.Get(ctx, "scheduler")
	if err != nil {
		return api.Leader{}
	}
	var l api.Leader
	_ = json.Unmarshal(e.Value(), &l)
	return l
}

// grantLog records when grants were published.
type grantLog struct {
	mu    sync.Mutex
	times []time.Time
}

func watchGrants(t *testing.T, nc *nats.Conn) *grantLog {
	t.Helper()
	l := &grantLog{}
	sub, err := nc.Subscribe("sluice.grant.>", func(*nats.Msg) {
		l.mu.Lock()
		l.times = append(l.times, time.Now())
		l.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return l
}

// gapAfter returns how long after from the next grant came, and the
// longest time without a grant from the last one before from on.
func (l *grantLog) gapAfter(from time.Time) (next, longest time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var prev time.Time
	for _, at := range l.times {
		if at.Before(from) {
			prev = at
			continue
		}
		if next == 0 {
			next = at.Sub(from)
		}
		if !prev.IsZero() {
			longest = max(longest, at.Sub(prev))
		}
		prev = at
	}
	return next, longest
}

// longestGap returns the longest time without a grant between from and
// to, and when it began.
func (l *grantLog) longestGap(from, to time.Time) (longest time.Duration, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	prev := from
	for _, t := range append(l.times, to) {
		if t.Before(from) || t.After(to) {
			continue
		}
		if d := t.Sub(prev); d > longest {
			longest, at = d, prev
		}
		prev = t
	}
	return longest, at
}
