// Package layering holds the test that keeps Sluice's packages in their
// layers: a package may import only packages of its own layer or below.
//
//	cmd/sluice                      the one binary
//	internal/app, bench             composition: build and wire the services
//	services/<name>/...             one service each; none imports another
//	pkg/...                         libraries the services and clients share
//	pkg/api                         the wire contract: model packages only
//	pkg/dtr, pkg/job, pkg/checksum  the model
//
// The scheduler's core (services/scheduler/core) is stricter still: it does
// no I/O, so it imports only the standard library, uuid, the model and the
// wire contract.
package layering

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/sluice-dtr/sluice/"

// layerOf names the layer of one of the module's packages.
func layerOf(pkg string) string {
	switch {
	case pkg == "pkg/dtr" || pkg == "pkg/job" || pkg == "pkg/checksum":
		return "model"
	case pkg == "pkg/api":
		return "api"
	case strings.HasPrefix(pkg, "pkg/"):
		return "library"
	case strings.HasPrefix(pkg, "services/"):
		return "service"
	case strings.HasPrefix(pkg, "internal/app") || strings.HasPrefix(pkg, "bench"):
		return "composition"
	case strings.HasPrefix(pkg, "cmd/"):
		return "binary"
	}
	return "other"
}

// may says which layers a layer may import from.
var may = map[string][]string{
	"model":       {"model"},
	"api":         {"model"},
	"library":     {"model", "api", "library"},
	"service":     {"model", "api", "library", "service"}, // its own service only, below
	"composition": {"model", "api", "library", "service", "composition"},
	"binary":      {"model", "api", "library", "service", "composition", "binary"},
}

// service returns the service a package belongs to ("scheduler" for
// services/scheduler/core).
func service(pkg string) string {
	return strings.SplitN(strings.TrimPrefix(pkg, "services/"), "/", 2)[0]
}

// imports lists the module's packages, without tests, with what each
// imports.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	all := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		all[strings.TrimPrefix(f[0], module)] = f[1:]
	}
	return all
}

// refusal says why pkg may not import dep (both in the module, without
// its path), or "" if it may.
func refusal(pkg, dep string) string {
	from, to := layerOf(pkg), layerOf(dep)
	allowed := false
	for _, l := range may[from] {
		allowed = allowed || l == to
	}
	switch {
	case !allowed:
		return pkg + " (" + from + ") imports " + dep + " (" + to + "), a layer above it"
	case from == "service" && to == "service" && service(pkg) != service(dep):
		return "service package " + pkg + " imports " + dep + ", another service: services talk only over NATS, through pkg/api"
	case from == "binary" && to == "service" && dep != "services/scheduler/simulate":
		// The CLI talks to the services over NATS with pkg/api's types;
		// only the offline simulator runs a core in process.
		return pkg + " imports " + dep + ": a client speaks to a service through pkg/api, not its package"
	}
	return ""
}

func TestLayerRules(t *testing.T) {
	for _, tc := range []struct {
		pkg, dep string
		refused  bool
	}{
		{"pkg/api", "pkg/dtr", false},
		{"pkg/api", "pkg/bus", true},
		{"pkg/dtr", "pkg/api", true},
		{"pkg/bus", "internal/app", true},
		{"pkg/worker", "services/processor", true},
		{"services/processor", "pkg/worker", false},
		{"services/processor", "services/scheduler", true},
		{"services/scheduler/fairshare", "services/scheduler/core", false},
		{"services/scheduler", "internal/app", true},
		{"internal/app", "services/delivery", false},
		{"cmd/sluice", "internal/app", false},
		{"cmd/sluice", "services/scheduler", true},
		{"cmd/sluice", "services/scheduler/simulate", false},
	} {
		if got := refusal(tc.pkg, tc.dep); (got != "") != tc.refused {
			t.Errorf("%s importing %s: refused %q, want refused %v", tc.pkg, tc.dep, got, tc.refused)
		}
	}
}

func TestNoPackageImportsAPackageAboveItsLayer(t *testing.T) {
	all := imports(t)
	if len(all) < 10 {
		t.Fatalf("go list found only %d packages", len(all))
	}
	for pkg, deps := range all {
		for _, dep := range deps {
			if strings.HasPrefix(dep, module) {
				if why := refusal(pkg, strings.TrimPrefix(dep, module)); why != "" {
					t.Error(why)
				}
			}
		}
	}
}

func TestTheSchedulersCoreImportsNothingThatDoesIO(t *testing.T) {
	allowed := map[string]bool{"github.com/google/uuid": true}
	for pkg, deps := range imports(t) {
		if pkg != "services/scheduler/core" {
			continue
		}
		for _, dep := range deps {
			local := strings.TrimPrefix(dep, module)
			switch {
			case !strings.Contains(strings.SplitN(dep, "/", 2)[0], "."):
				// The standard library. The core is told the time and
				// does no I/O; these would let it do otherwise.
				for _, io := range []string{"os", "net", "net/http", "os/exec", "io/fs", "syscall"} {
					if dep == io {
						t.Errorf("the core imports %s", dep)
					}
				}
			case allowed[dep]:
			case local != dep && (layerOf(local) == "model" || layerOf(local) == "api"):
			default:
				t.Errorf("the core imports %s: it may import only the standard library, uuid, the model and pkg/api", dep)
			}
		}
	}
}
