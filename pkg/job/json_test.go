package job

import (
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

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
