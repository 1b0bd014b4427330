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
	// named are processes known by another name than their role's (a
	// second scheduler), with their role and environment: start and the
	// restarts use them.
	named map[string]namedProcess
}

// namedProcess is a process's role and its own environment.
type namedProcess struct {
	role string
	env  []string
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

func (c *cluster) start(name string) {
	c.t.Helper()
	if n, ok := c.named[name]; ok {
		c.startAs(name, n.role, n.env...)
		return
	}
	c.startAs(name, name)
}

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
// supervisor would, and returns them with the last lines of their logs
// (what they said as they exited).
func (c *cluster) restartExited() (roles, tails []string) {
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
		tails = append(tails, c.logTail(r, 5))
		c.kill(r)
		c.start(r)
	}
	return roles, tails
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
// no role exits by itself, and that no slot stays held: one subtest each,
// once the run is over. The checks of the files, the final events and
// the slots are made only if the job finished.
func TestKilledProcessesLoseNothing(t *testing.T) {
	run := startChaosCluster(t, chaosFiles(t))
	run.writeAndSubmitJob()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	watching := run.watchForReplacedFiles(ctx)
	run.followJobRecord(ctx)
	run.driveChaos()
	stop()
	watching.Wait()
	t.Logf("kills: %d %v", run.totalKills(), run.kills)

	t.Run("no role exited unless killed", run.noRoleExitedUnlessKilled)
	t.Run("the driver killed at least 20 times and restarted NATS", run.theDriverKilledAndRestartedNATS)
	if !t.Run("the job finished, every DTR DONE", run.theJobFinished) {
		t.Fatal("the job did not finish: its files, final events and slots are not checked")
	}
	files := t.Run("every file is DONE once, intact, with its checksum", run.everyFileIsDoneOnceIntact)
	twice := t.Run("no finished file was written twice", run.noFinishedFileWasWrittenTwice)
	finals := t.Run("every DTR was announced final once, DONE", run.everyDTRWasAnnouncedFinalOnce)
	if files && twice && finals {
		t.Logf("files and final events checked at %.1fs", time.Since(run.testStart).Seconds())
	}
	temps := t.Run("no temporary file is left", run.noTemporaryFileIsLeft)
	slots := t.Run("every slot is free once all is final", run.everySlotIsFree)
	if files && twice && finals && temps && slots {
		run.logSummary()
	}
}

// The chaos driver kills a random role every 0.3–1.5 s and restarts it,
// for at most chaosFor, and restarts NATS once half way through (or once
// half the DTRs are final, if that comes first), keeping it down for
// chaosNATSDown, long enough for every client to notice; then it lets the
// system settle and finish, for at most chaosSettle. (A system killed
// without end on a slow, shared machine may not get anywhere, which says
// nothing about what it loses.)
const (
	chaosFor      = 90 * time.Second
	chaosSettle   = 8 * time.Minute
	chaosNATSDown = 2 * time.Second
)

// chaosRoles are the processes the chaos test runs: each role, and a
// second scheduler (a standby while the other leads).
var chaosRoles = []string{"scheduler", "scheduler-b", "generator", "processor", "delivery"}

// chaosRun is one run of the chaos test: its cluster, its job, what the
// driver did and what the run saw.
type chaosRun struct {
	t         *testing.T
	files     int
	testStart time.Time
	dir       string
	store     string // the NATS server's store, kept across its restart
	port      int    // the NATS server's port, the same after its restart
	// ns is the server in use: the restart replaces it, and the cleanup
	// stops whichever runs then.
	ns atomic.Pointer[server.Server]
	c  *cluster
	s  *system

	src, out string          // the job's sources and destinations
	sums     []string        // each file's expected adler32 checksum
	job      api.SubmitReply // the job as submitted
	ids      map[string]bool // the job's DTRs
	began    time.Time       // when the job was submitted

	replaced chan string       // finished destinations seen replaced
	final    atomic.Int64      // DTRs final so far, as the job record counts them
	done     chan api.JobEvent // the job's whole status, once it has ended or its follower gave up

	kills            map[string]int // by role
	restartedAt      time.Duration  // since the submit, when NATS was stopped
	restartedFor     time.Duration  // how long the restart took
	restartedAtFinal int64          // DTRs final when NATS restarted; -1 until it has
	ended            bool           // the job ended before the driver stopped
	ev               api.JobEvent   // the job's whole status at the end
	took             time.Duration  // from the submit to the job's end

	attempts int // the attempts of every file, counted by the file check
	events   int // the final DTR events, counted by their check
	grants   *grantLog
}

// startChaosCluster builds sluice, starts an embedded NATS server and
// each role as a process of its own against it, and connects the test to
// it. The test's cleanup stops them all.
func startChaosCluster(t *testing.T, files int) *chaosRun {
	r := &chaosRun{t: t, files: files, testStart: time.Now(), restartedAtFinal: -1, kills: map[string]int{},
		replaced: make(chan string, 10), done: make(chan api.JobEvent, 1)}
	bin := buildBinary(t)
	t.Logf("sluice built in %.1fs", time.Since(r.testStart).Seconds())
	r.dir = t.TempDir()
	r.store = filepath.Join(r.dir, "jetstream")
	first, err := bus.Embedded(r.store, 0)
	if err != nil {
		t.Fatal(err)
	}
	r.ns.Store(first)
	t.Cleanup(func() { r.ns.Load().Shutdown() })
	r.port = first.Addr().(*net.TCPAddr).Port
	r.c = &cluster{t: t, bin: bin, dir: r.dir, procs: map[string]*process{}, named: map[string]namedProcess{
		"scheduler":   {"scheduler", []string{"SLUICE_SCHEDULER_NAME=scheduler"}},
		"scheduler-b": {"scheduler", []string{"SLUICE_SCHEDULER_NAME=scheduler-b"}},
	}, env: []string{
		"NATS_URL=" + first.ClientURL(), "SLUICE_LOG_LEVEL=warn", "SLUICE_LOG_FORMAT=text", "SLUICE_HTTP_ADDR=127.0.0.1:0",
		"SLUICE_ALLOW_NETWORKS=127.0.0.0/8", // the test's storage servers are on loopback
		"SLUICE_LEASE=4s", "SLUICE_RETRY_BASE=100ms", "SLUICE_MAXTRANSFERTRIES=20",
		"SLUICE_MAXDELIVERY=20", "SLUICE_MAXPROCESSOR=20", "SLUICE_GENERATOR_MAX_FILES=10000",
		"SLUICE_DELIVERY_WORKERS=21", "SLUICE_PROCESSOR_PRE_WORKERS=42", "SLUICE_PROCESSOR_POST_WORKERS=21",
	}}
	t.Cleanup(r.c.stopAll)
	for _, role := range chaosRoles {
		r.c.start(role)
	}
	r.s = &system{t: t, ns: first, dir: r.dir}
	r.s.nc, err = app.Connect(first.ClientURL(), "chaos-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.s.nc.Close)
	r.s.js, _ = jetstream.New(r.s.nc)
	r.grants = watchGrants(t, r.s.nc)
	return r
}

// writeAndSubmitJob writes the job's files and submits it. Every file
// has an expected adler32 checksum, which Sluice verifies.
func (r *chaosRun) writeAndSubmitJob() {
	t := r.t
	r.src, r.out = filepath.Join(r.dir, "src"), filepath.Join(r.dir, "out")
	j := &job.Job{ID: "chaos"}
	r.sums = make([]string, r.files)
	for i := 0; i < r.files; i++ {
		p := filepath.Join(r.src, strconv.Itoa(i))
		writeFile(t, p, 1024+i%977, i)
		var err error
		if r.sums[i], err = checksum.File(p, "adler32"); err != nil {
			t.Fatal(err)
		}
		j.Inputs = append(j.Inputs, job.File{Source: fileURL(p), Destination: fileURL(filepath.Join(r.out, strconv.Itoa(i))),
			Checksum: r.sums[i]})
	}
	desc, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d files written at %.1fs; the job description is %d bytes (max_payload %d)",
		r.files, time.Since(r.testStart).Seconds(), len(desc), r.s.nc.MaxPayload())
	r.began = time.Now()
	r.job = r.s.submit(j)
	if len(r.job.DTRs) != r.files {
		t.Fatalf("the job made %d DTRs, want %d", len(r.job.DTRs), r.files)
	}
	r.ids = map[string]bool{}
	for _, id := range r.job.DTRs {
		r.ids[id.String()] = true
	}
}

// watchForReplacedFiles watches the destinations until ctx is done: a
// finished file must never be replaced (by another inode under its name).
// What it sees replaced goes to r.replaced; wait on the group it returns.
func (r *chaosRun) watchForReplacedFiles(ctx context.Context) *sync.WaitGroup {
	var watch sync.WaitGroup
	watch.Add(1)
	go func() {
		defer watch.Done()
		seen := map[string]uint64{}
		for ctx.Err() == nil {
			entries, _ := os.ReadDir(r.out)
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
					case r.replaced <- e.Name():
					default:
					}
				}
				seen[e.Name()] = ino
			}
			time.Sleep(300 * time.Millisecond)
		}
	}()
	return &watch
}

// followJobRecord follows the job's record until the job has ended (or
// until chaosFor and chaosSettle have passed, or a minute before the
// test's deadline), keeping r.final up to date, then sends the job's
// whole status to r.done.
func (r *chaosRun) followJobRecord(ctx context.Context) {
	go func() {
		// The job record is read straight from its bucket: asking the
		// generator for the whole status of a job of 10,000 files five
		// times a second would load the system under test. Services and
		// NATS die under it, so errors here are expected and retried.
		deadline := time.Now().Add(chaosFor + chaosSettle)
		if d, ok := r.t.Deadline(); ok && d.Add(-time.Minute).Before(deadline) {
			deadline = d.Add(-time.Minute) // time to say what is missing
		}
		var ev api.JobEvent
		for time.Now().Before(deadline) && ctx.Err() == nil {
			var rec api.JobRecord
			if kv, err := r.s.js.KeyValue(ctx, bus.BucketJobs); err == nil {
				if _, err := kvJSON(ctx, kv, r.job.JobID, &rec); err == nil {
					r.final.Store(int64(rec.Final()))
					if rec.Announced {
						break
					}
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		// The whole status, once (the last try's if the job never ended).
		for try := 0; try < 30; try++ {
			if err := r.s.request(api.SubjectJobStatus, []byte(r.job.JobID), nil, &ev); err == nil {
				break
			}
			time.Sleep(time.Second)
		}
		r.done <- ev
	}()
}

// driveChaos is the chaos driver: for at most chaosFor, or until the job
// ends, it kills a random role every 0.3–1.5 s and starts it again, and
// restarts NATS once on the way; then it keeps the roles up until the
// job's follower reports.
func (r *chaosRun) driveChaos() {
	rng := rand.New(rand.NewPCG(1, 2))
	chaosStart := time.Now()
	chaosEnd := chaosStart.Add(chaosFor)
chaos:
	for time.Now().Before(chaosEnd) {
		select {
		case r.ev = <-r.done:
			r.ended = true
			break chaos
		case <-time.After(time.Duration(300+rng.IntN(1200)) * time.Millisecond):
		}
		if r.restartedAtFinal < 0 && (time.Since(chaosStart) >= chaosFor/2 || r.final.Load() >= int64(r.files)/2) {
			r.restartNATS()
		}
		r.restartExitedRoles()
		role := []string{"leader", "leader", "standby", "processor", "delivery", "generator"}[rng.IntN(6)]
		r.kills[role]++
		if role == "leader" || role == "standby" {
			role = r.scheduler(role == "leader")
		}
		r.c.kill(role)
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		r.c.start(role)
	}
	if !r.ended {
		r.keepRolesUpUntilTheJobEnds()
	}
	r.took = time.Since(r.began)
	if r.ev.Announced {
		r.t.Logf("the job ended after %.1fs", r.took.Seconds())
	} else {
		r.t.Logf("the job had not ended after %.1fs", r.took.Seconds())
	}
}

// scheduler returns the scheduler process that leads now (or, not
// leader, the other one); the first if none leads.
func (r *chaosRun) scheduler(leader bool) string {
	l := leaderOf(r.t, r.s.nc).Name
	other := map[string]string{"scheduler": "scheduler-b", "scheduler-b": "scheduler"}
	if _, ok := other[l]; !ok {
		return "scheduler"
	}
	if leader {
		return l
	}
	return other[l]
}

// keepRolesUpUntilTheJobEnds waits, with no more kills, for the job's
// follower to report, starting again any role that exits meanwhile.
func (r *chaosRun) keepRolesUpUntilTheJobEnds() {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case r.ev = <-r.done:
			return
		case <-tick.C:
			r.restartExitedRoles()
		}
	}
}

// restartExitedRoles starts again every role that exited by itself, as a
// supervisor would, and says so.
func (r *chaosRun) restartExitedRoles() {
	roles, tails := r.c.restartExited()
	for i, role := range roles {
		r.t.Logf("%s exited by itself; started again. Its log ended:\n%s", role, tails[i])
	}
}

// restartNATS stops the NATS server and starts it again on the same port
// with the same store. The scheduler dies with NATS and starts again
// while NATS is down: it must wait for it, as the other roles must
// reconnect.
func (r *chaosRun) restartNATS() {
	old := r.ns.Load()
	at := time.Since(r.began)
	leader := r.scheduler(true)
	r.c.kill(leader)
	r.kills["leader"]++
	old.Shutdown()
	old.WaitForShutdown()
	r.c.start(leader)
	time.Sleep(chaosNATSDown) // long enough for every client to notice
	next, err := bus.Embedded(r.store, r.port)
	for try := 0; err != nil && try < 20; try++ {
		time.Sleep(250 * time.Millisecond) // the port may linger a moment
		next, err = bus.Embedded(r.store, r.port)
	}
	if err != nil {
		r.t.Fatalf("restart NATS on port %d: %v", r.port, err)
	}
	r.ns.Store(next)
	r.s.ns = next
	r.restartedAt, r.restartedFor, r.restartedAtFinal = at, time.Since(r.began)-at, r.final.Load()
	r.t.Logf("NATS restarted at %.1fs (down %.1fs; the scheduler killed before and started while it was down), with %d of %d DTRs final",
		r.restartedAt.Seconds(), r.restartedFor.Seconds(), r.restartedAtFinal, r.files)
}

// totalKills is how many times the driver killed a role.
func (r *chaosRun) totalKills() int {
	total := 0
	for _, n := range r.kills {
		total += n
	}
	return total
}

// logTails logs the last lines of every role's log.
func (r *chaosRun) logTails(t *testing.T) {
	for _, role := range chaosRoles {
		t.Logf("last lines of the %s log:\n%s", role, r.c.logTail(role, 15))
	}
}

// noRoleExitedUnlessKilled checks that every role outlived anything but
// SIGKILL, NATS going away included.
func (r *chaosRun) noRoleExitedUnlessKilled(t *testing.T) {
	r.c.mu.Lock()
	exits := append([]string(nil), r.c.exits...)
	r.c.mu.Unlock()
	if len(exits) > 0 {
		r.logTails(t)
		t.Errorf("roles exited without being killed: %v", exits)
	}
}

// theDriverKilledAndRestartedNATS checks that the run was the one meant:
// at least 20 kills (unless the job ended first) and NATS restarted.
func (r *chaosRun) theDriverKilledAndRestartedNATS(t *testing.T) {
	total := r.totalKills()
	if r.ended {
		t.Logf("the job ended after %d kills, before the driver stopped", total)
	} else if total < 20 {
		t.Errorf("the driver killed %d times in %s, want at least 20", total, chaosFor)
	}
	if r.restartedAtFinal < 0 {
		t.Errorf("NATS was not restarted: the job ended after %.1fs", r.took.Seconds())
	}
}

// theJobFinished checks that the job ended FINISHED with every file
// DONE; if not, it says where the unfinished DTRs are and what the roles
// logged last.
func (r *chaosRun) theJobFinished(t *testing.T) {
	ev := r.ev
	if ev.State == api.JobFinished && ev.Done == r.files && len(ev.Files) == r.files {
		return
	}
	r.explainPending(t)
	r.logTails(t)
	t.Fatalf("job %s: %d done, %d failed, %d cancelled of %d, %d pending: %v", ev.State, ev.Done, ev.Failed, ev.Cancelled, r.files, len(ev.Pending), ev.Failures)
}

// explainPending logs where the first five unfinished DTRs are, as the
// scheduler sees them.
func (r *chaosRun) explainPending(t *testing.T) {
	for i, ref := range r.ev.Pending {
		if i == 5 {
			break
		}
		var reply api.DTRReply
		err := r.s.request(api.SubjectDTR, []byte(ref.DTR.String()), nil, &reply)
		why := ""
		if reply.Why != nil {
			why = reply.Why.Reason
		}
		t.Logf("pending %s: scheduler says %v state %s grant %q attempts %d error %+v: %s",
			ref.DTR, err, reply.DTR.State, reply.DTR.Grant, reply.DTR.Attempts, reply.DTR.Error, why)
	}
}

// everyFileIsDoneOnceIntact checks that none is lost: every file of the
// job is there once, DONE, byte for byte its source, with the checksum it
// was given. It counts the attempts for the summary.
func (r *chaosRun) everyFileIsDoneOnceIntact(t *testing.T) {
	seen := make([]bool, r.files)
	for _, f := range r.ev.Files {
		if f.State != dtr.Done {
			t.Fatalf("%s ended %s", f.Destination, f.State)
		}
		if !r.ids[f.DTR.String()] {
			t.Fatalf("%s: DTR %s is not one of the job's", f.Destination, f.DTR)
		}
		i, err := strconv.Atoi(filepath.Base(f.Destination))
		if err != nil || i < 0 || i >= r.files || seen[i] {
			t.Fatalf("%s: not a destination of the job, or listed twice", f.Destination)
		}
		seen[i] = true
		if !checksum.Equal(f.Checksum, r.sums[i]) {
			t.Fatalf("%s: checksum %q, want %q", f.Destination, f.Checksum, r.sums[i])
		}
		want, _ := os.ReadFile(filepath.Join(r.src, strconv.Itoa(i)))
		got, err := os.ReadFile(filepath.Join(r.out, strconv.Itoa(i)))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s is not intact: %v", f.Destination, err)
		}
		r.attempts += f.Attempts
	}
}

// noFinishedFileWasWrittenTwice checks what the destinations' watcher
// saw: no finished file replaced.
func (r *chaosRun) noFinishedFileWasWrittenTwice(t *testing.T) {
	select {
	case name := <-r.replaced:
		t.Fatalf("finished destination %s was written twice", name)
	default:
	}
}

// everyDTRWasAnnouncedFinalOnce reads the final DTR events from the
// stream: every DTR was announced final, DONE, in one state only (a
// scheduler killed between the announcement and storing the final
// record announces it again, the same). It counts the events for the
// summary.
func (r *chaosRun) everyDTRWasAnnouncedFinalOnce(t *testing.T) {
	finals := map[string]dtr.State{}
	cons, err := r.s.js.OrderedConsumer(context.Background(), bus.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{api.SubjectDTRFinal}})
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
				if d.State != dtr.Done || !r.ids[d.ID.String()] {
					t.Fatalf("DTR %s announced %s; want one of the job's DTRs, DONE", d.ID, d.State)
				}
				finals[d.ID.String()] = d.State
				r.events++
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("reading the final DTR events: %v", err)
		}
		if n == 0 {
			break
		}
	}
	if len(finals) != r.files {
		t.Fatalf("%d DTRs announced final, want %d", len(finals), r.files)
	}
}

// noTemporaryFileIsLeft checks the destinations for temporary files; for
// one left, it says what the roles did with the DTR that left it.
func (r *chaosRun) noTemporaryFileIsLeft(t *testing.T) {
	leftovers, _ := filepath.Glob(filepath.Join(r.out, ".*.part"))
	if len(leftovers) == 0 {
		return
	}
	// The name is ".<name>.sluice-<grant>.part", the grant "<dtr>.<n>".
	name := filepath.Base(leftovers[0])
	if i := strings.Index(name, ".sluice-"); i >= 0 && len(name) >= i+len(".sluice-")+36 {
		id := name[i+len(".sluice-"):][:36]
		for _, role := range chaosRoles {
			t.Logf("%s log on %s:\n%s", role, id, r.c.logGrep(role, id, 20))
		}
	}
	t.Fatalf("%d temporary files left, e.g. %s", len(leftovers), leftovers[0])
}

// everySlotIsFree checks that, once everything is final, every slot is
// freed within 20 s: no share runs anything (or has anything queued) in
// any state.
func (r *chaosRun) everySlotIsFree(t *testing.T) {
	// s.shares fails the test it was given: make that this subtest.
	parent := r.s.t
	r.s.t = t
	defer func() { r.s.t = parent }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		sh := r.s.shares()
		running := 0
		for _, st := range sh.Shares {
			running += st.Running
		}
		if running == 0 && len(sh.Shares) == 0 {
			// The stuck-DTR detector found nothing stuck either.
			if len(sh.Stuck) > 0 {
				t.Fatalf("stuck DTRs: %+v", sh.Stuck)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slots still held (%d running): %+v", running, sh.Shares)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// logSummary logs what the run did, once every check has passed.
func (r *chaosRun) logSummary() {
	k := r.kills
	gap, at := r.grants.longestGap(r.began, r.began.Add(r.took))
	r.t.Logf("%d files, every one DONE once, intact, its adler32 verified; %d attempts in all; %d final DTRs announced on the stream; "+
		"kills %d (leading scheduler %d, standby %d, generator %d, processor %d, delivery %d); NATS restarted at %.1fs for %.1fs with %d DTRs final; "+
		"%.1fs from submit to the job's end: %.1f DTR/s (%.1fs in all, the build and the checks included); the longest time without a grant was %.1fs, from %.1fs",
		r.files, r.attempts, r.events, r.totalKills(), k["leader"], k["standby"], k["generator"], k["processor"], k["delivery"],
		r.restartedAt.Seconds(), r.restartedFor.Seconds(), r.restartedAtFinal, r.took.Seconds(), float64(r.files)/r.took.Seconds(), time.Since(r.testStart).Seconds(),
		gap.Seconds(), at.Sub(r.began).Seconds())
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
