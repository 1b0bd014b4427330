package job

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// validJob returns a small job that passes Validate.
func validJob() *Job {
	return &Job{
		ID:       "job-1",
		Priority: 60,
		Inputs: []File{{
			Source:      "https://data.example.org/a",
			Destination: "file:///sess/a",
		}},
		Outputs: []File{{
			Source:      "file:///sess/out",
			Destination: "https://store.example.org/out",
		}},
	}
}

// problems splits an error from errors.Join into its messages.
func problems(err error) []string {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []string
		for _, e := range j.Unwrap() {
			out = append(out, e.Error())
		}
		return out
	}
	return []string{err.Error()}
}

func TestNormalize(t *testing.T) {
	tests := []struct {
		name         string
		job          Job
		keepID       bool
		wantPriority int
	}{
		{"assigns a UUID v4 ID and the default priority to an empty job", Job{}, false, DefaultPriority},
		{"keeps a given ID and priority", Job{ID: "mine", Priority: 7}, true, 7},
		{"keeps priority 100", Job{Priority: 100}, false, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := tt.job
			j.Normalize()
			if tt.keepID {
				if j.ID != tt.job.ID {
					t.Errorf("ID = %q, want %q kept", j.ID, tt.job.ID)
				}
			} else {
				u, err := uuid.Parse(j.ID)
				if err != nil || u.Version() != 4 || u.String() != j.ID {
					t.Errorf("ID = %q, want a canonical UUID v4 (err %v)", j.ID, err)
				}
			}
			if j.Priority != tt.wantPriority {
				t.Errorf("Priority = %d, want %d", j.Priority, tt.wantPriority)
			}
			again := j
			again.Normalize()
			if again.ID != j.ID || again.Priority != j.Priority {
				t.Errorf("Normalize is not idempotent: %+v then %+v", j, again)
			}
		})
	}
}

func TestNormalizeGivesEachJobItsOwnID(t *testing.T) {
	var a, b Job
	a.Normalize()
	b.Normalize()
	if a.ID == b.ID {
		t.Fatalf("two jobs got the same ID %q", a.ID)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(j *Job)
		want   []string // one substring per expected problem, in order; nil means valid
	}{
		{"a complete job is valid", func(*Job) {}, nil},
		{"an empty owner is allowed", func(j *Job) { j.Owner = dtr.Identity{} }, nil},
		{"an owner with DN and FQANs is allowed", func(j *Job) {
			j.Owner = dtr.Identity{DN: "/CN=Jane", FQANs: []string{"/atlas/Role=production"}}
		}, nil},
		{"priority 0 means default and is allowed", func(j *Job) { j.Priority = 0 }, nil},
		{"priorities 1 and 100 are allowed", func(j *Job) { j.Priority = 100 }, nil},
		{"a job with only outputs is valid", func(j *Job) { j.Inputs = nil }, nil},
		{"a 64-character ID is allowed", func(j *Job) { j.ID = strings.Repeat("a", 64) }, nil},
		{"an upper-case checksum type is accepted", func(j *Job) { j.Inputs[0].Checksum = "MD5:0CC175B9C0F1B6A831C399E269772661" }, nil},
		{"file://localhost URLs are accepted", func(j *Job) { j.Inputs[0].Destination = "file://localhost/sess/a" }, nil},

		{"tpc only between two https storages is allowed", func(j *Job) {
			j.Inputs[0].Destination, j.Inputs[0].TPC = "https://b.example/a", dtr.TPCOnly
		}, nil},
		{"tpc only with a local destination is reported", func(j *Job) { j.Inputs[0].TPC = dtr.TPCOnly },
			[]string{"inputs[0].tpc: only, but the destination is file://, which has no third-party copy"}},
		{"an empty ID is reported", func(j *Job) { j.ID = "" }, []string{"id is empty"}},
		{"an ID longer than 64 characters is reported", func(j *Job) { j.ID = strings.Repeat("a", 65) },
			[]string{`id "` + strings.Repeat("a", 65) + `" is not 1–64 characters`}},
		{"an ID with a slash is reported", func(j *Job) { j.ID = "a/b" }, []string{`id "a/b" is not 1–64 characters`}},
		{"an ID with a dot is reported (the generator uses dots in its keys)", func(j *Job) { j.ID = "a.files" }, []string{`id "a.files" is not 1–64 characters`}},
		{"priority above 100 is reported", func(j *Job) { j.Priority = 101 }, []string{"priority 101 is outside 1–100"}},
		{"negative priority is reported", func(j *Job) { j.Priority = -1 }, []string{"priority -1 is outside 1–100"}},
		{"an FQAN without a leading slash is reported", func(j *Job) { j.Owner.FQANs = []string{"/ok", "atlas"} },
			[]string{`owner.fqans[1]: FQAN "atlas" does not start with "/"`}},
		{"a job without files is reported", func(j *Job) { j.Inputs, j.Outputs = nil, nil },
			[]string{"the job has no input or output files"}},
		{"an unknown scheme names the field, URL and scheme", func(j *Job) { j.Inputs[0].Source = "ftp://x" },
			[]string{`inputs[0].source: URL "ftp://x": scheme "ftp" is not one of file, http, https`}},
		{"an empty URL is reported", func(j *Job) { j.Outputs[0].Destination = "" },
			[]string{"outputs[0].destination: URL is empty"}},
		{"a relative file URL is reported", func(j *Job) { j.Inputs[0].Destination = "file:sess/a" },
			[]string{`inputs[0].destination: URL "file:sess/a": a file URL needs an absolute path`}},
		{"a remote file URL is reported", func(j *Job) { j.Inputs[0].Destination = "file://otherhost/a" },
			[]string{`inputs[0].destination: URL "file://otherhost/a": file URLs must be local`}},
		{"an http URL without host is reported", func(j *Job) { j.Inputs[0].Source = "https:///a" },
			[]string{`inputs[0].source: URL "https:///a": no host`}},
		{"a source equal to its destination is reported", func(j *Job) { j.Outputs[0].Destination = "file:///sess/out" },
			[]string{`outputs[0]: source and destination are the same URL "file:///sess/out"`}},
		{"a source equal to its destination in another spelling is reported", func(j *Job) {
			j.Outputs[0].Destination = "file://localhost/sess//out"
		}, []string{`outputs[0]: source and destination are the same URL`}},
		{"two inputs with the same destination are reported", func(j *Job) {
			j.Inputs = append(j.Inputs, File{Source: "https://data.example.org/b", Destination: "file:///sess/a"})
		}, []string{`inputs[1].destination: URL "file:///sess/a" is also the destination of inputs[0]`}},
		{"an output with an input's destination is reported", func(j *Job) {
			j.Outputs[0].Destination = "FILE:///sess/./a"
			j.Outputs[0].Source = "file:///sess/out"
		}, []string{`outputs[0].destination: URL "FILE:///sess/./a" is also the destination of inputs[0]`}},
		{"a checksum without a value is reported", func(j *Job) { j.Inputs[0].Checksum = "adler32" },
			[]string{`inputs[0].checksum: checksum "adler32" is not type:value`}},
		{"a checksum of an unknown type is reported", func(j *Job) { j.Outputs[0].Checksum = "crc32:1234" },
			[]string{`outputs[0].checksum: checksum "crc32:1234": type "crc32" is not one of adler32, md5, sha256`}},
		{"a checksum whose value is not hexadecimal is reported", func(j *Job) { j.Inputs[0].Checksum = "md5:not-a-digest" },
			[]string{`inputs[0].checksum: checksum "md5:not-a-digest": md5 values are 32 hexadecimal digits`}},
		{"a sha256 checksum too short is reported", func(j *Job) { j.Inputs[0].Checksum = "sha256:1234" },
			[]string{`sha256 values are 64 hexadecimal digits`}},
		{"an adler32 checksum too long is reported", func(j *Job) { j.Inputs[0].Checksum = "adler32:123456789" },
			[]string{`adler32 values are 1 to 8 hexadecimal digits`}},
		{"an adler32 checksum without its leading zeros is accepted", func(j *Job) { j.Inputs[0].Checksum = "adler32:3da0195" }, nil},
		{"a file destination with a query names the same file as without", func(j *Job) {
			j.Inputs = append(j.Inputs, File{Source: "https://data.example.org/b", Destination: "file:///sess/a?copy=2"})
		}, []string{`inputs[1].destination: URL "file:///sess/a?copy=2" is also the destination of inputs[0]`}},
		{"a destination with its scheme's default port is the one without", func(j *Job) {
			j.Outputs = append(j.Outputs, File{Source: "file:///sess/out2", Destination: "https://store.example.org:443/out"},
				File{Source: "file:///sess/out3", Destination: "http://store.example.org:80/x"},
				File{Source: "file:///sess/out4", Destination: "http://store.example.org/x"})
		}, []string{`outputs[1].destination: URL "https://store.example.org:443/out" is also the destination of outputs[0]`,
			`outputs[3].destination: URL "http://store.example.org/x" is also the destination of outputs[2]`}},
		{"an http destination with a query is another object", func(j *Job) {
			j.Outputs = append(j.Outputs, File{Source: "file:///sess/out2", Destination: "https://store.example.org/out?part=2"})
		}, nil},
		{"all problems are reported together", func(j *Job) {
			j.ID = ""
			j.Priority = 500
			j.Inputs[0].Source = "gsiftp://x/a"
			j.Outputs[0].Checksum = "sha1:abc"
		}, []string{"id is empty", "priority 500", `inputs[0].source: URL "gsiftp://x/a"`, `outputs[0].checksum`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := validJob()
			tt.modify(j)
			got := problems(j.Validate())
			if len(got) != len(tt.want) {
				t.Fatalf("Validate() problems = %q, want %d matching %q", got, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

func TestDTRsMakesOneDTRPerFileInputsFirst(t *testing.T) {
	now := time.Date(2024, 3, 17, 12, 0, 0, 0, time.UTC)
	j := &Job{
		ID:       "job-1",
		Owner:    dtr.Identity{DN: "/CN=Jane", FQANs: []string{"/atlas/Role=production"}},
		Priority: 70,
		Inputs: []File{
			{Source: "https://d.example.org/a", Destination: "file:///s/a", Checksum: "adler32:01020304"},
			{Source: "https://d.example.org/b", Destination: "file:///s/b", FailureAllowed: true},
		},
		Outputs: []File{
			{Source: "file:///s/out", Destination: "https://store.example.org/out", Overwrite: true},
		},
	}
	got := j.DTRs(now)
	want := []struct {
		src, dst string
		dir      dtr.Direction
		opts     dtr.Options
	}{
		{"https://d.example.org/a", "file:///s/a", dtr.Download, dtr.Options{Checksum: "adler32:01020304"}},
		{"https://d.example.org/b", "file:///s/b", dtr.Download, dtr.Options{FailureAllowed: true}},
		{"file:///s/out", "https://store.example.org/out", dtr.Upload, dtr.Options{Overwrite: true}},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d DTRs, want %d", len(got), len(want))
	}
	ids := map[uuid.UUID]bool{}
	for i, d := range got {
		w := want[i]
		if d.Source != w.src || d.Destination != w.dst || d.Direction != w.dir || d.Options != w.opts {
			t.Errorf("DTR %d = %s → %s %s %+v, want %s → %s %s %+v", i,
				d.Source, d.Destination, d.Direction, d.Options, w.src, w.dst, w.dir, w.opts)
		}
		if d.JobID != "job-1" || d.UserPriority != 70 || d.State != dtr.New {
			t.Errorf("DTR %d: JobID %q, UserPriority %d, State %s; want job-1, 70, NEW", i, d.JobID, d.UserPriority, d.State)
		}
		if !d.Created.Equal(now) || !d.Updated.Equal(now) {
			t.Errorf("DTR %d: Created %v, Updated %v; want both %v", i, d.Created, d.Updated, now)
		}
		if d.Owner.DN != "/CN=Jane" || len(d.Owner.FQANs) != 1 || d.Owner.FQANs[0] != "/atlas/Role=production" {
			t.Errorf("DTR %d: Owner = %+v, want the job's owner", i, d.Owner)
		}
		if d.ID == uuid.Nil || ids[d.ID] {
			t.Errorf("DTR %d: ID %v is nil or repeated", i, d.ID)
		}
		ids[d.ID] = true
		if err := d.Validate(); err != nil {
			t.Errorf("DTR %d does not pass dtr.Validate: %v", i, err)
		}
	}
}

func TestDTRsDoNotShareTheOwnersFQANs(t *testing.T) {
	j := validJob()
	j.Owner.FQANs = []string{"/atlas"}
	ds := j.DTRs(time.Now())
	ds[0].Owner.FQANs[0] = "/changed"
	if j.Owner.FQANs[0] != "/atlas" || ds[1].Owner.FQANs[0] != "/atlas" {
		t.Fatalf("changing one DTR's FQANs changed the job's (%q) or another DTR's (%q)", j.Owner.FQANs, ds[1].Owner.FQANs)
	}
}

func TestDTRsOfAJobWithoutFilesIsEmpty(t *testing.T) {
	if got := (&Job{ID: "x"}).DTRs(time.Now()); len(got) != 0 {
		t.Fatalf("got %d DTRs, want none", len(got))
	}
}

func TestParsePicksTheFormat(t *testing.T) {
	opt := XRSLOptions{SessionDir: "/sess"}
	tests := []struct {
		name     string
		in       string
		wantName string
		wantErr  string
	}{
		{"an object is read as JSON", `{"name": "j", "outputs": []}`, "j", ""},
		{"leading white space is skipped", "\n\t  {\"name\": \"j\"}", "j", ""},
		{"a byte order mark is skipped", "\xEF\xBB\xBF{\"name\": \"j\"}", "j", ""},
		{"a conjunction is read as xRSL", `&(jobname = "x")`, "x", ""},
		{"a leading comment is read as xRSL", "(* my job *)\n&(jobname = x)", "x", ""},
		{"a multi-job xRSL is read as xRSL and refused there", `+(&(jobname=a))(&(jobname=b))`, "", "multi-job description"},
		{"an empty description is neither", "  \n", "", "the description is empty"},
		{"XML is neither", `<job/>`, "", `it starts with '<' at line 1, column 1, but JSON starts with '{' and xRSL with '&' or '('`},
		{"a JSON array is neither", "\n [1]", "", `it starts with '[' at line 2, column 2`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, err := Parse([]byte(tt.in), opt)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if j.Name != tt.wantName {
				t.Errorf("Name = %q, want %q", j.Name, tt.wantName)
			}
		})
	}
}

func TestParseReportsUnknownFormatAsErrUnknownFormat(t *testing.T) {
	for _, in := range []string{"", "hello", "<job/>", "[]"} {
		if _, err := Parse([]byte(in), XRSLOptions{}); !errors.Is(err, ErrUnknownFormat) {
			t.Errorf("Parse(%q) error = %v, want ErrUnknownFormat", in, err)
		}
	}
}

func TestParsersStopAfterMaxProblems(t *testing.T) {
	var js, xs strings.Builder
	js.WriteString("{")
	xs.WriteString("&(inputfiles = ")
	for i := range 150 {
		if i > 0 {
			js.WriteString(",")
		}
		fmt.Fprintf(&js, `"bad%d": 1`, i)
		fmt.Fprintf(&xs, `("../f%d" "https://h/f")`, i)
	}
	js.WriteString("}")
	xs.WriteString(")")
	for _, in := range []string{js.String(), xs.String()} {
		_, err := Parse([]byte(in), XRSLOptions{SessionDir: "/s"})
		got := problems(err)
		if len(got) != maxProblems+1 || !errors.Is(err, errTooMany) {
			t.Errorf("%.20s...: %d problems, want %d ending with %q", in, len(got), maxProblems+1, errTooMany)
		}
	}
}

// A description with a byte that is not UTF-8 is refused at that byte, in
// either format: taken, the URL would become another (with U+FFFD) once
// the job is stored as JSON.
func TestDescriptionsThatAreNotUTF8AreRefusedAtTheBadByte(t *testing.T) {
	tests := []struct {
		name, in string
		want     string // "" means accepted
	}{
		{"xRSL with a bad byte in a URL", "&(inputfiles=(\"a\" \"http://h/\xff\"))",
			`xrsl line 1, column 29 (byte 28): byte 0xFF is not UTF-8`},
		{"xRSL with a bad byte in a comment", "(* \xfe *)\n&(inputfiles=(\"a\" \"http://h/a\"))",
			`xrsl line 1, column 4 (byte 3): byte 0xFE is not UTF-8`},
		{"JSON with a bad byte in a URL", "{\"inputs\":[{\"source\":\"http://h/\xc3\",\"destination\":\"file:///a\"}]}",
			`json line 1, column 32 (byte 31): byte 0xC3 is not UTF-8`},
		{"JSON with a bad byte on the second line", "{\n\"name\":\"\xe2\x82\",\"inputs\":[{\"source\":\"http://h/a\",\"destination\":\"file:///a\"}]}",
			`json line 2, column 9 (byte 10): byte 0xE2 is not UTF-8`},
		{"JSON with UTF-8 text and a byte order mark", "\xEF\xBB\xBF{\"name\":\"réco\",\"inputs\":[{\"source\":\"http://h/é\",\"destination\":\"file:///a\"}]}", ""},
		{"xRSL with UTF-8 text", "&(jobname=\"réco\")(inputfiles=(\"é\" \"http://h/é\"))", ""},
		{"a percent-encoded byte", "&(inputfiles=(\"a\" \"http://h/%FF\"))", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, err := Parse([]byte(tt.in), XRSLOptions{SessionDir: "/s"})
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				j.Normalize()
				if err := j.Validate(); err != nil {
					t.Fatalf("invalid: %v", err)
				}
				return
			}
			var pe *ParseError
			if err == nil || !errors.As(err, &pe) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want a *ParseError saying %q", err, tt.want)
			}
		})
	}
}

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
