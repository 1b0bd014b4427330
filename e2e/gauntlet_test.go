package e2e

// The fault gauntlet: faults that a finished file must survive, each
// tried against the roles as separate processes of the real binary on a
// real (embedded) NATS server, with destinations on the file system, an
// HTTP store, a WebDAV server, an S3 server and an xrootd server. After
// every stale process has resumed and the system has settled, each
// checks that every destination is present and byte-exact, that every
// DTR is final once, and that no temporary file is left.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/nats-io/nats-server/v2/server"
	"go-hep.org/x/hep/xrootd"
	"golang.org/x/net/webdav"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/httpstore"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// gauntletLease is the lease of the gauntlet's roles: short, so that a
// frozen worker loses its grants within seconds.
const gauntletLease = 3 * time.Second

// gauntlet is a Sluice of separate processes on an embedded NATS server
// that can be stopped and started again on the same port and store.
type gauntlet struct {
	*cluster
	sys   *system
	store string
	port  int
	ns    atomic.Pointer[server.Server]
}

func newGauntlet(t *testing.T, env ...string) *gauntlet {
	t.Helper()
	bin := buildBinary(t)
	dir := t.TempDir()
	g := &gauntlet{store: filepath.Join(dir, "jetstream")}
	ns, err := bus.Embedded(g.store, 0)
	if err != nil {
		t.Fatal(err)
	}
	g.ns.Store(ns)
	t.Cleanup(func() { g.ns.Load().Shutdown() })
	g.port = ns.Addr().(*net.TCPAddr).Port
	g.cluster = &cluster{t: t, bin: bin, dir: dir, procs: map[string]*process{}, env: append([]string{
		"NATS_URL=" + ns.ClientURL(), "SLUICE_LOG_LEVEL=info", "SLUICE_LOG_FORMAT=text", "SLUICE_HTTP_ADDR=127.0.0.1:0",
		"SLUICE_ALLOW_NETWORKS=127.0.0.0/8", // the storage servers are on loopback
		"SLUICE_LEASE=" + gauntletLease.String(), "SLUICE_RETRY_BASE=100ms", "SLUICE_CHECKPOINT_EVERY=100ms",
		"SLUICE_S3_CREDENTIALS=", "AWS_ACCESS_KEY_ID=sluice", "AWS_SECRET_ACCESS_KEY=sluice-secret",
	}, env...)}
	t.Cleanup(g.stopAll)
	g.sys = &system{t: t, ns: ns, dir: dir}
	if g.sys.nc, err = app.Connect(ns.ClientURL(), "gauntlet"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.sys.nc.Close() })
	return g
}

// natsDown stops the NATS server; natsUp starts it again on the same port
// and store.
func (g *gauntlet) natsDown() { g.ns.Load().Shutdown() }

func (g *gauntlet) natsUp() {
	g.t.Helper()
	ns, err := bus.Embedded(g.store, g.port)
	if err != nil {
		g.t.Fatal(err)
	}
	g.ns.Store(ns)
}

// settled checks that no role exited by itself and that the scheduler
// holds no slot.
func (g *gauntlet) settled() {
	g.t.Helper()
	g.mu.Lock()
	exits := g.exits
	g.mu.Unlock()
	if len(exits) > 0 {
		g.t.Errorf("roles exited by themselves: %v", exits)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		busy := 0
		sh := g.sys.shares()
		for _, st := range sh.Shares {
			busy += st.Running
		}
		if busy == 0 {
			// The stuck-DTR detector found nothing stuck either.
			if len(sh.Stuck) > 0 {
				g.t.Errorf("stuck DTRs once the system settled: %+v", sh.Stuck)
			}
			return
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("%d slots still held once the system settled", busy)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// slowSource serves the files under dir over HTTP at rate bytes a second,
// with their Content-Length, and counts the GETs begun per path.
func slowSource(t *testing.T, dir string, rate int) (base string, gets func(path string) int) {
	var mu sync.Mutex
	n := map[string]int{}
	base = httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(r.URL.Path)))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		if r.Method == http.MethodHead {
			return
		}
		mu.Lock()
		n[r.URL.Path]++
		mu.Unlock()
		chunk := max(rate/20, 1)
		for len(b) > 0 {
			k := min(chunk, len(b))
			if _, err := w.Write(b[:k]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			b = b[k:]
			select {
			case <-time.After(50 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
	}))
	return base, func(path string) int {
		mu.Lock()
		defer mu.Unlock()
		return n[path]
	}
}

// cutServer serves h on loopback, cutting a connection on which nothing
// arrives for a second, as production servers do: a client frozen in the
// middle of a PUT finds its request failed when it resumes.
func cutServer(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(idleCutListener{ln}) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// idleCutListener's connections fail a read that waits more than a
// second.
type idleCutListener struct{ net.Listener }

func (l idleCutListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return idleCutConn{c}, nil
}

type idleCutConn struct{ net.Conn }

func (c idleCutConn) Read(p []byte) (int, error) {
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	return c.Conn.Read(p)
}

// destinations are one store of each protocol, each with a local
// directory that shows what it holds (S3: a function).
type destinations struct {
	fileDir, httpDir, davDir, xrdDir string
	httpBase, davBase, xrdBase       string
	s3Base                           string
	s3                               *s3mem.Backend
}

func newDestinations(t *testing.T) *destinations {
	t.Helper()
	d := &destinations{fileDir: t.TempDir(), httpDir: t.TempDir(), davDir: t.TempDir(), xrdDir: t.TempDir()}
	d.httpBase = "http://" + cutServer(t, httpstore.Handler(d.httpDir))
	d.davBase = "dav://" + cutServer(t, &webdav.Handler{FileSystem: webdav.Dir(d.davDir), LockSystem: webdav.NewMemLS()})
	d.s3 = s3mem.New()
	if err := d.s3.CreateBucket("out"); err != nil {
		t.Fatal(err)
	}
	d.s3Base = "s3://" + cutServer(t, gofakes3.New(d.s3).Server()) + "/out"
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	xs := xrootd.NewServer(xrootd.NewFSHandler(d.xrdDir), nil)
	go func() { _ = xs.Serve(l) }()
	t.Cleanup(func() { _ = xs.Shutdown(context.Background()) })
	d.xrdBase = "root://" + l.Addr().String() + "/"
	return d
}

// urls returns the URL of name on each store, by protocol.
func (d *destinations) urls(name string) map[string]string {
	return map[string]string{
		"file": fileURL(filepath.Join(d.fileDir, name)), "http": d.httpBase + "/" + name,
		"webdav": d.davBase + "/" + name, "s3": d.s3Base + "/" + name, "xrootd": d.xrdBase + "/" + name,
	}
}

// read returns what the store of protocol holds under name.
func (d *destinations) read(protocol, name string) ([]byte, error) {
	switch protocol {
	case "s3":
		obj, err := d.s3.GetObject("out", name, nil)
		if err != nil {
			return nil, err
		}
		defer obj.Contents.Close()
		return io.ReadAll(obj.Contents)
	case "file":
		return os.ReadFile(filepath.Join(d.fileDir, name))
	case "http":
		return os.ReadFile(filepath.Join(d.httpDir, name))
	case "webdav":
		return os.ReadFile(filepath.Join(d.davDir, name))
	}
	return os.ReadFile(filepath.Join(d.xrdDir, name))
}

// leftovers lists the temporary names left in the stores' directories.
func (d *destinations) leftovers() []string {
	var left []string
	for _, dir := range []string{d.fileDir, d.httpDir, d.davDir, d.xrdDir} {
		_ = filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
			if err == nil && (strings.Contains(e.Name(), ".sluice-") || strings.HasSuffix(e.Name(), ".upload")) {
				left = append(left, p)
			}
			return nil
		})
	}
	return left
}

// checkFinished checks that the job finished with every file DONE once
// and that every destination holds its source's bytes.
func checkFinished(t *testing.T, ev api.JobEvent, want map[string][]byte, d *destinations) {
	t.Helper()
	if ev.State != "finished" || ev.Done != len(want) {
		t.Errorf("job %s with %d of %d DONE: %+v", ev.State, ev.Done, len(want), ev.Files)
	}
	for key, data := range want {
		protocol, name, _ := strings.Cut(key, " ")
		got, err := d.read(protocol, name)
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s destination %s: %d bytes, %v; want the source's %d", protocol, name, len(got), err, len(data))
		}
	}
	if left := d.leftovers(); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestAFrozenDelivererThatResumesDeletesNoFinishedFile freezes (SIGSTOP)
// the deliverer in the middle of its transfers, to a destination of every
// protocol, past its lease; another deliverer takes the retries over and
// the job finishes; then the frozen one resumes (SIGCONT), finds its
// requests cut by the servers, and must not touch the finished files.
func TestAFrozenDelivererThatResumesDeletesNoFinishedFile(t *testing.T) {
	g := newGauntlet(t)
	srcDir := t.TempDir()
	src, gets := slowSource(t, srcDir, 256<<10)
	dst := newDestinations(t)
	j := &job.Job{Name: "frozen-deliverer"}
	want := map[string][]byte{}
	for protocol, u := range dst.urls("out") {
		name := "in-" + protocol
		writeFile(t, filepath.Join(srcDir, name), 384<<10, len(want))
		data, _ := os.ReadFile(filepath.Join(srcDir, name))
		want[protocol+" out"] = data
		j.Outputs = append(j.Outputs, job.File{Source: src + "/" + name, Destination: u})
	}
	for _, r := range []string{"scheduler", "generator", "processor"} {
		g.start(r)
	}
	g.startAs("delivery-frozen", "delivery")
	r := g.sys.submit(j)
	// Every transfer running in the first deliverer, some bytes moved.
	waitFor(t, 30*time.Second, "every transfer to start", func() bool {
		for protocol := range dst.urls("out") {
			if gets("/in-"+protocol) == 0 {
				return false
			}
		}
		return true
	})
	time.Sleep(400 * time.Millisecond)
	g.signal("delivery-frozen", syscall.SIGSTOP)
	defer g.signal("delivery-frozen", syscall.SIGCONT)
	g.startAs("delivery-2", "delivery")
	ev := g.sys.wait(r.JobID, 2*time.Minute)
	// Past the servers' read timeout, then the frozen deliverer resumes.
	time.Sleep(time.Second)
	g.signal("delivery-frozen", syscall.SIGCONT)
	time.Sleep(3 * time.Second)
	checkFinished(t, ev, want, dst)
	g.settled()
}

// TestAFrozenPreCleanThatResumesDeletesNoFinishedFile freezes a processor
// while it pre-cleans a destination that exists (overwrite set); another
// processor takes the DTR over and it finishes; then the frozen one
// resumes with the answer of its HEAD in hand and must not delete the
// finished file.
func TestAFrozenPreCleanThatResumesDeletesNoFinishedFile(t *testing.T) {
	g := newGauntlet(t)
	srcDir, dstDir := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(srcDir, "new"), 64<<10, 1)
	data, _ := os.ReadFile(filepath.Join(srcDir, "new"))
	writeFile(t, filepath.Join(dstDir, "out"), 1000, 2) // the old file, to be replaced
	var heads atomic.Int64
	held := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(held) }) }
	t.Cleanup(release)
	store := httpstore.Handler(dstDir)
	dstBase := httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead && heads.Add(1) == 1 {
			select { // the first pre-clean waits here
			case <-held:
			case <-r.Context().Done():
				return
			}
		}
		store.ServeHTTP(w, r)
	}))
	j := &job.Job{Name: "frozen-preclean", Outputs: []job.File{{Source: fileURL(filepath.Join(srcDir, "new")),
		Destination: dstBase + "/out", Overwrite: true}}}
	for _, r := range []string{"scheduler", "generator", "delivery"} {
		g.start(r)
	}
	g.startAs("processor-frozen", "processor")
	r := g.sys.submit(j)
	waitFor(t, 30*time.Second, "the pre-clean's HEAD", func() bool { return heads.Load() >= 1 })
	g.signal("processor-frozen", syscall.SIGSTOP)
	defer g.signal("processor-frozen", syscall.SIGCONT)
	release() // its answer waits in the frozen process's socket
	g.startAs("processor-2", "processor")
	ev := g.sys.wait(r.JobID, time.Minute)
	g.signal("processor-frozen", syscall.SIGCONT)
	time.Sleep(3 * time.Second)
	if ev.State != "finished" {
		t.Fatalf("job %s: %+v", ev.State, ev.Files)
	}
	if got, err := os.ReadFile(filepath.Join(dstDir, "out")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the finished file: %d bytes, %v; want the new %d", len(got), err, len(data))
	}
	g.settled()
}

// TestAFrozenStagingThatResumesSpoilsNoLaterAttempt freezes a processor
// while it stages a source into the staging area; another processor
// stages it again, and while it does so the frozen one resumes: the
// retry's copy must not be renamed or removed under it.
func TestAFrozenStagingThatResumesSpoilsNoLaterAttempt(t *testing.T) {
	g := newGauntlet(t, "SLUICE_PROCESSOR_STAGE_DIR="+filepath.Join(t.TempDir(), "stage"))
	srcDir, out := t.TempDir(), t.TempDir()
	src, gets := slowSource(t, srcDir, 256<<10)
	writeFile(t, filepath.Join(srcDir, "big"), 768<<10, 3)
	data, _ := os.ReadFile(filepath.Join(srcDir, "big"))
	j := &job.Job{Name: "frozen-stage", Inputs: []job.File{{Source: src + "/big", Destination: fileURL(filepath.Join(out, "big")),
		Stage: true}}}
	for _, r := range []string{"scheduler", "generator", "delivery"} {
		g.start(r)
	}
	g.startAs("processor-frozen", "processor")
	r := g.sys.submit(j)
	waitFor(t, 30*time.Second, "the first staging", func() bool { return gets("/big") >= 1 })
	time.Sleep(500 * time.Millisecond)
	g.signal("processor-frozen", syscall.SIGSTOP)
	defer g.signal("processor-frozen", syscall.SIGCONT)
	g.startAs("processor-2", "processor")
	waitFor(t, 30*time.Second, "the second staging", func() bool { return gets("/big") >= 2 })
	time.Sleep(500 * time.Millisecond)
	g.signal("processor-frozen", syscall.SIGCONT) // while the retry stages
	ev := g.sys.wait(r.JobID, time.Minute)
	if ev.State != "finished" {
		t.Fatalf("job %s: %+v", ev.State, ev.Files)
	}
	if got, err := os.ReadFile(filepath.Join(out, "big")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the staged file: %d bytes, %v", len(got), err)
	}
	g.settled()
}

// TestWorkFinishedWhileNATSIsDownIsKept stops NATS for three leases while
// transfers run: those that finish while it is down are reported when it
// is back and kept, none transferred again.
func TestWorkFinishedWhileNATSIsDownIsKept(t *testing.T) {
	g := newGauntlet(t)
	srcDir, dstDir := t.TempDir(), t.TempDir()
	src, gets := slowSource(t, srcDir, 512<<10)
	var mu sync.Mutex
	puts := map[string][]time.Time{} // when each PUT of a path completed
	store := httpstore.Handler(dstDir)
	dstBase := httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		store.ServeHTTP(w, r)
		if r.Method == http.MethodPut {
			mu.Lock()
			puts[r.URL.Path] = append(puts[r.URL.Path], time.Now())
			mu.Unlock()
		}
	}))
	const files = 8
	j := &job.Job{Name: "outage"}
	want := map[string][]byte{}
	for i := range files {
		name := fmt.Sprintf("f%d", i)
		writeFile(t, filepath.Join(srcDir, name), 256<<10, i)
		want[name], _ = os.ReadFile(filepath.Join(srcDir, name))
		j.Outputs = append(j.Outputs, job.File{Source: src + "/" + name, Destination: dstBase + "/" + name})
	}
	for _, r := range []string{"scheduler", "generator", "processor", "delivery"} {
		g.start(r)
	}
	r := g.sys.submit(j)
	waitFor(t, 30*time.Second, "every transfer to start", func() bool {
		for i := range files {
			if gets(fmt.Sprintf("/f%d", i)) == 0 {
				return false
			}
		}
		return true
	})
	down := time.Now()
	g.natsDown()
	time.Sleep(3 * gauntletLease)
	up := time.Now()
	g.natsUp()
	ev := g.sys.wait(r.JobID, 2*time.Minute)
	if ev.State != "finished" || ev.Done != files {
		t.Fatalf("job %s with %d of %d DONE", ev.State, ev.Done, files)
	}
	during := 0
	mu.Lock()
	defer mu.Unlock()
	for name, data := range want {
		ts := puts["/"+name]
		if len(ts) > 0 && ts[0].After(down) && ts[0].Before(up) {
			during++
			if len(ts) > 1 {
				t.Errorf("%s was finished while NATS was down and transferred again (%d PUTs)", name, len(ts))
			}
		}
		if got, err := os.ReadFile(filepath.Join(dstDir, name)); err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: %d bytes, %v", name, len(got), err)
		}
	}
	if during == 0 {
		t.Fatalf("no transfer finished while NATS was down: the test says nothing (PUTs %v, down %s–%s)", puts, down, up)
	}
	t.Logf("%d of %d transfers finished while NATS was down for %s", during, files, up.Sub(down).Round(time.Millisecond))
	g.settled()
}

// waitFor polls cond every 20 ms until it holds, failing the test after
// timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHostileSourcesFailAtOnceAndHoldNoSlot gives the roles sources that
// never end, lie about their size or are no files: each DTR fails with
// the reason, soon, without a slot held or a partial file left.
func TestHostileSourcesFailAtOnceAndHoldNoSlot(t *testing.T) {
	g := newGauntlet(t, "SLUICE_DELIVERY_MAX_FILE_SIZE=1048576", "SLUICE_MAXTRANSFERTRIES=2")
	dir, out := t.TempDir(), t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	// An HTTP source that says it has 100,000 bytes and sends another
	// number, closing the connection to end the body, or sends for ever.
	src := httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/endless" {
			w.Header().Set("Content-Length", "100000")
		}
		if r.Method == http.MethodHead {
			return
		}
		w.Header().Del("Content-Length") // close-delimited
		w.Header().Set("Connection", "close")
		chunk := bytes.Repeat([]byte("x"), 10000)
		n := map[string]int{"/short": 5, "/long": 20, "/endless": 1 << 30}[r.URL.Path]
		for range n {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	cases := []struct {
		name, source string
		kind         string
		says         string
	}{
		{"a named pipe", fileURL(fifo), "LOCAL_FILE", "named pipe"},
		{"a device that never ends", "file:///dev/zero", "LOCAL_FILE", "device"},
		{"an endless body of unknown size", src + "/endless", "PERMANENT_REMOTE", "maximum file size"},
		{"a body shorter than its size", src + "/short", "TEMPORARY_REMOTE", "size changed"},
		{"a body longer than its size", src + "/long", "TEMPORARY_REMOTE", "size changed"},
	}
	for _, r := range []string{"scheduler", "generator", "processor", "delivery"} {
		g.start(r)
	}
	jobs := make([]string, len(cases))
	for i, c := range cases {
		j := &job.Job{Name: fmt.Sprint("hostile-", i), Inputs: []job.File{{Source: c.source, Destination: fileURL(filepath.Join(out, fmt.Sprint(i)))}}}
		jobs[i] = g.sys.submit(j).JobID
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ev := g.sys.wait(jobs[i], time.Minute)
			if ev.State != "failed" || len(ev.Files) != 1 || ev.Files[0].Error == nil {
				t.Fatalf("job %s: %+v", ev.State, ev.Files)
			}
			f := ev.Files[0]
			if string(f.Error.Kind) != c.kind || !strings.Contains(f.Error.Text, c.says) {
				t.Fatalf("failed %s (%s), want %s saying %q", f.Error.Kind, f.Error.Text, c.kind, c.says)
			}
		})
	}
	if entries, _ := os.ReadDir(out); len(entries) > 0 {
		t.Errorf("files left in the destination directory: %v", entries)
	}
	g.settled()
}
