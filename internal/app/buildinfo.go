package app

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dtr/sluice/pkg/version"
)

// revision is the commit the binary was built from, if known.
func revision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return ""
}

// buildInfo is the sluice_build_info gauge: always 1, its labels naming
// the version (pkg/version), the Go release and the commit of the running
// binary.
func buildInfo() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_build_info",
		Help: "1, labelled with the version, the Go release and the commit of the running binary",
		ConstLabels: prometheus.Labels{
			"version": version.String(), "goversion": runtime.Version(), "revision": revision(),
		},
	})
	g.Set(1)
	return g
}
