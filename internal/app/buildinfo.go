package app

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dtr/sluice/pkg/version"
)

// buildInfo is the sluice_build_info gauge: always 1, its labels naming
// the version (pkg/version), the Go release and the commit of the running
// binary.
func buildInfo() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_build_info",
		Help: "1, labelled with the version, the Go release and the commit of the running binary",
		ConstLabels: prometheus.Labels{
			"version": version.String(), "goversion": runtime.Version(), "revision": version.Revision(),
		},
	})
	g.Set(1)
	return g
}
