package api

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// jsonFields returns the JSON names of a struct type's fields, embedded
// structs flattened, as encoding/json sees them.
func jsonFields(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || !f.IsExported():
		case f.Anonymous && name == "":
			out = append(out, jsonFields(f.Type)...)
		case name == "":
			out = append(out, f.Name)
		default:
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// schemaObject is the part of a JSON Schema this test reads.
type schemaObject struct {
	Properties map[string]json.RawMessage `json:"properties"`
	Defs       map[string]schemaObject    `json:"$defs"`
}

func readSchema(t *testing.T, name string) schemaObject {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "schemas", name))
	if err != nil {
		t.Fatal(err)
	}
	var s schemaObject
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return s
}

func keys(m map[string]json.RawMessage) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestTheSchemasNameEveryFieldOfTheTypesTheyDescribe: schemas/ describes
// what a publisher sends (a DTR submission, a job description) and the
// messages between the scheduler and its workers (a grant, a result, a
// worker's heartbeat), and the scheduler's stored history of a DTR; each object in it has exactly the fields of the Go
// type that reads it, so a field added to one without the other fails
// here.
func TestTheSchemasNameEveryFieldOfTheTypesTheyDescribe(t *testing.T) {
	dtrSchema, jobSchema := readSchema(t, "dtr.schema.json"), readSchema(t, "job.schema.json")
	grantSchema, resultSchema := readSchema(t, "grant.schema.json"), readSchema(t, "result.schema.json")
	heartbeatSchema, historySchema := readSchema(t, "heartbeat.schema.json"), readSchema(t, "history.schema.json")
	nested := func(raw json.RawMessage) map[string]json.RawMessage {
		var o schemaObject
		if err := json.Unmarshal(raw, &o); err != nil {
			t.Fatal(err)
		}
		return o.Properties
	}
	tests := []struct {
		name   string
		schema map[string]json.RawMessage
		typ    reflect.Type
	}{
		{"dtr.schema.json", dtrSchema.Properties, reflect.TypeFor[dtr.Submission]()},
		{"dtr.schema.json options", nested(dtrSchema.Properties["options"]), reflect.TypeFor[dtr.Options]()},
		{"dtr.schema.json owner", nested(dtrSchema.Properties["owner"]), reflect.TypeFor[dtr.Identity]()},
		{"job.schema.json", jobSchema.Properties, reflect.TypeFor[job.Job]()},
		{"job.schema.json $defs/file", jobSchema.Defs["file"].Properties, reflect.TypeFor[job.File]()},
		{"job.schema.json $defs/identity", jobSchema.Defs["identity"].Properties, reflect.TypeFor[dtr.Identity]()},
		{"grant.schema.json", grantSchema.Properties, reflect.TypeFor[Grant]()},
		{"result.schema.json", resultSchema.Properties, reflect.TypeFor[Result]()},
		{"result.schema.json error", nested(resultSchema.Properties["error"]), reflect.TypeFor[dtr.Failure]()},
		{"heartbeat.schema.json", heartbeatSchema.Properties, reflect.TypeFor[Heartbeat]()},
		{"heartbeat.schema.json $defs/grant", heartbeatSchema.Defs["grant"].Properties, reflect.TypeFor[HeldGrant]()},
		{"history.schema.json", historySchema.Properties, reflect.TypeFor[HistoryRecord]()},
		{"history.schema.json $defs/event", historySchema.Defs["event"].Properties, reflect.TypeFor[HistoryEvent]()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, want := keys(tt.schema), jsonFields(tt.typ); !slices.Equal(got, want) {
				t.Fatalf("%s has the fields %v; %s has %v", tt.name, got, tt.typ, want)
			}
		})
	}
}

// The DTR schema's URL pattern takes the schemes of dtr.SchemeTable, in
// either case, and no other: a new protocol's scheme is added to both.
func TestTheDTRSchemaTakesTheURLSchemesOfTheSchemeTable(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "schemas", "dtr.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Defs struct {
			URL struct {
				Pattern string `json:"pattern"`
			} `json:"url"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	pattern, err := regexp.Compile(schema.Defs.URL.Pattern)
	if err != nil {
		t.Fatalf("the URL pattern %q: %v", schema.Defs.URL.Pattern, err)
	}
	for _, s := range dtr.SchemeTable {
		for _, name := range []string{s.Name, strings.ToUpper(s.Name)} {
			if u := name + "://host/path"; !pattern.MatchString(u) {
				t.Errorf("the schema's URL pattern refuses %s, a scheme of dtr.SchemeTable", u)
			}
		}
	}
	for _, u := range []string{"gopher://host/path", "ftp://host/path", "files:///path", "htt://host/path", "s4://host/b/k"} {
		if pattern.MatchString(u) {
			t.Errorf("the schema's URL pattern takes %s, which is no scheme of dtr.SchemeTable", u)
		}
	}
}
