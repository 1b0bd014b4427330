package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/sluice-dtr/sluice/internal/app"
)

// ARCSlots is the number of slots of each state that ARC gives by default
// (maxprocessor, maxdelivery), and that Sluice's defaults give too.
const ARCSlots = 10

// SiteDefaults is the configuration a site gets from an empty
// environment: ARC's slot counts, the 50 ms tick, the 2-minute lease, the
// per-link optimizer and the DTRs' history on. Only the largest job is
// raised, to files, so that a job of that many files is taken.
func SiteDefaults(files int) (app.Config, error) {
	var cfg app.Config
	// A prefix that names no variable: every setting takes its default.
	if err := envconfig.Process("sluice_bench_site_defaults", &cfg); err != nil {
		return cfg, fmt.Errorf("defaults: %w", err)
	}
	cfg.Generator.MaxFiles = max(cfg.Generator.MaxFiles, files)
	return cfg, nil
}

// ThroughputAtDefaults moves n 1 KiB files file→file as one job, all roles
// in this process with a site's default settings (SiteDefaults: ARCSlots
// slots per state), and returns DTRs per second from submission to the
// job's end. With so few slots a DTR's throughput is bound by how fast a
// slot is granted again once its result comes in: the turnaround.
func ThroughputAtDefaults(ctx context.Context, dir string, n int) (float64, error) {
	cfg, err := SiteDefaults(n)
	if err != nil {
		return 0, err
	}
	s, err := start(ctx, dir, cfg, "", nil, process{roles: app.Roles})
	if err != nil {
		return 0, err
	}
	defer s.stop()
	j, err := files(dir, "d", n, 1024, nil)
	if err != nil {
		return 0, err
	}
	begin := time.Now()
	ev, err := s.run(ctx, j)
	if err != nil {
		return 0, err
	}
	if ev.Done != n {
		return 0, fmt.Errorf("throughput at the defaults: %d of %d files done", ev.Done, n)
	}
	return float64(n) / s.ended.Sub(begin).Seconds(), nil
}
