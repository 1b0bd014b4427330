package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/httpstore"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// demoCommand runs the demo.
func demoCommand(cfg *Config) *cobra.Command {
	var o demoOptions
	c := &cobra.Command{
		Use:   "demo",
		Short: "Run a demo job of real files on the embedded default",
		Long: "Run every service on an embedded NATS server, make real files, move them in two jobs of two\n" +
			"VOs through a local HTTP server and the file system, print the share table while they run,\n" +
			"and check every byte.",
		Args: exactArgs(0, "demo takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return traced(cmd.Context(), "demo", func() error { return demo(cmd.Context(), cfg, o, cmd.OutOrStdout()) })
		},
	}
	fs := c.Flags()
	fs.IntVar(&o.files, "files", 200, "files to move, split between the two jobs")
	fs.StringVar(&o.dir, "dir", "", "work directory for the demo's files (default: a new temporary directory, removed at the end)")
	fs.BoolVar(&o.keep, "keep", false, "keep the temporary work directory")
	fs.StringVar(&cfg.Store, "store", cfg.Store, "JetStream store directory (env SLUICE_STORE; default the user's data dir/sluice)")
	return c
}

type demoOptions struct {
	files int
	dir   string
	keep  bool
}

// demo runs every service on the embedded server, makes real files, moves
// them in two jobs of two VOs through a local HTTP server and the file
// system, prints the share table while they run, and checks every byte.
func demo(ctx context.Context, cfg *Config, o demoOptions, stdout io.Writer) error {
	files, dir, keep := &o.files, &o.dir, &o.keep
	if *files < 4 {
		return errors.New("the demo needs at least 4 files")
	}
	if cfg.SharePolicy == "" {
		cfg.SharePolicy, cfg.SharePriority = "voms:vo", "atlas=60,cms=40"
	}
	if cfg.Store == "" {
		cfg.Store = defaultStore()
	}
	if *dir == "" {
		d, err := os.MkdirTemp("", "sluice-demo-")
		if err != nil {
			return err
		}
		*dir = d
		if !*keep {
			defer os.RemoveAll(d)
		}
	}
	cfg.LogFormat, cfg.LogLevel = "text", "warn"
	log := newLogger(cfg, os.Stderr)

	if err := os.MkdirAll(cfg.Store, 0o755); err != nil {
		return err
	}
	ns, err := bus.Embedded(cfg.Store, 0)
	if err != nil {
		return err
	}
	defer ns.Shutdown()
	cfg.NATSURL = ns.ClientURL()
	fmt.Fprintf(stdout, "embedded NATS with JetStream at %s, store %s\n", cfg.NATSURL, cfg.Store)

	if cfg.HTTPAddr != "" {
		// The page of the scheduler, on the usual port if it is free.
		web, err := net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			web, err = net.Listen("tcp", "127.0.0.1:0")
		}
		if err != nil {
			return fmt.Errorf("web page: %w", err)
		}
		cfg.HTTP = web
		fmt.Fprintf(stdout, "live web page at http://%s/ (metrics at /metrics)\n", web.Addr())
	}

	// The demo's HTTP storage listens on 127.0.0.1, which transfers reach
	// only when allowed (its NATS server and web page, also there, stay
	// denied: they are Sluice's own).
	cfg.AllowNetworks = append(cfg.AllowNetworks, "127.0.0.1/32")

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- app.Run(ctx, *cfg, app.Roles, log) }()

	remote := filepath.Join(*dir, "remote")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: httpstore.Handler(remote), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	base := "http://" + ln.Addr().String()
	fmt.Fprintf(stdout, "HTTP storage at %s serving %s\n", base, remote)

	jobs, srcOf, err := makeDemoJobs(*dir, base, *files)
	if err != nil {
		return err
	}
	var totalBytes int64
	for _, src := range srcOf {
		st, err := os.Stat(src)
		if err != nil {
			return err
		}
		totalBytes += st.Size()
	}
	fmt.Fprintf(stdout, "made %d files (%.1f MiB) under %s\n\n", len(srcOf), float64(totalBytes)/(1<<20), *dir)

	nc, err := app.Connect(cfg.NATSURL, "sluice-demo")
	if err != nil {
		return err
	}
	defer nc.Close()
	start := time.Now()
	var ids []string
	for _, j := range jobs {
		b, _ := json.Marshal(j)
		m := nats.NewMsg(api.SubjectJobSubmit)
		m.Data = b
		var reply api.SubmitReply
		if err := waitForServices(ctx, func() error { return request(ctx, nc, m, &reply) }); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "submitted job %s (%s, owner %s): %d DTRs\n", reply.JobID, j.Name, j.Owner.FQANs[0], len(reply.DTRs))
		ids = append(ids, reply.JobID)
	}
	last := time.Time{}
	showShares := func() {
		if time.Since(last) < time.Second {
			return
		}
		last = time.Now()
		var r api.SharesReply
		if err := request(ctx, nc, nats.NewMsg(api.SubjectShares), &r); err == nil && len(r.Shares) > 0 {
			fmt.Fprintf(stdout, "\n--- shares after %.1fs ---\n", time.Since(start).Seconds())
			printShares(stdout, r)
		}
	}
	var ended []api.JobEvent
	for _, id := range ids {
		ev, err := waitJob(ctx, nc, id, func(api.JobEvent) { showShares() })
		if err != nil {
			select {
			case serr := <-errc:
				return fmt.Errorf("services stopped: %w", serr)
			default:
			}
			return err
		}
		ended = append(ended, ev)
	}
	elapsed := time.Since(start)

	fmt.Fprintln(stdout)
	n, bad := 0, 0
	for _, ev := range ended {
		printJobSummary(stdout, ev)
		for _, f := range ev.Files {
			n++
			src := srcOf[f.Destination]
			if f.State != dtr.Done || !sameFile(src, localPath(f.Destination, remote, base)) {
				bad++
				fmt.Fprintf(stdout, "  MISMATCH %s → %s (%s)\n", f.Source, f.Destination, f.State)
			}
		}
	}
	fmt.Fprintf(stdout, "\n%d DTRs in %.2fs: %.0f DTR/s, %.1f MiB/s; %d byte-exact, %d wrong\n",
		n, elapsed.Seconds(), float64(n)/elapsed.Seconds(), float64(totalBytes)/(1<<20)/elapsed.Seconds(), n-bad, bad)
	if bad > 0 {
		return fmt.Errorf("%d files did not arrive intact", bad)
	}
	return nil
}

// waitForServices retries f while no service answers yet.
func waitForServices(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := f()
		if err == nil || !errors.Is(err, nats.ErrNoResponders) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// makeDemoJobs writes the source files and describes two jobs: an atlas job
// that downloads over HTTP and uploads its outputs over HTTP, and a cms job
// that copies local files. It returns the jobs and each destination's source
// file.
func makeDemoJobs(dir, base string, files int) ([]*job.Job, map[string]string, error) {
	srcOf := map[string]string{}
	write := func(p string) (string, error) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		b := make([]byte, 1024+mrand.IntN(255*1024))
		_, _ = rand.Read(b)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return "", err
		}
		return checksum.File(p, "adler32")
	}
	run := time.Now().Format("20060102-150405")
	atlas := &job.Job{Name: "atlas-demo", Owner: dtr.Identity{DN: "/DC=org/DC=demo/CN=Alice", FQANs: []string{"/atlas/Role=production"}}, Priority: 80}
	cms := &job.Job{Name: "cms-demo", Owner: dtr.Identity{DN: "/DC=org/DC=demo/CN=Bob", FQANs: []string{"/cms"}}, Priority: 50}
	half := files / 2
	uploads := max(1, half/10)
	for i := 0; i < half-uploads; i++ {
		src := filepath.Join(dir, "remote", "in", "atlas", fmt.Sprintf("file-%04d", i))
		sum, err := write(src)
		if err != nil {
			return nil, nil, err
		}
		dst := fmt.Sprintf("file://%s/session/atlas/%s/file-%04d", dir, run, i)
		atlas.Inputs = append(atlas.Inputs, job.File{Source: fmt.Sprintf("%s/in/atlas/file-%04d", base, i), Destination: dst, Checksum: sum})
		srcOf[dst] = src
	}
	for i := 0; i < uploads; i++ {
		src := filepath.Join(dir, "session", "atlas-out", fmt.Sprintf("result-%04d", i))
		if _, err := write(src); err != nil {
			return nil, nil, err
		}
		dst := fmt.Sprintf("%s/out/atlas/%s/result-%04d", base, run, i)
		atlas.Outputs = append(atlas.Outputs, job.File{Source: "file://" + src, Destination: dst})
		srcOf[dst] = src
	}
	for i := 0; i < files-half; i++ {
		src := filepath.Join(dir, "local", "cms", fmt.Sprintf("file-%04d", i))
		if _, err := write(src); err != nil {
			return nil, nil, err
		}
		dst := fmt.Sprintf("file://%s/session/cms/%s/file-%04d", dir, run, i)
		cms.Inputs = append(cms.Inputs, job.File{Source: "file://" + src, Destination: dst})
		srcOf[dst] = src
	}
	return []*job.Job{atlas, cms}, srcOf, nil
}

// localPath maps a destination URL to the file that holds it here.
func localPath(dst, remote, base string) string {
	if len(dst) > len(base) && dst[:len(base)] == base {
		return filepath.Join(remote, filepath.FromSlash(dst[len(base):]))
	}
	return dst[len("file://"):]
}

func sameFile(a, b string) bool {
	x, err1 := os.ReadFile(a)
	y, err2 := os.ReadFile(b)
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
}

func printJobSummary(w io.Writer, ev api.JobEvent) {
	var size int64
	var first, lastEnd time.Time
	for _, f := range ev.Files {
		size += f.Size
		if first.IsZero() || f.Started.Before(first) && !f.Started.IsZero() {
			first = f.Started
		}
		if f.Ended.After(lastEnd) {
			lastEnd = f.Ended
		}
	}
	fmt.Fprintf(w, "job %s (%s) %s: %d done, %d failed, %d cancelled; %.1f MiB transferred between %s and %s\n",
		ev.Job.ID, ev.Job.Name, ev.State, ev.Done, ev.Failed, ev.Cancelled, float64(size)/(1<<20),
		first.Local().Format("15:04:05.000 MST"), lastEnd.Local().Format("15:04:05.000 MST"))
}
