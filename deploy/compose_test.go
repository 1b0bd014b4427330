// Package deploy holds the docker compose deployment; its test brings the
// stack up for real.
package deploy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
	"github.com/sluice-dtr/sluice/services/scheduler"
)

// compose runs docker compose (the plugin, or docker-compose v1) on the
// test's project.
type compose struct {
	t       *testing.T
	command []string
	env     []string
}

func newCompose(t *testing.T, project string, files []string, env []string) *compose {
	c := &compose{t: t, env: append(os.Environ(), env...)}
	if exec.Command("docker", "compose", "version").Run() == nil {
		c.command = []string{"docker", "compose"}
	} else if p, err := exec.LookPath("docker-compose"); err == nil {
		c.command = []string{p}
	} else {
		t.Fatal("neither `docker compose` nor docker-compose is installed")
	}
	c.command = append(c.command, "-p", project)
	for _, f := range files {
		c.command = append(c.command, "-f", f)
	}
	return c
}

// run runs a compose command and returns its output, failing the test if
// it fails.
func (c *compose) run(args ...string) string {
	c.t.Helper()
	out, err := c.try(args...)
	if err != nil {
		c.t.Fatalf("%s %s: %v\n%s", strings.Join(c.command, " "), strings.Join(args, " "), err, out)
	}
	return out
}

func (c *compose) try(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.command[0], append(c.command[1:], args...)...)
	cmd.Env = c.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// containers returns the ids of a service's containers.
func (c *compose) containers(service string) []string {
	return strings.Fields(c.run("ps", "-q", service))
}

// healthy waits until every container of the project reports healthy.
func (c *compose) healthy(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ids := strings.Fields(c.run("ps", "-q"))
		var bad []string
		for _, id := range ids {
			// A container without a healthcheck (Jaeger's) counts once it runs.
			out, err := exec.Command("docker", "inspect", "-f", "{{.Name}} {{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}(no healthcheck){{end}}", id).Output()
			st := strings.TrimSpace(string(out))
			if err != nil || !(strings.HasSuffix(st, "running healthy") || strings.HasSuffix(st, "running (no healthcheck)")) {
				bad = append(bad, strings.TrimSpace(string(out)))
			}
		}
		if len(ids) > 0 && len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("not healthy after %s: %v\n%s", timeout, bad, c.run("logs", "--tail", "30"))
		}
		time.Sleep(time.Second)
	}
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// slowFiles serves the files under dir to the containers, slowly (about
// 250 ms a file). While hold is on, downloads wait until it is off again:
// the transfers under way stay in hand, whatever the machine's speed,
// while the test scales the deliverers or picks one to kill.
func slowFiles(t *testing.T, dir string) (base string, hold func(on bool)) {
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	var held atomic.Pointer[chan struct{}]
	hold = func(on bool) {
		if on {
			c := make(chan struct{})
			if held.CompareAndSwap(nil, &c) {
				return
			}
		} else if c := held.Swap(nil); c != nil {
			close(*c)
		}
	}
	files := http.FileServer(http.Dir(dir))
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			time.Sleep(250 * time.Millisecond)
			if c := held.Load(); c != nil {
				<-*c
			}
		}
		files.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { hold(false); srv.Close() })
	return fmt.Sprintf("http://host.docker.internal:%d", ln.Addr().(*net.TCPAddr).Port), hold
}

// deployment is a compose project under test with a job of real files.
type deployment struct {
	t       *testing.T
	c       *compose
	nc      *nats.Conn
	ports   ports
	dst     string
	job     *job.Job
	sums    map[string][32]byte
	jobID   string
	started time.Time
	// src and base: the host directory of the source files, and the URL
	// the containers reach it at.
	src, base string
	// hold holds the source's downloads while on.
	hold func(on bool)
}

// ports are the host ports of a project.
type ports struct {
	nats   [3]int // NATS_PORT, NATS_2_PORT, NATS_3_PORT
	web    int    // SLUICE_WEB_PORT (the scheduler's web page)
	web2   int    // SLUICE_WEB_2_PORT (scheduler-2's)
	jaeger int    // JAEGER_UI_PORT
}

// natsURLs is NATS_URL for the host's clients: every server, as user.
func (p ports) natsURLs(user, password string) string {
	var urls []string
	for _, port := range p.nats {
		urls = append(urls, fmt.Sprintf("nats://%s:%s@127.0.0.1:%d", user, password, port))
	}
	return strings.Join(urls, ",")
}

// needCompose skips the test unless SLUICE_COMPOSE_TEST=1, and builds the
// images (Jaeger's too if jaeger) unless SLUICE_COMPOSE_NO_BUILD is set.
func needCompose(t *testing.T, jaeger bool) {
	if os.Getenv("SLUICE_COMPOSE_TEST") != "1" {
		t.Skip("SKIPPED: the compose test runs with SLUICE_COMPOSE_TEST=1 and a Docker engine (.ci/run sets it when `docker info` works)")
	}
	if err := exec.Command("docker", "info").Run(); err != nil {
		t.Fatalf("SLUICE_COMPOSE_TEST=1 but `docker info` fails: %v", err)
	}
	if os.Getenv("SLUICE_COMPOSE_NO_BUILD") == "" {
		args := []string{}
		if jaeger {
			args = append(args, "--jaeger")
		}
		start := time.Now()
		build := exec.Command("./build-image.sh", args...)
		name := strings.Join(append([]string{"build-image.sh"}, args...), " ")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
		t.Logf("%s: %s", name, time.Since(start).Round(time.Second))
	}
}

// up brings a project up from compose.yaml and the given files, with env
// besides the images and host ports, and waits until it is healthy; it
// goes down, volumes too, when the test ends.
func up(t *testing.T, files []string, env []string, upArgs ...string) (*compose, ports) {
	var p ports
	for i := range p.nats {
		p.nats[i] = freePort(t)
	}
	p.web, p.web2, p.jaeger = freePort(t), freePort(t), freePort(t)
	project := fmt.Sprintf("sluicetest%d", os.Getpid())
	c := newCompose(t, project, append([]string{"compose.yaml"}, files...), append([]string{
		"NATS_IMAGE=" + envOr("SLUICE_NATS_IMAGE", "sluice-nats:dev"),
		"SLUICE_IMAGE=" + envOr("SLUICE_IMAGE", "sluice:dev"),
		"JAEGER_IMAGE=" + envOr("SLUICE_JAEGER_IMAGE", "sluice-jaeger:dev"),
		"NATS_PORT=" + strconv.Itoa(p.nats[0]), "NATS_2_PORT=" + strconv.Itoa(p.nats[1]), "NATS_3_PORT=" + strconv.Itoa(p.nats[2]),
		"SLUICE_WEB_PORT=" + strconv.Itoa(p.web), "SLUICE_WEB_2_PORT=" + strconv.Itoa(p.web2), "JAEGER_UI_PORT=" + strconv.Itoa(p.jaeger),
	}, env...))
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.try("logs", "--tail", "40")
			t.Logf("logs:\n%s", out)
		}
		if out, err := c.try("down", "-v", "--remove-orphans", "-t", "5"); err != nil {
			t.Errorf("down -v: %v\n%s", err, out)
		}
		if out, _ := exec.Command("docker", "ps", "-aq", "--filter", "label=com.docker.compose.project="+project).Output(); len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("containers left after down -v: %s", out)
		}
		if out, _ := exec.Command("docker", "volume", "ls", "-q", "--filter", "label=com.docker.compose.project="+project).Output(); len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("volumes left after down -v: %s", out)
		}
	})
	start := time.Now()
	c.run(append([]string{"up", "-d"}, upArgs...)...)
	c.healthy(2 * time.Minute)
	t.Logf("stack up and healthy in %s", time.Since(start).Round(time.Second))
	return c, p
}

// connect connects to the project's NATS as the submitter, at the first
// server (NATS_PORT): in a cluster nats.go learns the others from it.
func (d *deployment) connect() {
	var err error
	d.nc, err = nats.Connect(fmt.Sprintf("nats://submitter:%s@127.0.0.1:%d", envOr("SLUICE_NATS_SUBMITTER_PASSWORD", "submitter-dev"), d.ports.nats[0]),
		nats.CustomInboxPrefix("_INBOX_submitter"), nats.MaxReconnects(-1))
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(d.nc.Close)
}

// deploy builds the images (unless SLUICE_COMPOSE_NO_BUILD is set), writes
// files source files, and brings the project up with the given extra
// compose files; everything goes down, volumes too, when the test ends.
func deploy(t *testing.T, files int, extra ...string) *deployment {
	needCompose(t, false)
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	for _, d := range []string{src, dst} {
		if err := os.MkdirAll(d, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o777); err != nil { // the containers run as nobody
			t.Fatal(err)
		}
	}
	base, hold := slowFiles(t, src)
	d := &deployment{t: t, dst: dst, sums: map[string][32]byte{}, hold: hold, src: src, base: base,
		job: &job.Job{Name: "compose", Owner: dtr.Identity{DN: "/CN=compose", FQANs: []string{"/atlas"}}}}
	for i := 0; i < files; i++ {
		d.addHTTPFile(fmt.Sprintf("f%03d", i), 64<<10+i*97)
	}

	// The test's own override: the files, the way to the host's HTTP
	// server, and room for three deliverers' transfers. The host is
	// reached at Docker's host-gateway address, a private one (172.17.0.1
	// on the default bridge), which transfers reach only when allowed.
	override := filepath.Join(dir, "compose.test.yaml")
	testService := fmt.Sprintf(`
    volumes:
      - data:/data
      - %s:/data/files/test
    extra_hosts:
      - "host.docker.internal:host-gateway"
    environment:
      SLUICE_ALLOW_NETWORKS: "172.16.0.0/12,192.168.0.0/16,10.0.0.0/8"`, dir)
	err := os.WriteFile(override, []byte(`services:
  processor:`+testService+`
  delivery:`+testService+`
      SLUICE_DELIVERY_WORKERS: "10"
  scheduler:
    environment: &scheduler
      SLUICE_MAXDELIVERY: "30"
      SLUICE_MAXPROCESSOR: "20"
      SLUICE_LEASE: "40s"
  scheduler-2:
    environment: *scheduler
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	d.c, d.ports = up(t, append(extra, override), nil, "--scale", "processor=2", "--scale", "delivery=1")
	d.connect()
	return d
}

// addHTTPFile writes a source file of size random bytes, served by the
// test's HTTP server, and adds it to the job with a destination under dst
// and its adler32.
func (d *deployment) addHTTPFile(name string, size int) {
	b := make([]byte, size)
	_, _ = rand.Read(b)
	if err := os.WriteFile(filepath.Join(d.src, name), b, 0o644); err != nil {
		d.t.Fatal(err)
	}
	h, err := checksum.New("adler32")
	if err != nil {
		d.t.Fatal(err)
	}
	h.Write(b)
	d.sums[name] = sha256.Sum256(b)
	d.job.Inputs = append(d.job.Inputs, job.File{Source: d.base + "/" + name,
		Destination: "file:///data/files/test/" + filepath.Base(d.dst) + "/" + name, Checksum: checksum.Format("adler32", h)})
}

// submit submits the job as a submitter.
func (d *deployment) submit() {
	var reply api.SubmitReply
	if err := request(d.nc, api.UserSubject(api.SubjectJobSubmit, "submitter"), mustJSON(d.t, d.job), &reply); err != nil {
		d.t.Fatalf("submit: %v", err)
	}
	d.jobID, d.started = reply.JobID, time.Now()
}

// status asks the generator how the job goes, again while NATS fails over
// (a status read may time out then).
func (d *deployment) status() api.JobEvent {
	deadline := time.Now().Add(time.Minute)
	for {
		var ev api.JobEvent
		err := request(d.nc, api.UserSubject(api.SubjectJobStatus, "submitter"), []byte(d.jobID), &ev)
		if err == nil {
			return ev
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("status: %v", err)
		}
		d.t.Logf("status (asking again): %v", err)
		time.Sleep(time.Second)
	}
}

// waitFinal waits until n of the job's files are final.
func (d *deployment) waitFinal(n int) api.JobEvent {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		ev := d.status()
		if ev.Final() >= n || ev.Announced {
			return ev
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("%d of %d files final after 5 min, want %d", ev.Final(), ev.Total, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// finish waits for the end of the job and checks that every file is DONE
// and intact and that no slot is held.
func (d *deployment) finish() (took time.Duration, ov scheduler.Overview) {
	t := d.t
	ev := d.waitFinal(len(d.sums))
	for !ev.Announced {
		time.Sleep(200 * time.Millisecond)
		ev = d.status()
	}
	took = time.Since(d.started)
	if ev.State != api.JobFinished || ev.Done != len(d.sums) {
		t.Fatalf("job %s: %d done, %d failed, %d cancelled of %d", ev.State, ev.Done, ev.Failed, ev.Cancelled, len(d.sums))
	}
	d.checkFiles()
	// The overview is sampled every second: give it a few to catch up.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		_, port := d.leader()
		ov = overview(t, port)
		held := 0
		for _, st := range ov.States {
			held += st.Busy
		}
		if held == 0 {
			return took, ov
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d slots still busy 10 s after the job: %+v", held, ov.States)
		}
	}
}

func (d *deployment) kill(id string) {
	if out, err := exec.Command("docker", "kill", id).CombinedOutput(); err != nil {
		d.t.Fatalf("docker kill: %v\n%s", err, out)
	}
}

func TestComposeStackScalesLosesADelivererAndMovesEveryFileIntact(t *testing.T) {
	const files = 500
	d := deploy(t, files)
	d.submit()

	// Scale out while the job runs: its downloads are held meanwhile, so
	// that however long the containers take to start, the job is not over
	// before.
	d.waitFinal(files / 10)
	at1, done1 := time.Now(), d.status().Done
	d.hold(true)
	d.c.run("up", "-d", "--no-recreate", "--scale", "processor=2", "--scale", "delivery=3")
	if n := len(d.c.containers("delivery")); n != 3 {
		t.Fatalf("%d delivery containers after scaling to 3", n)
	}
	d.hold(false)
	rate1 := float64(done1) / at1.Sub(d.started).Seconds()

	// Kill a deliverer in the middle of its transfers, held while it is
	// picked.
	d.waitFinal(files * 4 / 10)
	d.hold(true)
	defer d.hold(false)
	var victim string
	for _, id := range d.c.containers("delivery") {
		if active(t, id) > 0 {
			victim = id
			break
		}
	}
	if victim == "" {
		t.Fatal("no delivery container has a transfer in hand to be killed in")
	}
	_, web := d.leader()
	running := busy(overview(t, web), dtr.Transfer)
	d.kill(victim)
	d.hold(false)
	t.Logf("killed delivery container %.12s with transfers in hand; %d transfers running in all", victim, running)

	// And the scheduler that leads, with transfers running.
	d.waitFinal(files * 6 / 10)
	d.killLeader()

	took, ov := d.finish()
	t.Logf("%d files DONE and intact in %s; %.0f files/s with 1 deliverer, %.0f files/s overall; %d lease expiries, %d retries",
		files, took.Round(time.Second), rate1, float64(files)/took.Seconds(), ov.Counts.LeaseExpiries, ov.Counts.Retries)
}

func TestComposeClusterGoesOnWhenANATSServerDies(t *testing.T) {
	const files = 200
	d := deploy(t, files, "compose.cluster.yaml")
	d.submit()
	d.waitFinal(files / 4)
	ids := d.c.containers("nats")
	if len(ids) != 1 {
		t.Fatalf("%d containers of service nats", len(ids))
	}
	d.kill(ids[0]) // the server every role named first
	ev := d.status()
	t.Logf("killed NATS server nats-1 with %d of %d files final", ev.Final(), files)
	// Then the server the leading scheduler is connected to, now, and
	// the leader itself: the standby takes over on the two left.
	d.waitFinal(files / 2)
	d.c.run("start", "nats") // nats-1 back after its kill: a cluster of three again
	d.c.healthy(2 * time.Minute)
	victim := d.leadersNATS()
	if victim != "" {
		d.c.run("stop", "-t", "1", victim)
		t.Logf("stopped %s, which the leader was connected to", victim)
	}
	killed, _ := d.killLeader()
	// Both back, as a supervisor would bring them, and the cluster whole
	// and current again before the rest of the test stops nats-1.
	if victim != "" {
		d.c.run("start", victim)
	}
	d.c.run("start", killed)
	d.c.healthy(2 * time.Minute)
	for _, svc := range []string{"nats", "nats-2", "nats-3"} {
		d.natsCurrent(svc, 2*time.Minute)
	}
	took, ov := d.finish()
	t.Logf("%d files DONE and intact in %s over a 3-server cluster that lost a server, then another with the leader; %d lease expiries, %d retries",
		files, took.Round(time.Second), ov.Counts.LeaseExpiries, ov.Counts.Retries)

	// The host's sluice CLI, given every server's host port, submits and
	// waits while nats-1 stays down (stopped, whatever its restart policy
	// did after the kill).
	d.c.run("stop", "-t", "1", "nats")
	if out, _ := exec.Command("docker", "inspect", "-f", "{{.State.Status}}", ids[0]).Output(); strings.TrimSpace(string(out)) == "running" {
		t.Fatalf("nats-1 still runs after compose stop")
	}
	if nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", d.ports.nats[0]), nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Fatal("nats-1's host port still answers")
	}
	d.newJob("dst-cli")
	for i := 0; i < 20; i++ {
		d.addHTTPFile(fmt.Sprintf("c%03d", i), 32<<10+i*31)
	}
	urls := d.ports.natsURLs("submitter", envOr("SLUICE_NATS_SUBMITTER_PASSWORD", "submitter-dev"))
	bin := sluiceCLI(t)
	start := time.Now()
	out := d.cli(t, bin, []string{"NATS_URL=" + urls, "SLUICE_AS_USER=submitter"}, "submit", "--wait", d.jobFile())
	if !strings.Contains(out, "submitted") {
		t.Fatalf("sluice submit --wait says:\n%s", out)
	}
	d.checkFiles()
	t.Logf("with nats-1 stopped, sluice submit --wait with NATS_URL=%s moved %d files in %s",
		redactedURLs(urls), len(d.sums), time.Since(start).Round(time.Second))
}

// natsCurrent waits until a NATS server of the cluster says that its
// JetStream is current: every stream and consumer it holds caught up.
func (d *deployment) natsCurrent(svc string, timeout time.Duration) {
	d.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ids := d.c.containers(svc)
		if len(ids) == 1 && exec.Command("docker", "exec", ids[0], "wget", "-q", "--spider", "http://127.0.0.1:8222/healthz").Run() == nil {
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("NATS server %s not current after %s", svc, timeout)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// leadersNATS returns the NATS service whose server the leading
// scheduler is connected to (from each server's connz), or "" if none
// says.
func (d *deployment) leadersNATS() string {
	d.t.Helper()
	leader, _ := d.leader()
	ids := d.c.containers(leader)
	if len(ids) != 1 {
		return ""
	}
	ip, err := exec.Command("docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", ids[0]).Output()
	if err != nil {
		return ""
	}
	for _, svc := range []string{"nats", "nats-2", "nats-3"} {
		for _, id := range d.c.containers(svc) {
			out, err := exec.Command("docker", "exec", id, "wget", "-qO-", "http://127.0.0.1:8222/connz?limit=4096").Output()
			if err != nil {
				continue
			}
			var connz struct {
				Connections []struct {
					IP   string `json:"ip"`
					Name string `json:"name"`
				} `json:"connections"`
			}
			if json.Unmarshal(out, &connz) != nil {
				continue
			}
			for _, c := range connz.Connections {
				if c.Name == "sluice-scheduler" && strings.Contains(" "+string(ip), " "+c.IP+" ") {
					return svc
				}
			}
		}
	}
	return ""
}

// newJob starts a new job of the test's HTTP files, its destinations in dst
// beside the first job's.
func (d *deployment) newJob(dst string) {
	d.dst = filepath.Join(filepath.Dir(d.dst), dst)
	if err := os.MkdirAll(d.dst, 0o777); err != nil {
		d.t.Fatal(err)
	}
	if err := os.Chmod(d.dst, 0o777); err != nil { // the containers run as nobody
		d.t.Fatal(err)
	}
	d.sums = map[string][32]byte{}
	d.job = &job.Job{Name: "compose-" + dst}
}

// jobFile writes the job to a file for the CLI.
func (d *deployment) jobFile() string {
	f := filepath.Join(d.t.TempDir(), "job.json")
	if err := os.WriteFile(f, mustJSON(d.t, d.job), 0o644); err != nil {
		d.t.Fatal(err)
	}
	return f
}

// sluiceCLI returns the sluice binary of this repository: the one
// build-image.sh built for the image, unless SLUICE_COMPOSE_NO_BUILD
// skipped that; then it is built here.
func sluiceCLI(t *testing.T) string {
	if os.Getenv("SLUICE_COMPOSE_NO_BUILD") == "" {
		return "build/sluice"
	}
	bin := filepath.Join(t.TempDir(), "sluice")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/sluice").CombinedOutput(); err != nil {
		t.Fatalf("go build ../cmd/sluice: %v\n%s", err, out)
	}
	return bin
}

// cli runs the sluice CLI bin on the host with env only (and an empty
// HOME: no nats context), and fails the test unless it succeeds within 3
// minutes.
func (d *deployment) cli(t *testing.T, bin string, env []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sluice %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// checkFiles checks every destination of the job, on the host, against
// its source.
func (d *deployment) checkFiles() {
	for name, want := range d.sums {
		b, err := os.ReadFile(filepath.Join(d.dst, name))
		if err != nil {
			d.t.Fatalf("destination %s: %v", name, err)
		}
		if sha256.Sum256(b) != want {
			d.t.Fatalf("destination %s differs from its source", name)
		}
	}
}

func redactedURLs(urls string) string {
	return regexp.MustCompile(`:[^:@/]+@`).ReplaceAllString(urls, ":xxxxx@")
}

// filesDeployment brings a project up with compose.files.yaml: the host
// directory SLUICE_FILES_DIR, made here, is /data/files in the containers,
// and processors and deliverers run as SLUICE_FILES_USER, the test's own
// uid and gid (as root: 4242, owning the directory, so that the results'
// owner shows whose they are). The job's sources are files made on the
// host in in/, its destinations out/ there.
func filesDeployment(t *testing.T, files int, env []string, upArgs ...string) (d *deployment, uid int) {
	dir := t.TempDir()
	host := filepath.Join(dir, "files")
	uid, gid := os.Getuid(), os.Getgid()
	if uid == 0 {
		uid, gid = 4242, 4242
	}
	d = &deployment{t: t, dst: filepath.Join(host, "out"), sums: map[string][32]byte{},
		job: &job.Job{Name: "compose-files", Owner: dtr.Identity{DN: "/CN=compose", FQANs: []string{"/atlas"}}}}
	if err := os.MkdirAll(filepath.Join(host, "in", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < files; i++ {
		// Sizes from empty to 1 MiB and more; one source in a subdirectory,
		// destinations in directories that do not exist yet.
		size := []int{0, 1, 4095, 64 << 10, 1<<20 + 17}[i%5] + i
		name := fmt.Sprintf("f%03d", i)
		src, dst := "in/"+name, "out/"+name
		if i == 1 {
			src = "in/sub/" + name
		}
		if i%2 == 0 {
			dst = "out/even/" + name
		}
		b := make([]byte, size)
		_, _ = rand.Read(b)
		if err := os.WriteFile(filepath.Join(host, src), b, 0o644); err != nil {
			t.Fatal(err)
		}
		d.sums[strings.TrimPrefix(dst, "out/")] = sha256.Sum256(b)
		d.job.Inputs = append(d.job.Inputs, job.File{Source: "file:///data/files/" + src, Destination: "file:///data/files/" + dst})
	}
	if os.Getuid() == 0 {
		err := filepath.Walk(host, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, uid, gid)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	d.c, d.ports = up(t, []string{"compose.files.yaml"}, append([]string{
		"SLUICE_FILES_DIR=" + host, fmt.Sprintf("SLUICE_FILES_USER=%d:%d", uid, gid),
	}, env...), upArgs...)
	d.connect()
	return d, uid
}

func TestComposeFilesOverrideTakesAJobsFilesFromTheHostAndLeavesItsResultsThere(t *testing.T) {
	needCompose(t, false)
	const files = 20
	d, uid := filesDeployment(t, files, nil)
	d.submit()
	took, _ := d.finish() // every destination read on the host, byte for byte
	for name := range d.sums {
		fi, err := os.Stat(filepath.Join(d.dst, name))
		if err != nil {
			t.Fatal(err)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != uid {
			t.Errorf("%s belongs to uid %d, want %d (SLUICE_FILES_USER)", name, st.Uid, uid)
		}
	}
	t.Logf("%d files from the host directory DONE and intact in it in %s, owned by uid %d", files, took.Round(time.Second), uid)
}

// TestComposeConfigs checks that compose takes every combination of the
// files and profiles, that the cluster publishes each NATS server on its
// own host port and that compose.files.yaml mounts SLUICE_FILES_DIR for
// SLUICE_FILES_USER, without starting anything.
func TestComposeConfigs(t *testing.T) {
	if os.Getenv("SLUICE_COMPOSE_TEST") != "1" {
		t.Skip("SKIPPED: the compose test runs with SLUICE_COMPOSE_TEST=1 and a Docker engine (.ci/run sets it when `docker info` works)")
	}
	dir := t.TempDir()
	for _, files := range [][]string{nil, {"compose.files.yaml"}, {"compose.cluster.yaml"}, {"compose.files.yaml", "compose.cluster.yaml"}} {
		c := newCompose(t, "sluiceconfig", append([]string{"compose.yaml"}, files...), []string{
			"COMPOSE_PROFILES=tracing", "JAEGER_IMAGE=", "NATS_PORT=14222", "NATS_2_PORT=14223", "NATS_3_PORT=14224",
			"SLUICE_FILES_DIR=" + dir, "SLUICE_FILES_USER=1234:5678"})
		out := c.run("config")
		want := []string{"jaeger", "sluice-jaeger:dev", "14222"}
		if len(files) > 0 && files[0] == "compose.files.yaml" {
			want = append(want, dir, "/data/files", "1234:5678")
		}
		if files != nil && files[len(files)-1] == "compose.cluster.yaml" {
			want = append(want, "nats-2", "14223", "nats-3", "14224")
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("compose.yaml %v: config has no %q:\n%s", files, w, out)
			}
		}
	}
	// Relative to deploy/ by default: deploy/files.
	c := newCompose(t, "sluiceconfig", []string{"compose.yaml", "compose.files.yaml"}, []string{"SLUICE_FILES_DIR="})
	if wd, _ := os.Getwd(); !strings.Contains(c.run("config"), filepath.Join(wd, "files")) {
		t.Errorf("compose.files.yaml does not mount deploy/files by default")
	}
}

func TestComposeTracingProfileShowsEachDTRAcrossEveryRoleInOneJaegerTrace(t *testing.T) {
	needCompose(t, true)
	const files = 5
	d, _ := filesDeployment(t, files, []string{"COMPOSE_PROFILES=tracing", "OTEL_EXPORTER_OTLP_ENDPOINT=http://jaeger:4318"})
	query := fmt.Sprintf("http://127.0.0.1:%d/api", d.ports.jaeger)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		resp, err := http.Get(query + "/services")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
			err = fmt.Errorf("%s", resp.Status)
		}
		if time.Now().After(deadline) {
			t.Fatalf("Jaeger's query API: %v", err)
		}
	}
	d.submit()
	d.finish()

	// Each DTR is one trace from its submission (generator) through the
	// scheduler's grants to the processors' and deliverers' stages; the
	// roles send their spans in batches, every 5 s.
	roles := []string{"sluice-generator", "sluice-scheduler", "sluice-processor", "sluice-delivery"}
	var complete int
	var seen []string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(2 * time.Second) {
		complete, seen = 0, nil
		for _, tr := range jaegerTraces(t, query, "sluice-delivery") {
			services := map[string]bool{}
			for _, sp := range tr.Spans {
				services[tr.Processes[sp.ProcessID].ServiceName] = true
			}
			all := true
			for _, r := range roles {
				all = all && services[r]
			}
			if all {
				complete++
			}
			seen = append(seen, fmt.Sprintf("%.8s: %d spans of %v", tr.TraceID, len(tr.Spans), keys(services)))
		}
		if complete >= files {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d traces in Jaeger hold spans of %v, want one per DTR (%d):\n%s", complete, roles, files, strings.Join(seen, "\n"))
		}
	}
	t.Logf("Jaeger holds %d traces with spans of %v; e.g. %s", complete, roles, seen[0])
}

type jaegerTrace struct {
	TraceID string `json:"traceID"`
	Spans   []struct {
		ProcessID     string `json:"processID"`
		OperationName string `json:"operationName"`
	} `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

// jaegerTraces reads the traces of the last hour that have spans of
// service from Jaeger's query API.
func jaegerTraces(t *testing.T, query, service string) []jaegerTrace {
	resp, err := http.Get(query + "/traces?lookback=1h&limit=1000&service=" + service)
	if err != nil {
		t.Fatalf("Jaeger's query API: %v", err)
	}
	defer resp.Body.Close()
	var out struct {
		Data []jaegerTrace `json:"data"`
	}
	if resp.StatusCode == http.StatusNotFound { // no span of service yet
		return nil
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		t.Fatalf("Jaeger's query API: %s: %s", resp.Status, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("Jaeger's traces: %v", err)
	}
	return out.Data
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// active asks a delivery container's own /metrics how many transfers it
// has in hand.
func active(t *testing.T, id string) int {
	out, err := exec.Command("docker", "exec", id, "/sluice", "healthcheck", "-url", "http://127.0.0.1:8080/metrics").Output()
	if err != nil {
		t.Logf("metrics of %.12s: %v", id, err)
		return 0
	}
	m := regexp.MustCompile(`(?m)^sluice_worker_active\{[^}]*stage="delivery"[^}]*\} (\d+)`).FindSubmatch(out)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

func overview(t *testing.T, port int) scheduler.Overview {
	t.Helper()
	ov, err := tryOverview(port)
	if err != nil {
		t.Fatalf("web page of the scheduler: %v", err)
	}
	return ov
}

func tryOverview(port int) (scheduler.Overview, error) {
	var ov scheduler.Overview
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/api/overview", port))
	if err != nil {
		return ov, err
	}
	defer resp.Body.Close()
	return ov, json.NewDecoder(resp.Body).Decode(&ov)
}

// leader returns the scheduler service that leads, as its web page says,
// and the host port of that page.
func (d *deployment) leader() (service string, web int) {
	d.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, s := range []struct {
			name string
			port int
		}{{"scheduler", d.ports.web}, {"scheduler-2", d.ports.web2}} {
			if ov, err := tryOverview(s.port); err == nil && ov.Scheduler.Role == "leader" {
				return s.name, s.port
			}
		}
		if time.Now().After(deadline) {
			d.t.Fatal("no scheduler's web page says it leads")
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// killLeader kills the scheduler container that leads and waits for the
// other to lead; it returns the services, the killed one first.
func (d *deployment) killLeader() (killed, leads string) {
	d.t.Helper()
	killed, _ = d.leader()
	ids := d.c.containers(killed)
	if len(ids) != 1 {
		d.t.Fatalf("%d containers of service %s", len(ids), killed)
	}
	d.kill(ids[0])
	start := time.Now()
	for {
		leads, _ = d.leader()
		if leads != killed {
			d.t.Logf("killed the leader %s; %s leads %s later", killed, leads, time.Since(start).Round(100*time.Millisecond))
			return killed, leads
		}
		if time.Since(start) > time.Minute {
			d.t.Fatalf("%s still leads a minute after its container was killed", killed)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func busy(ov scheduler.Overview, s dtr.State) int {
	for _, st := range ov.States {
		if st.State == s {
			return st.Busy
		}
	}
	return 0
}

func request(nc *nats.Conn, subject string, data []byte, v any) error {
	var reply *nats.Msg
	var err error
	for range 100 { // the API answers once its service has started
		reply, err = nc.Request(subject, data, 10*time.Second)
		if err != nats.ErrNoResponders {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	if e := reply.Header.Get(micro.ErrorHeader); e != "" {
		return fmt.Errorf("%s", e)
	}
	return json.NewDecoder(io.LimitReader(bytes.NewReader(reply.Data), 1<<26)).Decode(v)
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
