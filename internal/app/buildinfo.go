package app

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// buildVersion is the version of this binary: its module version when
// built from a tagged module (go install ...@v1.2.3), else the commit it
// was built from, shortened, with "+dirty" if the tree had changes, else
// "devel".
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	return versionOf(bi)
}

// versionOf is buildVersion for the build information bi.
func versionOf(bi *debug.BuildInfo) string {
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	if rev := revisionOf(bi); rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.modified" && s.Value == "true" {
				rev += "+dirty"
			}
		}
		return rev
	}
	return "devel"
}

// revisionOf is the commit bi was built from, if known.
func revisionOf(bi *debug.BuildInfo) string {
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	return ""
}

// buildInfo is the sluice_build_info gauge: always 1, its labels naming
// the version, the Go release and the commit of the running binary.
func buildInfo() prometheus.Collector {
	revision := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		revision = revisionOf(bi)
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_build_info",
		Help: "1, labelled with the version, the Go release and the commit of the running binary",
		ConstLabels: prometheus.Labels{
			"version": buildVersion(), "goversion": runtime.Version(), "revision": revision,
		},
	})
	g.Set(1)
	return g
}
