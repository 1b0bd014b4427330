package job

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// examples says what each file in testdata is for: nil for a description
// that must parse and validate, or the substrings the error must contain.
var examples = map[string][]string{
	"valid-full.json":    nil,
	"valid-minimal.json": nil,
	"valid-arc.xrsl":     nil,
	"invalid-unknown-field.json": {
		`unknown field "prioirty" (did you mean "priority"?)`,
		`inputs[0]: unknown field "sorce" (did you mean "source"?)`,
		`inputs[0].overwrite: expected true or false, found string "yes"`,
	},
	"invalid-trailing.json": {`json line 2, column 1 (byte 91): unexpected '{' after the end of the job object`},
	"invalid-values.json": {
		`id "not a valid id!"`,
		`priority 500 is outside 1–100`,
		`owner.fqans[0]: FQAN "atlas/Role=production"`,
		`inputs[0].source: URL "ftp://data.example.org/a": scheme "ftp" is not one of file, http, https`,
		`inputs[1]: source and destination are the same URL`,
		`inputs[2].destination: URL "file:///scratch/a" is also the destination of inputs[0]`,
		`inputs[2].checksum: checksum "crc32:1234": type "crc32" is not one of adler32, md5, sha256`,
	},
	"invalid-no-files.json": {`the job has no input or output files`},
	"invalid-escape.xrsl": {
		`xrsl line 2, column 17 (byte 41): inputfiles entry 1: file name "../../etc/passwd" has a ".." element`,
		`xrsl line 3, column 17 (byte 106): inputfiles entry 2: file name "/tmp/abs" is absolute`,
		`xrsl line 4, column 14 (byte 161): priority: "high" is not an integer`,
	},
	"invalid-unclosed.xrsl": {`expected ")" to close the relation "jobname" opened at line 3, column 2, found end of input`},
}

// load reads, parses, normalizes and validates a testdata file.
func load(t *testing.T, name string) (*Job, error) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	j, err := Parse(data, XRSLOptions{SessionDir: "/var/spool/sluice/sessions/j1"})
	if err != nil {
		return nil, err
	}
	j.Normalize()
	return j, j.Validate()
}

func TestEveryTestdataFileHasAnExpectation(t *testing.T) {
	files, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f.IsDir() {
			continue // testdata/fuzz holds the fuzzer's corpus
		}
		if _, ok := examples[f.Name()]; !ok {
			t.Errorf("testdata/%s is not listed in examples", f.Name())
		}
	}
	for name := range examples {
		if _, err := os.Stat(filepath.Join("testdata", name)); err != nil {
			t.Errorf("examples lists %s: %v", name, err)
		}
	}
}

func TestTestdataExamples(t *testing.T) {
	for _, name := range slices.Sorted(maps.Keys(examples)) {
		want := examples[name]
		t.Run(name, func(t *testing.T) {
			j, err := load(t, name)
			if want == nil {
				if err != nil {
					t.Fatalf("a valid example fails: %v", err)
				}
				for i, d := range j.DTRs(time.Now()) {
					if err := d.Validate(); err != nil {
						t.Errorf("DTR %d fails dtr.Validate: %v", i, err)
					}
				}
				return
			}
			got := problems(err)
			if len(got) != len(want) {
				t.Fatalf("problems = %q, want %d matching %q", got, len(want), want)
			}
			for i, w := range want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

func TestARCExampleBecomesTheExpectedFiles(t *testing.T) {
	j, err := load(t, "valid-arc.xrsl")
	if err != nil {
		t.Fatal(err)
	}
	const sess = "file:///var/spool/sluice/sessions/j1/"
	want := Job{
		ID:       j.ID,
		Name:     "reco run 42",
		Priority: 70,
		Inputs: []File{
			{Source: "https://data.example.org/raw/run42.root", Destination: sess + "run42.root", Checksum: "adler32:6f2d0a1b"},
			{Source: "http://conditions.example.org/db/2024.sqlite", Destination: sess + "conditions.sqlite", NoCache: true},
		},
		Outputs: []File{
			{Source: sess + "reco.root", Destination: "https://store.example.org/reco/run42/reco.root", Overwrite: true},
		},
	}
	if !reflect.DeepEqual(*j, want) {
		t.Errorf("job =\n%+v\nwant\n%+v", *j, want)
	}
}

// readSchema loads a schema from the repository's schemas directory.
func readSchema(t *testing.T, name string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "schemas", name))
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("%s is not JSON: %v", name, err)
	}
	if s["$schema"] != "https://json-schema.org/draft/2020-12/schema" {
		t.Errorf("%s: $schema = %v, want draft 2020-12", name, s["$schema"])
	}
	return s
}

// schemaCheck validates a decoded JSON value against the subset of JSON
// Schema the Sluice schemas use: type, const, enum, properties, required,
// additionalProperties false, items, minItems, minimum, maximum, pattern,
// anyOf and local $ref. It returns one message per violation.
func schemaCheck(root, s map[string]any, v any, at string) []string {
	if ref, ok := s["$ref"].(string); ok {
		def := root
		for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			def, _ = def[part].(map[string]any)
		}
		if def == nil {
			return []string{at + ": unresolved $ref " + ref}
		}
		merged := maps.Clone(def)
		for k, x := range s {
			if k != "$ref" && k != "description" {
				merged[k] = x
			}
		}
		s = merged
	}
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, at+": "+fmt.Sprintf(format, args...)) }
	if typ, ok := s["type"].(string); ok && !hasType(v, typ) {
		bad("want %s, have %T", typ, v)
		return errs
	}
	if c, ok := s["const"]; ok && v != c {
		bad("want %v, have %v", c, v)
	}
	if enum, ok := s["enum"].([]any); ok && !slices.Contains(enum, v) {
		bad("%v is not one of %v", v, enum)
	}
	if p, ok := s["pattern"].(string); ok {
		if str, _ := v.(string); !regexp.MustCompile(p).MatchString(str) {
			bad("%q does not match %s", str, p)
		}
	}
	if n, ok := v.(float64); ok {
		if lo, ok := s["minimum"].(float64); ok && n < lo {
			bad("%v is below %v", n, lo)
		}
		if hi, ok := s["maximum"].(float64); ok && n > hi {
			bad("%v is above %v", n, hi)
		}
	}
	if obj, ok := v.(map[string]any); ok {
		props, _ := s["properties"].(map[string]any)
		for _, r := range asSlice(s["required"]) {
			if _, ok := obj[r.(string)]; !ok {
				bad("required property %q is missing", r)
			}
		}
		for k, x := range obj {
			ps, known := props[k].(map[string]any)
			if !known {
				if s["additionalProperties"] == false {
					bad("property %q is not allowed", k)
				}
				continue
			}
			errs = append(errs, schemaCheck(root, ps, x, at+"."+k)...)
		}
	}
	if arr, ok := v.([]any); ok {
		if n, ok := s["minItems"].(float64); ok && float64(len(arr)) < n {
			bad("%d items, want at least %v", len(arr), n)
		}
		if items, ok := s["items"].(map[string]any); ok {
			for i, x := range arr {
				errs = append(errs, schemaCheck(root, items, x, fmt.Sprintf("%s[%d]", at, i))...)
			}
		}
	}
	if anyOf := asSlice(s["anyOf"]); len(anyOf) > 0 {
		matched := false
		for _, alt := range anyOf {
			if len(schemaCheck(root, alt.(map[string]any), v, at)) == 0 {
				matched = true
			}
		}
		if !matched {
			bad("matches none of anyOf")
		}
	}
	return errs
}

func asSlice(v any) []any { s, _ := v.([]any); return s }

// hasType reports whether a decoded JSON value has a JSON Schema type.
func hasType(v any, typ string) bool {
	switch typ {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "integer":
		n, ok := v.(float64)
		return ok && n == float64(int64(n))
	case "number":
		_, ok := v.(float64)
		return ok
	}
	return false
}

func TestJSONExamplesConformToTheJobSchema(t *testing.T) {
	schema := readSchema(t, "job.schema.json")
	for _, name := range slices.Sorted(maps.Keys(examples)) {
		if !strings.HasSuffix(name, ".json") || strings.HasPrefix(name, "invalid-trailing") {
			continue // xRSL, or not a single JSON value
		}
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", name))
			if err != nil {
				t.Fatal(err)
			}
			var v any
			if err := json.Unmarshal(data, &v); err != nil {
				t.Fatal(err)
			}
			errs := schemaCheck(schema, schema, v, "job")
			if examples[name] == nil && len(errs) > 0 {
				t.Errorf("valid example breaks the schema: %q", errs)
			}
			if examples[name] != nil && len(errs) == 0 {
				t.Errorf("invalid example passes the schema; the schema is looser than ParseJSON/Validate")
			}
		})
	}
}

func TestNormalizedJobsConformToTheJobSchema(t *testing.T) {
	schema := readSchema(t, "job.schema.json")
	for _, name := range []string{"valid-full.json", "valid-minimal.json", "valid-arc.xrsl"} {
		j, err := load(t, name)
		if err != nil {
			t.Fatal(err)
		}
		if errs := schemaCheck(schema, schema, roundTrip(t, j), "job"); len(errs) > 0 {
			t.Errorf("%s: the marshalled job breaks the schema: %q", name, errs)
		}
	}
}

func TestGeneratedDTRsConformToTheDTRSchema(t *testing.T) {
	schema := readSchema(t, "dtr.schema.json")
	j, err := load(t, "valid-full.json")
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range j.DTRs(time.Now()) {
		if errs := schemaCheck(schema, schema, roundTrip(t, d.Submission()), "dtr"); len(errs) > 0 {
			t.Errorf("DTR %d breaks the schema: %q", i, errs)
		}
	}
}

func TestDTRSchemaRejectsBadSubmissions(t *testing.T) {
	schema := readSchema(t, "dtr.schema.json")
	const id = `"id": "0b6c4b8e-9c1f-4a51-8f5e-2f8f2d8a6c11"`
	tests := []struct {
		name, in string
		ok       bool
	}{
		{"the three required fields are enough", `{` + id + `, "source": "https://h/a", "destination": "file:///a"}`, true},
		{"every optional field", `{` + id + `, "job_id": "j", "source": "https://h/a", "destination": "file:///a",
			"owner": {"dn": "/CN=x", "fqans": ["/atlas"]}, "direction": "download", "user_priority": 100,
			"options": {"checksum": "ADLER32:01", "overwrite": true, "failure_allowed": false}}`, true},
		{"a missing id", `{"source": "https://h/a", "destination": "file:///a"}`, false},
		{"an id that is not a UUID", `{"id": "abc", "source": "https://h/a", "destination": "file:///a"}`, false},
		{"a missing destination", `{` + id + `, "source": "https://h/a"}`, false},
		{"an unknown scheme", `{` + id + `, "source": "ftp://h/a", "destination": "file:///a"}`, false},
		{"an unknown direction", `{` + id + `, "source": "https://h/a", "destination": "file:///a", "direction": "sideways"}`, false},
		{"user_priority 0", `{` + id + `, "source": "https://h/a", "destination": "file:///a", "user_priority": 0}`, false},
		{"user_priority 101", `{` + id + `, "source": "https://h/a", "destination": "file:///a", "user_priority": 101}`, false},
		{"a scheduler-owned field", `{` + id + `, "source": "https://h/a", "destination": "file:///a", "share": "atlas"}`, false},
		{"a state other than NEW", `{` + id + `, "source": "https://h/a", "destination": "file:///a", "state": "DONE"}`, false},
		{"a bad checksum type", `{` + id + `, "source": "https://h/a", "destination": "file:///a", "options": {"checksum": "crc:1"}}`, false},
		{"a job id that cannot be a job's", `{` + id + `, "job_id": "a job", "source": "https://h/a", "destination": "file:///a"}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var v any
			if err := json.Unmarshal([]byte(tt.in), &v); err != nil {
				t.Fatal(err)
			}
			errs := schemaCheck(schema, schema, v, "dtr")
			if tt.ok != (len(errs) == 0) {
				t.Errorf("schema problems = %q, want ok=%v", errs, tt.ok)
			}
			// What the schema accepts, the DTR model must accept too.
			if tt.ok {
				var sub dtr.Submission
				if err := json.Unmarshal([]byte(tt.in), &sub); err != nil {
					t.Fatal(err)
				}
				if err := sub.DTR().Validate(); err != nil {
					t.Errorf("accepted by the schema but not by dtr.Validate: %v", err)
				}
			}
		})
	}
}

func TestSchemasNameExactlyTheGoFields(t *testing.T) {
	job := readSchema(t, "job.schema.json")
	dtrSchema := readSchema(t, "dtr.schema.json")
	defs := job["$defs"].(map[string]any)
	dtrProps := dtrSchema["properties"].(map[string]any)
	tests := []struct {
		name   string
		schema any
		typ    reflect.Type
		exact  bool // false: the schema may name a subset of the fields
	}{
		{"job", job, reflect.TypeFor[Job](), true},
		{"job file", defs["file"], reflect.TypeFor[File](), true},
		{"job owner", defs["identity"], reflect.TypeFor[dtr.Identity](), true},
		{"dtr", dtrSchema, reflect.TypeFor[dtr.Submission](), true},
		{"dtr owner", dtrProps["owner"], reflect.TypeFor[dtr.Identity](), true},
		{"dtr options", dtrProps["options"], reflect.TypeFor[dtr.Options](), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.schema.(map[string]any)
			if s["additionalProperties"] != false {
				t.Errorf("additionalProperties = %v, want false", s["additionalProperties"])
			}
			props := slices.Sorted(maps.Keys(s["properties"].(map[string]any)))
			fields := jsonNames(tt.typ)
			for _, p := range props {
				if !slices.Contains(fields, p) {
					t.Errorf("schema property %q is not a JSON field of %s (%v)", p, tt.typ, fields)
				}
			}
			if tt.exact && !slices.Equal(props, fields) {
				t.Errorf("schema properties %v, want the JSON fields of %s %v", props, tt.typ, fields)
			}
		})
	}
}

// jsonNames lists the JSON field names of a struct type, sorted.
func jsonNames(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		if name != "-" && f.IsExported() {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// roundTrip marshals v and decodes it generically, as a validator sees it.
func roundTrip(t *testing.T, v any) any {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}
