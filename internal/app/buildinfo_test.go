package app

import (
	"runtime/debug"
	"testing"
)

func TestTheVersionIsTheModulesElseTheCommitElseDevel(t *testing.T) {
	rev := func(modified string) []debug.BuildSetting {
		s := []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "4f92053a1b2c3d4e5f60718293a4b5c6d7e8f901"}}
		if modified != "" {
			s = append(s, debug.BuildSetting{Key: "vcs.modified", Value: modified})
		}
		return s
	}
	tests := []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"a tagged module", debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}, Settings: rev("false")}, "v1.4.0"},
		{"a clean tree", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: rev("false")}, "4f92053a1b2c"},
		{"a tree with changes", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: rev("true")}, "4f92053a1b2c+dirty"},
		{"no version control", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel"},
		{"nothing at all", debug.BuildInfo{}, "devel"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := versionOf(&tt.bi); got != tt.want {
				t.Errorf("versionOf = %q, want %q", got, tt.want)
			}
		})
	}
}
