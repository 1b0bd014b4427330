package version

import (
	"runtime/debug"
	"testing"
)

func TestTheVersionComesFromTheModuleElseTheRevisionElseDevel(t *testing.T) {
	rev := "0123456789abcdef0123456789abcdef01234567"
	tests := []struct {
		name     string
		main     string
		settings map[string]string
		want     string
	}{
		{"a tagged release", "v1.2.3", map[string]string{"vcs.revision": rev}, "v1.2.3"},
		{"a pseudo-version", "v0.0.0-20261126010000-0123456789ab", nil, "v0.0.0-20261126010000-0123456789ab"},
		{"a build in a clean work tree", "(devel)", map[string]string{"vcs.revision": rev, "vcs.modified": "false"}, "0123456789ab"},
		{"a build in a changed work tree", "(devel)", map[string]string{"vcs.revision": rev, "vcs.modified": "true"}, "0123456789ab+dirty"},
		{"a short revision", "", map[string]string{"vcs.revision": "abc"}, "abc"},
		{"no version and no revision", "(devel)", nil, "devel"},
		{"nothing at all", "", nil, "devel"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info := &debug.BuildInfo{Main: debug.Module{Path: "github.com/sluice-dtr/sluice", Version: tt.main}}
			for k, v := range tt.settings {
				info.Settings = append(info.Settings, debug.BuildSetting{Key: k, Value: v})
			}
			if got := fromBuildInfo(info); got != tt.want {
				t.Errorf("version %q, want %q", got, tt.want)
			}
		})
	}
}

func TestTheVersionIsNeverEmpty(t *testing.T) {
	if String() == "" {
		t.Fatal("empty version")
	}
}

func TestTheSemVerFormIsOneThatMicroServicesTake(t *testing.T) {
	tests := []struct{ version, want string }{
		{"v1.2.3", "1.2.3"},
		{"v1.2.3-rc.1", "1.2.3-rc.1"},
		{"v0.0.0-20261126010000-0123456789ab", "0.0.0-20261126010000-0123456789ab"},
		{"v1.2.4-0.20261126010000-0123456789ab+dirty", "1.2.4-0.20261126010000-0123456789ab+dirty"},
		{"0123456789ab", "0.0.0-devel+0123456789ab"},
		{"0123456789ab+dirty", "0.0.0-devel+0123456789ab.dirty"},
		{"devel", "0.0.0-devel"},
		{"v1.2", "0.0.0-devel"},
	}
	for _, tt := range tests {
		t.Run(tt.version, func(t *testing.T) {
			got := semVer(tt.version)
			if got != tt.want {
				t.Errorf("SemVer of %q is %q, want %q", tt.version, got, tt.want)
			}
			if !semVerPattern.MatchString(got) {
				t.Errorf("%q is no Semantic Version", got)
			}
		})
	}
	if !semVerPattern.MatchString(SemVer()) {
		t.Errorf("this build's %q is no Semantic Version", SemVer())
	}
}
