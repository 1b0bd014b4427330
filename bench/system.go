package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
	"github.com/sluice-dtr/sluice/services/scheduler"
)

// system is a Sluice under measurement: an embedded NATS server and its
// roles, in this process or as child processes.
type system struct {
	dir   string
	ns    *server.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	web   string   // the scheduler's HTTP base URL, if it serves one
	pids  []int    // of the child processes
	roles []string // of each child process, as pids
	stops []func()
	// ended is when the event of the last job run ended came, before it
	// was read.
	ended time.Time
}

// process is one set of roles run together, in this process (a app.Run)
// or as a child process of the sluice binary.
type process struct {
	roles []string
	// change adjusts the configuration of these roles.
	change func(*app.Config)
}

// start runs an embedded server and the processes. With exe set, each
// process is a child running that binary with env; otherwise a app.Run
// in this process with base.
func start(ctx context.Context, dir string, base app.Config, exe string, env []string, procs ...process) (*system, error) {
	ns, err := bus.Embedded(filepath.Join(dir, "jetstream"), 0)
	if err != nil {
		return nil, err
	}
	s := &system{dir: dir, ns: ns}
	s.stops = append(s.stops, ns.Shutdown)
	if s.nc, err = nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1)); err != nil {
		s.stop()
		return nil, fmt.Errorf("bench: %w", err)
	}
	s.stops = append(s.stops, s.nc.Close)
	s.js, _ = jetstream.New(s.nc)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, p := range procs {
		if exe != "" {
			for _, role := range p.roles {
				cmd := exec.CommandContext(ctx, exe, role)
				cmd.Env = append(append(os.Environ(), env...), "NATS_URL="+ns.ClientURL(), "SLUICE_HTTP_ADDR=127.0.0.1:0", "SLUICE_LOG_LEVEL=error",
					"SLUICE_ALLOW_NETWORKS=127.0.0.0/8") // the storage servers are on loopback
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					s.stop()
					return nil, fmt.Errorf("bench: start %s %s: %w", exe, role, err)
				}
				s.pids = append(s.pids, cmd.Process.Pid)
				s.roles = append(s.roles, role)
				s.stops = append(s.stops, func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			}
			continue
		}
		cfg := base
		cfg.NATSURL = ns.ClientURL()
		if p.change != nil {
			p.change(&cfg)
		}
		for _, r := range p.roles {
			if r == "scheduler" && s.web == "" {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					s.stop()
					return nil, fmt.Errorf("bench: %w", err)
				}
				cfg.HTTP = ln
				s.web = "http://" + ln.Addr().String()
			}
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = app.Run(rctx, cfg, p.roles, log)
		}()
		s.stops = append(s.stops, func() { cancel(); <-done })
	}
	var roles []string
	for _, p := range procs {
		roles = append(roles, p.roles...)
	}
	if err := s.ready(ctx, roles); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// ready waits until every role started answers: the scheduler and the
// generator their services' pings, each worker stage with a pull waiting
// on its grants. Nothing is measured before, so that no figure holds a
// process's start (or a request asked again after "no responders").
func (s *system) ready(ctx context.Context, roles []string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var checks []func() bool
	ping := func(service string) func() bool {
		return func() bool {
			_, err := s.nc.Request("$SRV.PING."+service, nil, time.Second)
			return err == nil
		}
	}
	pulling := func(stage dtr.Stage) func() bool {
		return func() bool {
			c, err := s.js.Consumer(ctx, bus.StreamGrants, string(stage))
			return err == nil && c.CachedInfo().NumWaiting > 0
		}
	}
	for _, r := range roles {
		switch r {
		case "scheduler":
			checks = append(checks, ping("sluice-scheduler"))
		case "generator":
			checks = append(checks, ping("sluice-generator"))
		case "processor":
			checks = append(checks, pulling(dtr.StagePre), pulling(dtr.StagePost))
		case "delivery":
			checks = append(checks, pulling(dtr.StageDelivery))
		}
	}
	for _, ok := range checks {
		for !ok() {
			select {
			case <-ctx.Done():
				return fmt.Errorf("bench: the roles %v did not all start: %w", roles, ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

// childCPU returns the CPU time (user and system) each child process has
// used so far, by role, read from /proc; nil where there is no /proc.
func (s *system) childCPU() map[string]time.Duration {
	out := map[string]time.Duration{}
	for i, pid := range s.pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil
		}
		// Fields after the command name, which is in parentheses: utime
		// and stime are the 12th and 13th (proc(5)), in clock ticks of
		// 1/100 s on Linux.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			return nil
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		k, _ := strconv.ParseInt(f[12], 10, 64)
		out[s.roles[i]] += time.Duration(u+k) * 10 * time.Millisecond
	}
	return out
}

// stop stops everything, the server last.
func (s *system) stop() {
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
}

// request calls a Sluice API endpoint, asking again while its service
// starts.
func (s *system) request(ctx context.Context, subject string, data []byte, v any) error {
	for {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		reply, err := s.nc.RequestWithContext(rctx, subject, data)
		cancel()
		if errors.Is(err, nats.ErrNoResponders) && ctx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: %w", subject, err)
		}
		if e := reply.Header.Get(micro.ErrorHeader); e != "" {
			return fmt.Errorf("%s: %s", subject, e)
		}
		return json.Unmarshal(reply.Data, v)
	}
}

// run submits a job and waits for the event of its end (polling the job's
// status would load the generator with reading every file's record).
func (s *system) run(ctx context.Context, j *job.Job) (api.JobEvent, error) {
	b, err := json.Marshal(j)
	if err != nil {
		return api.JobEvent{}, err
	}
	ends := make(chan *nats.Msg, 64)
	sub, err := s.nc.ChanSubscribe("sluice.event.job.>", ends)
	if err != nil {
		return api.JobEvent{}, fmt.Errorf("bench: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	var r api.SubmitReply
	if err := s.request(ctx, api.SubjectJobSubmit, b, &r); err != nil {
		return api.JobEvent{}, err
	}
	for {
		select {
		case m := <-ends:
			arrived := time.Now()
			ce, err := codec.Decode(ctx, m)
			if err != nil || ce.Subject() != r.JobID {
				continue
			}
			s.ended = arrived
			var ev api.JobEvent
			// Its per-file statistics run to megabytes: read fast.
			if err := codec.DecodeJSON(ce.Data(), &ev); err != nil {
				return ev, fmt.Errorf("job %s end: %w", r.JobID, err)
			}
			return ev, nil
		case <-ctx.Done():
			return api.JobEvent{}, fmt.Errorf("job %s: %w", r.JobID, ctx.Err())
		}
	}
}

// overview reads the scheduler's web page data.
func (s *system) overview() (scheduler.Overview, error) {
	var ov scheduler.Overview
	resp, err := http.Get(s.web + "/api/overview")
	if err != nil {
		return ov, fmt.Errorf("bench: %w", err)
	}
	defer resp.Body.Close()
	return ov, json.NewDecoder(resp.Body).Decode(&ov)
}

// files writes n files of size bytes under dir/in/prefix and returns a job
// copying them to dir/out/prefix.
func files(dir, prefix string, n, size int, source func(name string) string) (*job.Job, error) {
	j := &job.Job{Name: prefix}
	b := make([]byte, size)
	for i := 0; i < n; i++ {
		name := prefix + "-" + strconv.Itoa(i)
		src := filepath.Join(dir, "in", name)
		for k := range b {
			b[k] = byte(i + k)
		}
		if err := os.MkdirAll(filepath.Dir(src), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(src, b, 0o644); err != nil {
			return nil, err
		}
		from := "file://" + src
		if source != nil {
			from = source(name)
		}
		j.Inputs = append(j.Inputs, job.File{Source: from, Destination: "file://" + filepath.Join(dir, "out", name)})
	}
	return j, nil
}

// slowSource serves the files under dir/in over HTTP, each GET delay late:
// a transfer of a known length.
func slowSource(dir string, delay time.Duration) (base string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	fs := http.FileServer(http.Dir(filepath.Join(dir, "in")))
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			time.Sleep(delay)
		}
		fs.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}
