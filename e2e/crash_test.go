package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// process is one Sluice role running as its own process.
type process struct {
	role   string
	cmd    *exec.Cmd
	log    *os.File
	killed atomic.Bool   // set before the test kills it
	exited chan struct{} // closed once it has exited, whoever ended it
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
	// exits are the roles that exited without being killed, with how.
	exits []string
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

func (c *cluster) start(role string) { c.t.Helper(); c.startAs(role, role) }

// startAs runs a role as a process known by name (its log is
// <name>.log), with extra environment variables: several processes of
// one role.
func (c *cluster) startAs(name, role string, env ...string) {
	c.t.Helper()
	f, err := os.OpenFile(filepath.Join(c.dir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(c.bin, role)
	cmd.Env = append(append(os.Environ(), c.env...), env...)
	cmd.Stdout, cmd.Stderr = f, f
	// Die with the test, even if it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	p := &process{role: name, cmd: cmd, log: f, exited: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		if !p.killed.Load() {
			// A role must outlive anything but SIGKILL, NATS going away
			// included.
			c.mu.Lock()
			c.exits = append(c.exits, fmt.Sprintf("%s (pid %d): %v", name, cmd.Process.Pid, err))
			c.mu.Unlock()
		}
		close(p.exited)
	}()
	c.mu.Lock()
	c.procs[name] = p
	c.mu.Unlock()
}

// signal sends sig (SIGSTOP, SIGCONT) to the process known by name.
func (c *cluster) signal(name string, sig syscall.Signal) {
	c.t.Helper()
	c.mu.Lock()
	p := c.procs[name]
	c.mu.Unlock()
	if p == nil {
		c.t.Fatalf("no process %s", name)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("%s to %s: %v", sig, name, err)
	}
}

// kill sends SIGKILL to a role and waits for it to die.
func (c *cluster) kill(role string) {
	c.mu.Lock()
	p := c.procs[role]
	delete(c.procs, role)
	c.mu.Unlock()
	p.killed.Store(true)
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
	p.log.Close()
}

// restartExited starts again every role that exited by itself, as a
// supervisor would, and returns them.
func (c *cluster) restartExited() (roles []string) {
	c.mu.Lock()
	for r, p := range c.procs {
		select {
		case <-p.exited:
			roles = append(roles, r)
		default:
		}
	}
	c.mu.Unlock()
	for _, r := range roles {
		c.kill(r)
		c.start(r)
	}
	return roles
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

// logTail returns the last n lines of a role's log.
func (c *cluster) logTail(role string, n int) string {
	f, err := os.Open(filepath.Join(c.dir, role+".log"))
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// logGrep returns the first n lines of a role's log that contain s.
func (c *cluster) logGrep(role, s string, n int) string {
	b, err := os.ReadFile(filepath.Join(c.dir, role+".log"))
	if err != nil {
		return err.Error()
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) && len(lines) < n {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// chaosFiles is the number of files of the chaos test's job:
// SLUICE_CHAOS_FILES, 5,000 unless set (the full run is 10,000).
func chaosFiles(t *testing.T) int {
	v := os.Getenv("SLUICE_CHAOS_FILES")
	if v == "" {
		return 5000
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 10000 {
		t.Fatalf("SLUICE_CHAOS_FILES=%q: want a number of files from 1 to 10000 (the generator's limit here)", v)
	}
	return n
}

// TestKilledProcessesLoseNothing runs a job of SLUICE_CHAOS_FILES DTRs
// (5,000 unless set; 10,000 for the full run) through separate scheduler,
// generator, processor and delivery processes while a driver SIGKILLs
// them at random moments (at least 20 times) and restarts them, and
// restarts the NATS server once in the middle. It checks that every DTR
// ends DONE, announced final once, with its bytes intact and its expected
// checksum verified, that no finished destination is written twice, that
// no role exits by itself, and that no slot stays held.
func TestKilledProcessesLoseNothing(t *testing.T) {
	files := chaosFiles(t)
	testStart := time.Now()
	bin := buildBinary(t)
	t.Logf("sluice built in %.1fs", time.Since(testStart).Seconds())
	dir := t.TempDir()
	store := filepath.Join(dir, "jetstream")
	first, err := bus.Embedded(store, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The server in use: the restart replaces it, and the deferred
	// shutdown stops whichever runs then.
	var ns atomic.Pointer[server.Server]
	ns.Store(first)
	defer func() { ns.Load().Shutdown() }()
	port := first.Addr().(*net.TCPAddr).Port
	c := &cluster{t: t, bin: bin, dir: dir, procs: map[string]*process{}, env: []string{
		"NATS_URL=" + first.ClientURL(), "SLUICE_LOG_LEVEL=warn", "SLUICE_LOG_FORMAT=text", "SLUICE_HTTP_ADDR=127.0.0.1:0",
		"SLUICE_ALLOW_NETWORKS=127.0.0.0/8", // the test's storage servers are on loopback
		"SLUICE_LEASE=4s", "SLUICE_RETRY_BASE=100ms", "SLUICE_MAXTRANSFERTRIES=20",
		"SLUICE_MAXDELIVERY=20", "SLUICE_MAXPROCESSOR=20", "SLUICE_GENERATOR_MAX_FILES=10000",
		"SLUICE_DELIVERY_WORKERS=21", "SLUICE_PROCESSOR_PRE_WORKERS=42", "SLUICE_PROCESSOR_POST_WORKERS=21",
	}}
	defer c.stopAll()
	for _, r := range []string{"scheduler", "generator", "processor", "delivery"} {
		c.start(r)
	}
	s := &system{t: t, ns: first, dir: dir}
	s.nc, err = app.Connect(first.ClientURL(), "chaos-test")
	if err != nil {
		t.Fatal(err)
	}
	defer s.nc.Close()
	s.js, _ = jetstream.New(s.nc)

	// Every file has an expected adler32 checksum, which Sluice verifies.
	src, out := filepath.Join(dir, "src"), filepath.Join(dir, "out")
	j := &job.Job{ID: "chaos"}
	sums := make([]string, files)
	for i := 0; i < files; i++ {
		p := filepath.Join(src, strconv.Itoa(i))
		writeFile(t, p, 1024+i%977, i)
		if sums[i], err = checksum.File(p, "adler32"); err != nil {
			t.Fatal(err)
		}
		j.Inputs = append(j.Inputs, job.File{Source: fileURL(p), Destination: fileURL(filepath.Join(out, strconv.Itoa(i))),
			Checksum: sums[i]})
	}
	desc, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d files written at %.1fs; the job description is %d bytes (max_payload %d)",
		files, time.Since(testStart).Seconds(), len(desc), s.nc.MaxPayload())
	began := time.Now()
	r := s.submit(j)
	if len(r.DTRs) != files {
		t.Fatalf("the job made %d DTRs, want %d", len(r.DTRs), files)
	}

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
	// for at most chaosFor, and restart NATS once half way through (or
	// once half the DTRs are final, if that comes first); then let the
	// system settle and finish. (A system killed without end on a slow,
	// shared machine may not get anywhere, which says nothing about what
	// it loses.)
	const chaosFor, settle, natsDown = 90 * time.Second, 8 * time.Minute, 2 * time.Second
	rng := rand.New(rand.NewPCG(1, 2))
	kills := map[string]int{}
	var final atomic.Int64 // DTRs final so far, as the job record counts them
	done := make(chan api.JobEvent, 1)
	go func() {
		// The job record is read straight from its bucket: asking the
		// generator for the whole status of a job of 10,000 files five
		// times a second would load the system under test. Services and
		// NATS die under it, so errors here are expected and retried.
		deadline := time.Now().Add(chaosFor + settle)
		if d, ok := t.Deadline(); ok && d.Add(-time.Minute).Before(deadline) {
			deadline = d.Add(-time.Minute) // time to say what is missing
		}
		var ev api.JobEvent
		for time.Now().Before(deadline) && ctx.Err() == nil {
			var rec api.JobRecord
			if kv, err := s.js.KeyValue(ctx, bus.BucketJobs); err == nil {
				if _, err := kvJSON(ctx, kv, r.JobID, &rec); err == nil {
					final.Store(int64(rec.Final()))
					if rec.Announced {
						break
					}
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		// The whole status, once (the last try's if the job never ended).
		for try := 0; try < 30; try++ {
			if err := s.request(api.SubjectJobStatus, []byte(r.JobID), nil, &ev); err == nil {
				break
			}
			time.Sleep(time.Second)
		}
		done <- ev
	}()
	var ev api.JobEvent
	var restartedAt, restartedFor time.Duration
	restartedAtFinal := int64(-1)
	restart := func() {
		old := ns.Load()
		at := time.Since(began)
		// The scheduler dies with NATS and starts again while NATS is
		// down: it must wait for it, as the other roles must reconnect.
		c.kill("scheduler")
		kills["scheduler"]++
		old.Shutdown()
		old.WaitForShutdown()
		c.start("scheduler")
		time.Sleep(natsDown) // long enough for every client to notice
		next, err := bus.Embedded(store, port)
		for try := 0; err != nil && try < 20; try++ {
			time.Sleep(250 * time.Millisecond) // the port may linger a moment
			next, err = bus.Embedded(store, port)
		}
		if err != nil {
			t.Fatalf("restart NATS on port %d: %v", port, err)
		}
		ns.Store(next)
		s.ns = next
		restartedAt, restartedFor, restartedAtFinal = at, time.Since(began)-at, final.Load()
		t.Logf("NATS restarted at %.1fs (down %.1fs; the scheduler killed before and started while it was down), with %d of %d DTRs final",
			restartedAt.Seconds(), restartedFor.Seconds(), restartedAtFinal, files)
	}
	chaosStart := time.Now()
	chaosEnd := chaosStart.Add(chaosFor)
	ended := false
chaos:
	for time.Now().Before(chaosEnd) {
		select {
		case ev = <-done:
			ended = true
			break chaos
		case <-time.After(time.Duration(300+rng.IntN(1200)) * time.Millisecond):
		}
		if restartedAtFinal < 0 && (time.Since(chaosStart) >= chaosFor/2 || final.Load() >= int64(files)/2) {
			restart()
		}
		for _, r := range c.restartExited() {
			t.Logf("%s exited by itself; started again", r)
		}
		role := []string{"scheduler", "scheduler", "processor", "delivery", "generator"}[rng.IntN(5)]
		c.kill(role)
		kills[role]++
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		c.start(role)
	}
	if !ended {
		// No more kills: wait for the job to end, keeping the roles up.
		tick := time.NewTicker(time.Second)
	wait:
		for {
			select {
			case ev = <-done:
				break wait
			case <-tick.C:
				for _, r := range c.restartExited() {
					t.Logf("%s exited by itself; started again", r)
				}
			}
		}
		tick.Stop()
	}
	took := time.Since(began)
	if ev.Announced {
		t.Logf("the job ended after %.1fs", took.Seconds())
	} else {
		t.Logf("the job had not ended after %.1fs", took.Seconds())
	}
	stop()
	watch.Wait()
	total := 0
	for _, n := range kills {
		total += n
	}
	t.Logf("kills: %d %v", total, kills)
	c.mu.Lock()
	exits := append([]string(nil), c.exits...)
	c.mu.Unlock()
	if len(exits) > 0 {
		for _, r := range []string{"scheduler", "generator", "processor", "delivery"} {
			t.Logf("last lines of the %s log:\n%s", r, c.logTail(r, 15))
		}
		t.Errorf("roles exited without being killed: %v", exits)
	}
	if ended {
		t.Logf("the job ended after %d kills, before the driver stopped", total)
	} else if total < 20 {
		t.Errorf("the driver killed %d times in %s, want at least 20", total, chaosFor)
	}
	if restartedAtFinal < 0 {
		t.Errorf("NATS was not restarted: the job ended after %.1fs", took.Seconds())
	}

	if ev.State != api.JobFinished || ev.Done != files || len(ev.Files) != files {
		// Say where the unfinished DTRs are, as the scheduler sees them.
		for i, ref := range ev.Pending {
			if i == 5 {
				break
			}
			var reply api.DTRReply
			err := s.request(api.SubjectDTR, []byte(ref.DTR.String()), nil, &reply)
			why := ""
			if reply.Why != nil {
				why = reply.Why.Reason
			}
			t.Logf("pending %s: scheduler says %v state %s grant %q attempts %d error %+v: %s",
				ref.DTR, err, reply.DTR.State, reply.DTR.Grant, reply.DTR.Attempts, reply.DTR.Error, why)
		}
		for _, r := range []string{"scheduler", "generator", "processor", "delivery"} {
			t.Logf("last lines of the %s log:\n%s", r, c.logTail(r, 15))
		}
		t.Fatalf("job %s: %d done, %d failed, %d cancelled of %d, %d pending: %v", ev.State, ev.Done, ev.Failed, ev.Cancelled, files, len(ev.Pending), ev.Failures)
	}
	// None lost: every file of the job is there once, DONE, byte for byte
	// its source, with the checksum it was given.
	ids := map[string]bool{}
	for _, id := range r.DTRs {
		ids[id.String()] = true
	}
	seen := make([]bool, files)
	attempts := 0
	for _, f := range ev.Files {
		if f.State != dtr.Done {
			t.Fatalf("%s ended %s", f.Destination, f.State)
		}
		if !ids[f.DTR.String()] {
			t.Fatalf("%s: DTR %s is not one of the job's", f.Destination, f.DTR)
		}
		i, err := strconv.Atoi(filepath.Base(f.Destination))
		if err != nil || i < 0 || i >= files || seen[i] {
			t.Fatalf("%s: not a destination of the job, or listed twice", f.Destination)
		}
		seen[i] = true
		if !checksum.Equal(f.Checksum, sums[i]) {
			t.Fatalf("%s: checksum %q, want %q", f.Destination, f.Checksum, sums[i])
		}
		want, _ := os.ReadFile(filepath.Join(src, strconv.Itoa(i)))
		got, err := os.ReadFile(filepath.Join(out, strconv.Itoa(i)))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s is not intact: %v", f.Destination, err)
		}
		attempts += f.Attempts
	}
	select {
	case name := <-replaced:
		t.Fatalf("finished destination %s was written twice", name)
	default:
	}
	// Every DTR was announced final, DONE, in one state only (a scheduler
	// killed between the announcement and storing the final record
	// announces it again, the same).
	finals := map[string]dtr.State{}
	events := 0
	cons, err := s.js.OrderedConsumer(context.Background(), bus.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{api.SubjectDTRFinal}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		// In batches: one request per event takes a minute for 10,000.
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			fs, err := codec.DecodeFinals(context.Background(), bus.Msg(m))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range fs {
				d := f.DTR
				if old, ok := finals[d.ID.String()]; ok && old != d.State {
					t.Fatalf("DTR %s announced %s and %s", d.ID, old, d.State)
				}
				if d.State != dtr.Done || !ids[d.ID.String()] {
					t.Fatalf("DTR %s announced %s; want one of the job's DTRs, DONE", d.ID, d.State)
				}
				finals[d.ID.String()] = d.State
				events++
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("reading the final DTR events: %v", err)
		}
		if n == 0 {
			break
		}
	}
	if len(finals) != files {
		t.Fatalf("%d DTRs announced final, want %d", len(finals), files)
	}
	t.Logf("files and final events checked at %.1fs", time.Since(testStart).Seconds())
	if leftovers, _ := filepath.Glob(filepath.Join(out, ".*.part")); len(leftovers) > 0 {
		// Say what the roles did with the DTR that left it: the name is
		// ".<name>.sluice-<grant>.part", the grant "<dtr>.<n>".
		name := filepath.Base(leftovers[0])
		if i := strings.Index(name, ".sluice-"); i >= 0 && len(name) >= i+len(".sluice-")+36 {
			id := name[i+len(".sluice-"):][:36]
			for _, r := range []string{"scheduler", "generator", "processor", "delivery"} {
				t.Logf("%s log on %s:\n%s", r, id, c.logGrep(r, id, 20))
			}
		}
		t.Fatalf("%d temporary files left, e.g. %s", len(leftovers), leftovers[0])
	}
	// Every slot is free once everything is final: no share runs anything
	// (or has anything queued) in any state.
	deadline := time.Now().Add(20 * time.Second)
	for {
		sh := s.shares()
		running := 0
		for _, st := range sh.Shares {
			running += st.Running
		}
		if running == 0 && len(sh.Shares) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slots still held (%d running): %+v", running, sh.Shares)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("%d files, every one DONE once, intact, its adler32 verified; %d attempts in all; %d final DTRs announced on the stream; "+
		"kills %d (scheduler %d, generator %d, processor %d, delivery %d); NATS restarted at %.1fs for %.1fs with %d DTRs final; "+
		"%.1fs from submit to the job's end: %.1f DTR/s (%.1fs in all, the build and the checks included)",
		files, attempts, events, total, kills["scheduler"], kills["generator"], kills["processor"], kills["delivery"],
		restartedAt.Seconds(), restartedFor.Seconds(), restartedAtFinal, took.Seconds(), float64(files)/took.Seconds(), time.Since(testStart).Seconds())
}

// kvJSON reads a key's JSON value.
func kvJSON(ctx context.Context, kv jetstream.KeyValue, key string, v any) (uint64, error) {
	e, err := kv.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	return e.Revision(), json.Unmarshal(e.Value(), v)
}

// TestASchedulerStartedWhileNATSIsDownWaitsForIt starts the scheduler (its
// own process) against a NATS server that is not there, for longer than
// its first JetStream requests wait, then starts the server: the scheduler must
// wait for it and serve, as the other roles do, not exit.
func TestASchedulerStartedWhileNATSIsDownWaitsForIt(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	c := &cluster{t: t, bin: bin, dir: dir, procs: map[string]*process{}, env: []string{
		"NATS_URL=" + url, "SLUICE_LOG_LEVEL=info", "SLUICE_LOG_FORMAT=text", "SLUICE_HTTP_ADDR=127.0.0.1:0",
		"SLUICE_ALLOW_NETWORKS=127.0.0.0/8", // the test's storage servers are on loopback
	}}
	defer c.stopAll()
	c.start("scheduler")
	// Longer than its first JetStream requests wait (5 s each): a
	// scheduler that gave up on them would have exited by now.
	time.Sleep(12 * time.Second)
	ns, err := bus.Embedded(filepath.Join(dir, "jetstream"), port)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	s := &system{t: t, ns: ns, dir: dir}
	if s.nc, err = app.Connect(url, "test"); err != nil {
		t.Fatal(err)
	}
	defer s.nc.Close()
	var sh api.SharesReply
	err = s.request(api.SubjectShares, nil, nil, &sh)
	c.mu.Lock()
	exits := c.exits
	c.mu.Unlock()
	if err != nil || len(exits) > 0 {
		t.Fatalf("the scheduler does not answer (%v); exits %v; its log:\n%s", err, exits, c.logTail("scheduler", 10))
	}
	t.Logf("the scheduler's log:\n%s", c.logTail("scheduler", 5))
}
