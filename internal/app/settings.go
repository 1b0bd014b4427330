package app

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/kelseyhightower/envconfig"
	"github.com/sluice-dtr/sluice/services/scheduler/fairshare"
)

// Group is one heading of `sluice help`: the settings of one role.
type Group struct {
	// Role names the group: sluice help ROLE prints it alone.
	Role    string
	Heading string
	// Prefix and Spec say where in Config the group's settings are read:
	// envconfig reads Spec(cfg) under Prefix.
	Prefix string
	Spec   func(*Config) any
	// Only, if set, keeps the keys of Spec that it returns true for.
	Only func(key string) bool
	// Extra are variables read outside Config (by a library or a client
	// command), listed after the group's own.
	Extra []Setting
}

// Setting is one environment variable as `sluice help` lists it.
type Setting struct {
	Key, Default, Description string
}

// Groups are the groups of settings, in the order `sluice help` prints
// them; adding a group is one line here. A setting is listed once, in the
// narrowest group that holds it: common holds all of Config and lists what
// no other group takes.
var Groups = []Group{
	{Role: "common", Heading: "Common to every role: NATS, logs, credentials, storage access, HTTP, tracing",
		Prefix: "sluice", Spec: func(c *Config) any { return c }, Extra: tracingSettings},
	{Role: "client", Heading: "Client commands (submit, cp, jobs, status, shares, why, priority, cancel, reconfigure, workers)",
		Prefix: "sluice", Spec: func(c *Config) any { return c }, Only: func(k string) bool { return k == "SLUICE_AS_USER" }, Extra: clientSettings},
	{Role: "scheduler", Heading: "Scheduler", Prefix: "sluice", Spec: func(c *Config) any { return &c.Config }},
	{Role: "policies", Heading: "Fair-share policies (read by the scheduler)", Prefix: "sluice", Spec: func(c *Config) any { return &c.Config }, Only: policySetting},
	{Role: "fts", Heading: "FTS3 REST API (served by the generator) and SciTags packet marking (sent by delivery)",
		Prefix: "sluice", Spec: func(c *Config) any { return c }, Only: func(k string) bool { return k == "SLUICE_FTS_LISTEN" || strings.HasPrefix(k, "SLUICE_SCITAG_") }},
	{Role: "generator", Heading: "Generator", Prefix: "sluice_generator", Spec: func(c *Config) any { return &c.Generator }},
	{Role: "processor", Heading: "Processor", Prefix: "sluice_processor", Spec: func(c *Config) any { return &c.Processor }},
	{Role: "delivery", Heading: "Delivery", Prefix: "sluice_delivery", Spec: func(c *Config) any { return &c.Delivery }},
}

// policySetting says whether a key of the scheduler's Config belongs to
// its fair-share policy.
func policySetting(key string) bool {
	return key == "SLUICE_POLICY" || slices.ContainsFunc([]string{"SLUICE_DIRAC_", "SLUICE_BYTEFAIR", "SLUICE_SAM_", "SLUICE_ENSTORE_"},
		func(p string) bool { return strings.HasPrefix(key, p) })
}

// tracingSettings are the OpenTelemetry variables that Tracing and its
// exporter read.
var tracingSettings = []Setting{
	{"OTEL_EXPORTER_OTLP_ENDPOINT", "", "where traces (one per DTR) go over OTLP (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); empty, and OTEL_TRACES_EXPORTER unset: none are exported"},
	{"OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf", "OTLP over http/protobuf or grpc (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL for traces alone)"},
	{"OTEL_EXPORTER_OTLP_HEADERS", "", "headers sent with every export, key=value,... (an authorization token)"},
	{"OTEL_EXPORTER_OTLP_TIMEOUT", "10000", "milliseconds an export may take"},
	{"OTEL_TRACES_EXPORTER", "", "otlp, console (to standard output) or none; empty: otlp if an endpoint is set, else none"},
	{"OTEL_SERVICE_NAME", "sluice-<role>", "the service the traces come from (\"sluice\" for all and demo)"},
	{"OTEL_RESOURCE_ATTRIBUTES", "", "more attributes of the service, key=value,..."},
	{"OTEL_TRACES_SAMPLER", "", "which traces are recorded (OpenTelemetry's names, with OTEL_TRACES_SAMPLER_ARG); empty: those that come in sampled, and every one when spans are exported"},
}

// clientSettings are the variables only the client commands read.
var clientSettings = []Setting{
	{"BEARER_TOKEN", "", "bearer token sent with every request; it names the caller"},
	{"BEARER_TOKEN_FILE", "", "file holding that token, when BEARER_TOKEN is empty"},
	{"NATS_CONTEXT", "", "nats context to connect with (--context wins); empty: the one selected with \"nats context select\""},
}

// Settings returns the groups' settings, each setting in one group only.
func Settings() (map[string][]Setting, error) {
	var cfg Config
	keys := make([][]Setting, len(Groups))
	owner := map[string]int{} // key → index of the narrowest group
	for i, g := range Groups {
		var b strings.Builder
		if err := envconfig.Usagef(g.Prefix, g.Spec(&cfg), &b,
			"{{range .}}{{usage_key .}}\x1f{{usage_default .}}\x1f{{usage_description .}}\n{{end}}"); err != nil {
			return nil, fmt.Errorf("settings of %s: %w", g.Role, err)
		}
		for line := range strings.SplitSeq(strings.TrimSuffix(b.String(), "\n"), "\n") {
			f := strings.SplitN(line, "\x1f", 3)
			if len(f) != 3 || g.Only != nil && !g.Only(f[0]) {
				continue
			}
			keys[i] = append(keys[i], Setting{f[0], f[1], f[2]})
		}
	}
	for i := range Groups {
		for _, s := range keys[i] {
			if j, ok := owner[s.Key]; !ok || len(keys[i]) < len(keys[j]) {
				owner[s.Key] = i
			}
		}
	}
	out := map[string][]Setting{}
	for i, g := range Groups {
		for _, s := range keys[i] {
			if owner[s.Key] == i {
				out[g.Role] = append(out[g.Role], s)
			}
		}
		out[g.Role] = append(out[g.Role], g.Extra...)
	}
	return out, nil
}

// PrintSettings writes the settings of the group named role, or of every
// group if role is empty: a heading, then each variable, its default and
// what it does.
func PrintSettings(w io.Writer, role string) error {
	settings, err := Settings()
	if err != nil {
		return err
	}
	var roles []string
	for _, g := range Groups {
		roles = append(roles, g.Role)
	}
	if role != "" && !slices.Contains(roles, role) {
		return fmt.Errorf("no settings group %q: the groups are %s", role, strings.Join(roles, ", "))
	}
	for i, g := range Groups {
		if role != "" && g.Role != role {
			continue
		}
		if role == "" && i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s [sluice help %s]:\n", g.Heading, g.Role)
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		for _, s := range settings[g.Role] {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", s.Key, s.Default, s.Description)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// Policies are the names SLUICE_POLICY may take, sorted.
func Policies() []string {
	return slices.Sorted(maps.Keys(fairshare.Factories))
}
