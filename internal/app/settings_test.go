package app

import (
	"bytes"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kelseyhightower/envconfig"
)

func TestSettings(t *testing.T) {
	settings, err := Settings()
	if err != nil {
		t.Fatal(err)
	}
	group := map[string]string{} // key → its group
	for role, ss := range settings {
		for _, s := range ss {
			if g, ok := group[s.Key]; ok {
				t.Errorf("%s is listed under %s and %s", s.Key, g, role)
			}
			group[s.Key] = role
		}
	}
	t.Run("every setting of Config is listed once", func(t *testing.T) {
		var all strings.Builder
		if err := envconfig.Usagef("sluice", &Config{}, &all, "{{range .}}{{usage_key .}}\n{{end}}"); err != nil {
			t.Fatal(err)
		}
		for key := range strings.FieldsSeq(all.String()) {
			if _, ok := group[key]; !ok {
				t.Errorf("%s is in no group", key)
			}
		}
	})
	t.Run("a setting is listed in the narrowest group that holds it", func(t *testing.T) {
		for key, want := range map[string]string{
			"SLUICE_NATS_URL": "common", "SLUICE_FILE_ROOTS": "common", "SLUICE_S3_CREDENTIALS": "common",
			"SLUICE_STORAGE_TOKEN_ISSUER": "common", "OTEL_EXPORTER_OTLP_ENDPOINT": "common",
			"SLUICE_AS_USER": "client", "BEARER_TOKEN": "client",
			"SLUICE_MAXDELIVERY": "scheduler", "SLUICE_LEASE": "scheduler", "SLUICE_JOURNAL_MAX_BYTES": "scheduler",
			"SLUICE_POLICY": "policies", "SLUICE_DIRAC_GROUPS": "policies", "SLUICE_BYTEFAIR": "policies",
			"SLUICE_GENERATOR_MAX_FILES": "generator", "SLUICE_PROCESSOR_PRE_WORKERS": "processor",
			"SLUICE_DELIVERY_WORKERS": "delivery",
		} {
			if group[key] != want {
				t.Errorf("%s is listed under %q, want %q", key, group[key], want)
			}
		}
	})
	t.Run("a setting is listed with its default", func(t *testing.T) {
		for _, s := range settings["scheduler"] {
			if s.Key == "SLUICE_LEASE" && s.Default != "2m" {
				t.Errorf("SLUICE_LEASE's default is listed as %q, want 2m", s.Default)
			}
		}
	})
}

func TestPrintSettings(t *testing.T) {
	t.Run("every group has a heading and its settings", func(t *testing.T) {
		var out bytes.Buffer
		if err := PrintSettings(&out, ""); err != nil {
			t.Fatal(err)
		}
		for _, g := range Groups {
			if !strings.Contains(out.String(), g.Heading+" [sluice help "+g.Role+"]:\n") {
				t.Errorf("no heading for %s", g.Role)
			}
		}
	})
	t.Run("one group prints alone", func(t *testing.T) {
		var out bytes.Buffer
		if err := PrintSettings(&out, "delivery"); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(out.String(), "Delivery [sluice help delivery]:\n") || !strings.Contains(out.String(), "SLUICE_DELIVERY_WORKERS") ||
			strings.Contains(out.String(), "SLUICE_MAXDELIVERY") {
			t.Fatalf("sluice help delivery printed\n%s", out.String())
		}
	})
	t.Run("an unknown group is refused, naming the groups", func(t *testing.T) {
		err := PrintSettings(&bytes.Buffer{}, "deliveries")
		if err == nil || !strings.Contains(err.Error(), "common, client, scheduler") {
			t.Fatalf("error %v", err)
		}
	})
}

// TestOperationsDocGivesTheDefaults: the tables of docs/operations.md
// give each setting the default its tag has, so that the defaults live in
// the tags alone and the guide follows them.
func TestOperationsDocGivesTheDefaults(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	settings, err := Settings()
	if err != nil {
		t.Fatal(err)
	}
	defaults := map[string]string{}
	for _, ss := range settings {
		for _, s := range ss {
			defaults[s.Key] = s.Default
		}
	}
	row := regexp.MustCompile("(?m)^\\| `(SLUICE_[A-Z_]+)` \\| ([^|]*) \\|")
	rows := row.FindAllStringSubmatch(string(doc), -1)
	if len(rows) < 20 {
		t.Fatalf("%d settings found in the tables of docs/operations.md", len(rows))
	}
	for _, m := range rows {
		key, cell := m[1], strings.Trim(strings.TrimSpace(m[2]), "`")
		if n, unit, ok := strings.Cut(cell, " "); ok {
			if shift := map[string]uint{"KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}[strings.Fields(unit)[0]]; shift > 0 {
				if v, err := strconv.ParseInt(n, 10, 64); err == nil {
					cell = strconv.FormatInt(v<<shift, 10) // "64 MiB" as the tag has it
				}
			}
		}
		def, ok := defaults[key]
		switch {
		case !ok:
			t.Errorf("docs/operations.md lists %s, which is not a setting", key)
		case def != "" && !strings.HasPrefix(cell, def):
			t.Errorf("docs/operations.md gives %s the default %q; its tag says %s", key, cell, def)
		}
	}
}
