package e2e

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
	"github.com/sluice-dtr/sluice/pkg/stack"
	"github.com/sluice-dtr/sluice/services/generator"
	"github.com/sluice-dtr/sluice/services/scheduler"
)

// process is one Sluice role running as its own process.
type process struct {
	role string
	cmd  *exec.Cmd
	log  *os.File
}

// cluster runs each role as a separate process of the real binary against
// a NATS server that outlives them.
type cluster struct {
	t     *testing.T
	bin   string
	env   []string
	dir   string
	mu    sync.Mutex
	procs map[string]*process
}

func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sluice")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/sluice-dtr/sluice/cmd/sluice")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func (c *cluster) start(role string) {
	c.t.Helper()
	f, err := os.OpenFile(filepath.Join(c.dir, role+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(c.bin, role)
	cmd.Env = append(os.Environ(), c.env...)
	cmd.Stdout, cmd.Stderr = f, f
	// Die with the test, even if it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.procs[role] = &process{role: role, cmd: cmd, log: f}
	c.mu.Unlock()
}

// kill sends SIGKILL to a role and waits for it to die.
func (c *cluster) kill(role string) {
	c.mu.Lock()
	p := c.procs[role]
	delete(c.procs, role)
	c.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
	p.log.Close()
}

func (c *cluster) stopAll() {
	c.mu.Lock()
	roles := make([]string, 0, len(c.procs))
	for r := range c.procs {
		roles = append(roles, r)
	}
	c.mu.Unlock()
	for _, r := range roles {
		c.kill(r)
	}
}

// TestKilledProcessesLoseNothing runs 5,000 DTRs through separate scheduler,
// generator, processor and delivery processes while a driver SIGKILLs them
// at random moments and restarts them, and checks that every DTR ends DONE
// once, with its bytes intact, that no slot stays held, and that no
// finished destination is written twice.
func TestKilledProcessesLoseNothing(t *testing.T) {
	const files = 5000
	bin := buildBinary(t)
	dir := t.TempDir()
	ns, err := bus.Embedded(filepath.Join(dir, "jetstream"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	c := &cluster{t: t, bin: bin, dir: dir, procs: map[string]*process{}, env: []string{
		"NATS_URL=" + ns.ClientURL(), "SLUICE_LOG_LEVEL=warn", "SLUICE_LOG_FORMAT=text", "SLUICE_HTTP_ADDR=127.0.0.1:0",
		"SLUICE_LEASE=4s", "SLUICE_RETRY_BASE=100ms", "SLUICE_MAXTRANSFERTRIES=20",
		"SLUICE_MAXDELIVERY=20", "SLUICE_MAXPROCESSOR=20", "SLUICE_GENERATOR_MAX_FILES=10000",
		"SLUICE_DELIVERY_WORKERS=21", "SLUICE_PROCESSOR_PRE_WORKERS=42", "SLUICE_PROCESSOR_POST_WORKERS=21",
	}}
	defer c.stopAll()
	for _, r := range []string{"scheduler", "generator", "processor", "delivery"} {
		c.start(r)
	}
	s := &system{t: t, ns: ns, dir: dir}
	s.nc, err = stack.Connect(ns.ClientURL(), "chaos-test")
	if err != nil {
		t.Fatal(err)
	}
	defer s.nc.Close()
	s.js, _ = jetstream.New(s.nc)

	src, out := filepath.Join(dir, "src"), filepath.Join(dir, "out")
	j := &job.Job{ID: "chaos"}
	for i := 0; i < files; i++ {
		p := filepath.Join(src, strconv.Itoa(i))
		writeFile(t, p, 1024+i%977, i)
		j.Inputs = append(j.Inputs, job.File{Source: fileURL(p), Destination: fileURL(filepath.Join(out, strconv.Itoa(i)))})
	}
	r := s.submit(j)

	// Watch the destinations: a finished file must never be replaced.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	replaced := make(chan string, 10)
	var watch sync.WaitGroup
	watch.Add(1)
	go func() {
		defer watch.Done()
		seen := map[string]uint64{}
		for ctx.Err() == nil {
			entries, _ := os.ReadDir(out)
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), ".") {
					continue // a temporary name: a transfer taken over writes it again
				}
				info, err := e.Info()
				if err != nil {
					continue
				}
				ino := info.Sys().(*syscall.Stat_t).Ino
				if old, ok := seen[e.Name()]; ok && old != ino {
					select {
					case replaced <- e.Name():
					default:
					}
				}
				seen[e.Name()] = ino
			}
			time.Sleep(300 * time.Millisecond)
		}
	}()

	// The chaos driver: kill a random role every 0.3–1.5 s, restart it,
	// for at most chaosFor; then let the system settle and finish. (A
	// system killed without end on a slow, shared machine may not get
	// anywhere, which says nothing about what it loses.)
	const chaosFor, settle = 90 * time.Second, 5 * time.Minute
	rng := rand.New(rand.NewPCG(1, 2))
	kills := map[string]int{}
	done := make(chan generator.JobEvent, 1)
	go func() {
		// Services die under it, so errors here are expected and retried.
		deadline := time.Now().Add(chaosFor + settle)
		var ev generator.JobEvent
		for time.Now().Before(deadline) {
			if err := s.request(bus.SubjectAPIJobStatus, []byte(r.JobID), nil, &ev); err == nil && ev.Announced {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		done <- ev
	}()
	var ev generator.JobEvent
	chaosEnd := time.Now().Add(chaosFor)
chaos:
	for time.Now().Before(chaosEnd) {
		select {
		case ev = <-done:
			break chaos
		case <-time.After(time.Duration(300+rng.IntN(1200)) * time.Millisecond):
		}
		role := []string{"scheduler", "scheduler", "processor", "delivery", "generator"}[rng.IntN(5)]
		c.kill(role)
		kills[role]++
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		c.start(role)
	}
	if time.Now().After(chaosEnd) {
		ev = <-done // no more kills: wait for the job to end
	}
	stop()
	watch.Wait()
	t.Logf("kills: %v", kills)
	if kills["scheduler"] < 3 || kills["delivery"] < 1 || kills["processor"] < 1 {
		t.Logf("the run ended before the driver killed every role a few times: %v", kills)
	}

	if ev.State != generator.JobFinished || ev.Done != files || len(ev.Files) != files {
		// Say where the unfinished DTRs are, as the scheduler sees them.
		for i, ref := range ev.Pending {
			if i == 5 {
				break
			}
			var reply scheduler.DTRReply
			err := s.request(bus.SubjectAPIDTR, []byte(ref.DTR.String()), nil, &reply)
			why := ""
			if reply.Why != nil {
				why = reply.Why.Reason
			}
			t.Logf("pending %s: scheduler says %v state %s grant %q attempts %d error %+v: %s",
				ref.DTR, err, reply.DTR.State, reply.DTR.Grant, reply.DTR.Attempts, reply.DTR.Error, why)
		}
		t.Fatalf("job %s: %d done, %d failed, %d cancelled of %d, %d pending: %v", ev.State, ev.Done, ev.Failed, ev.Cancelled, files, len(ev.Pending), ev.Failures)
	}
	for _, f := range ev.Files {
		if f.State != dtr.Done {
			t.Fatalf("%s ended %s", f.Destination, f.State)
		}
		i := filepath.Base(f.Destination)
		want, _ := os.ReadFile(filepath.Join(src, i))
		got, err := os.ReadFile(filepath.Join(out, i))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s is not intact: %v", f.Destination, err)
		}
	}
	select {
	case name := <-replaced:
		t.Fatalf("finished destination %s was written twice", name)
	default:
	}
	// Every DTR was announced final in one state only.
	finals := map[string]dtr.State{}
	cons, err := s.js.OrderedConsumer(context.Background(), bus.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{bus.SubjectDTRFinal}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(time.Second))
		if err != nil {
			break
		}
		var d dtr.DTR
		if _, err := bus.DecodeData(context.Background(), bus.Msg(m), bus.TypeDTRFinal, &d); err != nil {
			t.Fatal(err)
		}
		if old, ok := finals[d.ID.String()]; ok && old != d.State {
			t.Fatalf("DTR %s announced %s and %s", d.ID, old, d.State)
		}
		finals[d.ID.String()] = d.State
	}
	if len(finals) != files {
		t.Fatalf("%d DTRs announced final, want %d", len(finals), files)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(out, ".*.part")); len(leftovers) > 0 {
		t.Fatalf("%d temporary files left, e.g. %s", len(leftovers), leftovers[0])
	}
	// No slot stays held once everything is final.
	deadline := time.Now().Add(20 * time.Second)
	for {
		sh := s.shares()
		if len(sh.Shares) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slots still held: %+v", sh.Shares)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
