package job

import (
	"bytes"
	"encoding/json"
	"errors"
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

func TestParseJSONAccepts(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Job
	}{
		{
			name: "every field",
			in: `{"id": "j1", "name": "n", "owner": {"dn": "/CN=Jane", "fqans": ["/atlas"]}, "priority": 9,
				"inputs": [{"source": "https://h/a", "destination": "file:///s/a", "checksum": "md5:00", "overwrite": true, "failure_allowed": true}],
				"outputs": [{"source": "file:///s/b", "destination": "https://h/b"}]}`,
			want: Job{
				ID: "j1", Name: "n", Priority: 9,
				Owner:   dtr.Identity{DN: "/CN=Jane", FQANs: []string{"/atlas"}},
				Inputs:  []File{{Source: "https://h/a", Destination: "file:///s/a", Checksum: "md5:00", Overwrite: true, FailureAllowed: true}},
				Outputs: []File{{Source: "file:///s/b", Destination: "https://h/b"}},
			},
		},
		{
			name: "an empty object, which Validate then refuses",
			in:   `{}`,
			want: Job{},
		},
		{
			name: "trailing white space",
			in:   "{\"name\": \"x\"}\n\n\t ",
			want: Job{Name: "x"},
		},
		{
			name: "an empty owner and empty lists",
			in:   `{"owner": {}, "inputs": [], "outputs": []}`,
			want: Job{Inputs: []File{}, Outputs: []File{}},
		},
		{
			name: "non-ASCII text and escapes",
			in:   `{"name": "Jörð \u00e9\n", "owner": {"dn": "/CN=Åsa"}}`,
			want: Job{Name: "Jörð é\n", Owner: dtr.Identity{DN: "/CN=Åsa"}},
		},
		{
			name: "a negative priority, which Validate then refuses",
			in:   `{"priority": -3}`,
			want: Job{Priority: -3},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseJSON([]byte(tt.in))
			if err != nil {
				t.Fatalf("ParseJSON: %v", err)
			}
			if !reflect.DeepEqual(*got, tt.want) {
				t.Errorf("ParseJSON = %+v, want %+v", *got, tt.want)
			}
		})
	}
}

func TestParseJSONRejects(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string // one substring per expected problem, in order
	}{
		{"an unknown top-level field, naming it and suggesting the right one", `{"prioirty": 1}`,
			[]string{`json line 1, column 2 (byte 1): job: unknown field "prioirty" (did you mean "priority"?)`}},
		{"an unknown field far from any known one, listing the known ones", `{"walltime": 60}`,
			[]string{`job: unknown field "walltime" (known fields: id, inputs, name, outputs, owner, priority)`}},
		{"an unknown field in a file, naming its path", `{"inputs": [{"source": "https://h/a", "destination": "file:///a"}, {"src": "x"}]}`,
			[]string{`inputs[1]: unknown field "src"`}},
		{"an unknown field in the owner", `{"owner": {"dn": "x", "vo": "atlas"}}`,
			[]string{`owner: unknown field "vo"`}},
		{"a field in the wrong case", `{"outputs": [{"Source": "file:///a"}]}`,
			[]string{`outputs[0]: unknown field "Source" (did you mean "source"?)`}},
		{"a field given twice", "{\"name\": \"a\",\n \"name\": \"b\"}",
			[]string{`json line 2, column 2 (byte 15): job: field "name" is given twice (first at line 1, column 2)`}},
		{"a string where an integer belongs", `{"priority": "high"}`,
			[]string{`priority: expected an integer, found string "high"`}},
		{"a fraction where an integer belongs", `{"priority": 50.5}`,
			[]string{`priority: expected an integer, found 50.5`}},
		{"an integer too large", `{"priority": 99999999999999999999}`,
			[]string{`priority: expected an integer, found 99999999999999999999`}},
		{"a string where a boolean belongs", `{"inputs": [{"overwrite": "yes"}]}`,
			[]string{`inputs[0].overwrite: expected true or false, found string "yes"`}},
		{"null where a string belongs", `{"name": null}`,
			[]string{`name: expected a string, found null`}},
		{"an object where a list belongs", `{"inputs": {"source": "x"}}`,
			[]string{`inputs: expected an array, found an object`}},
		{"a number inside the FQAN list", `{"owner": {"fqans": ["/a", 7]}}`,
			[]string{`owner.fqans[1]: expected a string, found number 7`}},
		{"a top-level array", `[{"name": "x"}]`,
			[]string{`job: expected an object, found an array`}},
		{"a second object after the first", "{\"name\": \"a\"}\n{\"name\": \"b\"}",
			[]string{`json line 2, column 1 (byte 14): unexpected '{' after the end of the job object`}},
		{"garbage after the object", `{"name": "a"} x`,
			[]string{`unexpected 'x' after the end of the job object`}},
		{"a missing comma, with its position", "{\"name\": \"a\"\n \"id\": \"b\"}",
			[]string{`json line 2, column 2 (byte 14): malformed JSON: invalid character '"' after object key:value pair`}},
		{"a truncated object", `{"name": "a", "inputs": [`,
			[]string{`malformed JSON: unexpected end of input`}},
		{"an empty description", ``,
			[]string{`the description is empty`}},
		{"several problems, all reported", `{"nmae": "a", "priority": true, "inputs": [{"source": 1, "dest": "x"}]}`,
			[]string{`unknown field "nmae" (did you mean "name"?)`, `priority: expected an integer, found true`,
				`inputs[0].source: expected a string, found number 1`, `inputs[0]: unknown field "dest"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, err := ParseJSON([]byte(tt.in))
			if err == nil {
				t.Fatalf("ParseJSON = %+v, want an error", j)
			}
			got := problems(err)
			if len(got) != len(tt.want) {
				t.Fatalf("problems = %q, want %d matching %q", got, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d = %q, want it to contain %q", i, got[i], w)
				}
			}
			var pe *ParseError
			if !errors.As(err, &pe) || pe.Format != "json" {
				t.Errorf("error %v is not a json *ParseError", err)
			}
		})
	}
}

func TestParseJSONErrorGivesLineAndColumn(t *testing.T) {
	in := "{\n  \"inputs\": [\n    {\"source\": \"https://h/a\", \"destinaton\": \"file:///a\"}\n  ]\n}"
	_, err := ParseJSON([]byte(in))
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v is not a *ParseError", err)
	}
	if pe.Line != 3 || pe.Column != 31 || pe.Offset != strings.Index(in, `"destinaton"`) {
		t.Errorf("position = line %d, column %d, byte %d; want line 3, column 31, byte %d",
			pe.Line, pe.Column, pe.Offset, strings.Index(in, `"destinaton"`))
	}
	if !strings.Contains(pe.Msg, `did you mean "destination"?`) {
		t.Errorf("Msg = %q, want a suggestion of \"destination\"", pe.Msg)
	}
}

func TestJSONShapesNameExactlyTheGoFields(t *testing.T) {
	tests := []struct {
		name string
		sh   *shape
		typ  reflect.Type
	}{
		{"job", jobShape, reflect.TypeFor[Job]()},
		{"file", fileShape, reflect.TypeFor[File]()},
		{"owner", jobShape.fields["owner"], reflect.TypeFor[dtr.Identity]()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := slices.Sorted(maps.Keys(tt.sh.fields))
			if want := jsonNames(tt.typ); !slices.Equal(got, want) {
				t.Errorf("ParseJSON knows fields %v, but %s has %v", got, tt.typ, want)
			}
		})
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
