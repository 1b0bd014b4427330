package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzParseRefusesWithAReasonOrGivesAJobThatRoundTrips checks, for any
// bytes given as a job description (JSON or xRSL), that the parsers do not
// panic; that they return a job or an error, never both and never neither;
// that every refusal has a message and every reported position lies within
// the input; and that a job that parses and validates survives the trip
// through JSON that the generator gives it (stored, and read back by
// ParseJSON) unchanged, and makes only DTRs that validate.
func FuzzParseRefusesWithAReasonOrGivesAJobThatRoundTrips(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.*"))
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		`&(a=$(B)#"c"(d)^xex)`,
		`{"inputs":[{"source":"","destination":""}],"owner":{"fqans":[]}}`,
		`{"inputs":[{"source":"https://h/a","destination":"file:///s/a","replicas":["http://m/a"]}]}`,
		`{"inputs":[{"source":"https://u:pw@h/a","destination":"file:///s/a"}]}`,
		`{"outputs":[{"source":"file:///s/a","destination":"s3://h:9000/b/k","checksum":"md5:00"}],"priority":101}`,
		`{"id":"x.y","inputs":[]}` + "\n" + `{}`,
		"\xEF\xBB\xBF{\"inputs\":[{\"source\":\"root://h//a\",\"destination\":\"file:///s/a\"}]}",
		`&(inputfiles=("a" "https://h/a" "adler32:01"))(outputfiles=("b" "davs://h/b" "overwrite=yes"))`,
		`&(rsl_substitution=("S" "https://h"))(inputfiles=("../x" $(S)#"/a"))`,
		`&(inputfiles=("a" "s3s://h/b/k")("a" "http://h/c"))(priority=0)`,
		`+(&(a=b))(&(c=d))`,
		`(* unclosed`,
		`&(jobname='it''s')(inputfiles=(^"a"^ "file:///x/a"))`,
		"&(inputfiles=(\"a\xff\" \"http://h/\xfe\"))",
		"{\"name\":\"\xff\",\"inputs\":[{\"source\":\"http://h/\xff\",\"destination\":\"file:///a\"}]}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		j, err := Parse(data, XRSLOptions{SessionDir: "/s"})
		checkPositions(t, data, err)
		if (j == nil) == (err == nil) {
			t.Fatalf("Parse gave job %v and error %v: want exactly one", j, err)
		}
		if err != nil {
			if err.Error() == "" {
				t.Fatal("a refusal with an empty message")
			}
			return
		}
		j.Normalize()
		if err := j.Validate(); err != nil {
			if err.Error() == "" {
				t.Fatal("Validate refused with an empty message")
			}
			return
		}
		for _, d := range j.DTRs(time.Now()) {
			if err := d.Validate(); err != nil {
				t.Fatalf("a valid job made an invalid DTR: %v", err)
			}
		}
		// The generator stores the job as JSON and reads it back.
		b, err := json.Marshal(j)
		if err != nil {
			t.Fatalf("a valid job does not encode: %v", err)
		}
		back, err := ParseJSON(b)
		if err != nil {
			t.Fatalf("a valid job's own JSON is refused: %v\n%s", err, b)
		}
		if err := back.Validate(); err != nil {
			t.Fatalf("a valid job is invalid after a trip through JSON: %v\n%s", err, b)
		}
		b2, _ := json.Marshal(back)
		if !bytes.Equal(b, b2) {
			t.Fatalf("the job changed on a trip through JSON:\n%s\n%s", b, b2)
		}
		if !equalJobs(j, back) {
			t.Fatalf("the job changed on a trip through JSON:\n%+v\n%+v", j, back)
		}
	})
}

// equalJobs compares two jobs field by field, an empty list equal to none.
func equalJobs(a, b *Job) bool {
	eq := func(x, y []string) bool {
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	}
	files := func(x, y []File) bool {
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			p, q := x[i], y[i]
			if p.Source != q.Source || p.Destination != q.Destination || p.Checksum != q.Checksum ||
				p.Overwrite != q.Overwrite || p.FailureAllowed != q.FailureAllowed || p.Stage != q.Stage ||
				p.NoCache != q.NoCache || !eq(p.Replicas, q.Replicas) {
				return false
			}
		}
		return true
	}
	return a.ID == b.ID && a.Name == b.Name && a.Priority == b.Priority && a.Owner.DN == b.Owner.DN &&
		eq(a.Owner.FQANs, b.Owner.FQANs) && files(a.Inputs, b.Inputs) && files(a.Outputs, b.Outputs)
}

// checkPositions fails if a ParseError in err points outside data.
func checkPositions(t *testing.T, data []byte, err error) {
	t.Helper()
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else if err != nil {
		list = []error{err}
	}
	for _, e := range list {
		var pe *ParseError
		if errors.As(e, &pe) && (pe.Offset < 0 || pe.Offset > len(data) || pe.Line < 1 || pe.Column < 1) {
			t.Fatalf("position out of range in %v (input %d bytes)", pe, len(data))
		}
		if e.Error() == "" {
			t.Fatal("a problem with an empty message")
		}
	}
}
