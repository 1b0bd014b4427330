// Package version tells which build of Sluice is running: the version that
// `sluice --version` prints and the workers' heartbeats carry (String),
// and its SemVer form that the services announce as NATS micro services.
package version

import (
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
)

// String returns the module's version as the Go toolchain recorded it in
// the binary: the module version (a tagged release, or a pseudo-version
// when built with go install …@commit); else the VCS revision, shortened
// to 12 characters, with "+dirty" when the work tree had changes; else
// "devel" (a test binary, or a build without VCS information). A build
// may set it instead, with -ldflags "-X ...pkg/version.Release=v1.2.3"
// (deploy/build-image.sh does, from git describe).
func String() string {
	once.Do(func() {
		if Release != "" {
			version = Release
			return
		}
		info, ok := debug.ReadBuildInfo()
		if !ok {
			version = "devel"
			return
		}
		version = fromBuildInfo(info)
	})
	return version
}

// Release, set by the linker, is the version String returns.
var Release string

var (
	once    sync.Once
	version string
)

// fromBuildInfo reads the version out of a binary's build information.
func fromBuildInfo(info *debug.BuildInfo) string {
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	rev, dirty := revisionOf(info)
	if rev == "" {
		return "devel"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "+dirty"
	}
	return rev
}

// Revision returns the full commit the binary was built from, "" if the
// build did not record it.
func Revision() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	rev, _ := revisionOf(info)
	return rev
}

// revisionOf reads the commit and whether the tree had changes out of a
// binary's build information.
func revisionOf(info *debug.BuildInfo) (rev string, dirty bool) {
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	return rev, dirty
}

// SemVer returns String as a Semantic Version without a leading "v", as
// NATS micro services must announce theirs: a release as it is
// ("v1.2.3" is 1.2.3), a revision as a build of 0.0.0-devel
// ("0123456789ab+dirty" is 0.0.0-devel+0123456789ab.dirty), and anything
// else as 0.0.0-devel.
func SemVer() string { return semVer(String()) }

func semVer(v string) string {
	if s, ok := strings.CutPrefix(v, "v"); ok && semVerPattern.MatchString(s) {
		return s
	}
	rev, dirty := strings.CutSuffix(v, "+dirty")
	if hexRevision.MatchString(rev) {
		if dirty {
			rev += ".dirty"
		}
		return "0.0.0-devel+" + rev
	}
	return "0.0.0-devel"
}

var (
	// semVerPattern is semver.org's, as nats.go/micro checks a version.
	semVerPattern = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)
	hexRevision   = regexp.MustCompile(`^[0-9a-f]+$`)
)
