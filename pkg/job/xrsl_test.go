package job

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestParseXRSLAccepts(t *testing.T) {
	opt := XRSLOptions{SessionDir: "/sess/j1"}
	in := func(src, name string) File { return File{Source: src, Destination: "file:///sess/j1/" + name} }
	out := func(name, dst string) File { return File{Source: "file:///sess/j1/" + name, Destination: dst} }
	tests := []struct {
		name string
		in   string
		want Job
	}{
		{
			name: "an input is fetched into the session directory",
			in:   `&(inputfiles = ("data.in" "https://h/data"))`,
			want: Job{Inputs: []File{in("https://h/data", "data.in")}},
		},
		{
			name: "an output is sent from the session directory",
			in:   `&(outputfiles = ("result" "https://h/result"))`,
			want: Job{Outputs: []File{out("result", "https://h/result")}},
		},
		{
			name: "several entries, with or without space between them",
			in:   `&(inputfiles=("a" "https://h/a")("b" "https://h/b") ("c" "https://h/c"))`,
			want: Job{Inputs: []File{in("https://h/a", "a"), in("https://h/b", "b"), in("https://h/c", "c")}},
		},
		{
			name: "jobname and priority",
			in:   `&(jobname = "reco 42")(priority = 80)`,
			want: Job{Name: "reco 42", Priority: 80},
		},
		{
			name: "attribute names ignore case and underscores",
			in:   `&(JobName = x)(PRIORITY = 3)(Input_Files = ("a" "https://h/a"))`,
			want: Job{Name: "x", Priority: 3, Inputs: []File{in("https://h/a", "a")}},
		},
		{
			name: "an input with an empty URL is uploaded by the user and skipped",
			in:   `&(inputfiles = ("run.sh" "") ("a" "https://h/a"))`,
			want: Job{Inputs: []File{in("https://h/a", "a")}},
		},
		{
			name: "an input given as size or size.checksum is uploaded by the user and skipped",
			in:   `&(inputfiles = ("x" "1024") ("y" "2048.6f2d0a1b") ("a" "https://h/a"))`,
			want: Job{Inputs: []File{in("https://h/a", "a")}},
		},
		{
			name: "an output with an empty URL stays in the session directory and is skipped",
			in:   `&(outputfiles = ("log" "") ("r" "https://h/r"))`,
			want: Job{Outputs: []File{out("r", "https://h/r")}},
		},
		{
			name: "a third element is the expected checksum",
			in:   `&(inputfiles = ("a" "https://h/a" "adler32:6f2d0a1b"))(outputfiles = ("r" "https://h/r" "md5:00ff"))`,
			want: Job{
				Inputs:  []File{{Source: "https://h/a", Destination: "file:///sess/j1/a", Checksum: "adler32:6f2d0a1b"}},
				Outputs: []File{{Source: "file:///sess/j1/r", Destination: "https://h/r", Checksum: "md5:00ff"}},
			},
		},
		{
			name: "the ARC option overwrite=yes sets Overwrite and other options are ignored",
			in:   `&(outputfiles = ("r" "https://h/r" "overwrite=yes" "threads=4"))(inputfiles = ("a" "https://h/a" "cache=renew" "sha256:ab"))`,
			want: Job{
				Inputs:  []File{{Source: "https://h/a", Destination: "file:///sess/j1/a", Checksum: "sha256:ab"}},
				Outputs: []File{{Source: "file:///sess/j1/r", Destination: "https://h/r", Overwrite: true}},
			},
		},
		{
			name: "the Sluice option stage=yes sets Stage",
			in:   `&(inputfiles = ("a" "https://h/a" "stage=yes") ("b" "https://h/b" "stage=no"))`,
			want: Job{
				Inputs: []File{{Source: "https://h/a", Destination: "file:///sess/j1/a", Stage: true},
					{Source: "https://h/b", Destination: "file:///sess/j1/b"}},
			},
		},
		{
			name: "the ARC option cache=no sets NoCache; cache=yes and the cache modes Sluice has not leave it; the last one counts",
			in:   `&(inputfiles = ("a" "https://h/a" "cache=no") ("b" "https://h/b" "cache=yes") ("c" "https://h/c" "cache=copy") ("d" "https://h/d" "CACHE=No") ("e" "https://h/e" "cache=no" "cache=yes"))`,
			want: Job{
				Inputs: []File{{Source: "https://h/a", Destination: "file:///sess/j1/a", NoCache: true},
					{Source: "https://h/b", Destination: "file:///sess/j1/b"}, {Source: "https://h/c", Destination: "file:///sess/j1/c"},
					{Source: "https://h/d", Destination: "file:///sess/j1/d", NoCache: true}, {Source: "https://h/e", Destination: "file:///sess/j1/e"}},
			},
		},
		{
			name: "names may have subdirectories and are escaped in the URL",
			in:   `&(inputfiles = ("data/run 1.root" "https://h/a") ("./b" "https://h/b"))`,
			want: Job{Inputs: []File{in("https://h/a", "data/run%201.root"), in("https://h/b", "b")}},
		},
		{
			name: "quoted strings with doubled quotes",
			in:   `&(jobname = "say ""hi"" and 'bye'")(executable = 'it''s')`,
			want: Job{Name: `say "hi" and 'bye'`},
		},
		{
			name: "a single-quoted value",
			in:   `&(jobname = 'it''s "mine"')`,
			want: Job{Name: `it's "mine"`},
		},
		{
			name: "a string with a delimiter of the user's choice",
			in:   `&(jobname = ^|a "b" 'c'|)`,
			want: Job{Name: `a "b" 'c'`},
		},
		{
			name: "comments are skipped everywhere between tokens",
			in: `(* header *) & (* after and *) ( (* in relation *) jobname (* before op *) = (* before value *) x (* after *) )
				(inputfiles = (* list *) ( (* entry *) "a" "https://h/a" ) (* end *) )`,
			want: Job{Name: "x", Inputs: []File{in("https://h/a", "a")}},
		},
		{
			name: "comment markers inside quoted strings are text",
			in:   `&(jobname = "a (* not a comment *) b")`,
			want: Job{Name: "a (* not a comment *) b"},
		},
		{
			name: "rsl_substitution variables, with # and without space",
			in: `&(rsl_substitution = ("BASE" "https://h/data") ("RUN" "42"))
				(inputfiles = ("a" $(BASE) # "/run" # $(RUN)) ("b" $(BASE)/b))`,
			want: Job{Inputs: []File{in("https://h/data/run42", "a"), in("https://h/data/b", "b")}},
		},
		{
			name: "variables may use earlier variables",
			in:   `&(rsl_substitution = ("H" "https://h"))(rsl_substitution = ("D" $(H)/d))(outputfiles = ("r" $(D)/r))`,
			want: Job{Outputs: []File{out("r", "https://h/d/r")}},
		},
		{
			name: "nested conjunctions are read in order",
			in:   `&(jobname = x)(&(priority = 5)(&(inputfiles = ("a" "https://h/a"))))`,
			want: Job{Name: "x", Priority: 5, Inputs: []File{in("https://h/a", "a")}},
		},
		{
			name: "a multi-job description holding one job",
			in:   `+(&(jobname = only))`,
			want: Job{Name: "only"},
		},
		{
			name: "other attributes and operators are ignored",
			in: `&(executable = "/bin/sh")(arguments = "-c" "echo hi")(stdout = out.txt)(walltime = "2 hours")
				(count = 4)(runtimeenvironment >= "APPS/HEP/ATLAS-24.0")(queue != "short")(memory <= 2000)
				(environment = ("A" "1") ("B" "2"))(jobname = x)`,
			want: Job{Name: "x"},
		},
		{
			name: "an undefined variable in an ignored attribute is not an error",
			in:   `&(executable = $(NOPE))(jobname = x)`,
			want: Job{Name: "x"},
		},
		{
			name: "a description with no files parses; Validate refuses it later",
			in:   `&(executable = "run.sh")`,
			want: Job{},
		},
		{
			name: "a top-level relation without &",
			in:   `jobname = x`,
			want: Job{Name: "x"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseXRSL([]byte(tt.in), opt)
			if err != nil {
				t.Fatalf("ParseXRSL: %v", err)
			}
			if !reflect.DeepEqual(*got, tt.want) {
				t.Errorf("ParseXRSL =\n%+v\nwant\n%+v", *got, tt.want)
			}
		})
	}
}

func TestParseXRSLTakesOwnerFromOptions(t *testing.T) {
	owner := dtr.Identity{DN: "/CN=Jane", FQANs: []string{"/atlas"}}
	j, err := ParseXRSL([]byte(`&(outputfiles = ("r" "https://h/r"))`), XRSLOptions{SessionDir: "/s", Owner: owner})
	if err != nil {
		t.Fatalf("ParseXRSL: %v", err)
	}
	if !reflect.DeepEqual(j.Owner, owner) {
		t.Errorf("Owner = %+v, want %+v", j.Owner, owner)
	}
}

func TestParseXRSLDoesNotNeedASessionDirWithoutFiles(t *testing.T) {
	if _, err := ParseXRSL([]byte(`&(jobname = x)(inputfiles = ("run.sh" ""))`), XRSLOptions{}); err != nil {
		t.Fatalf("ParseXRSL: %v", err)
	}
}

func TestParseXRSLRejects(t *testing.T) {
	opt := XRSLOptions{SessionDir: "/sess"}
	tests := []struct {
		name string
		in   string
		opt  *XRSLOptions // nil means opt
		want []string     // one substring per expected problem, in order
	}{
		// Syntax.
		{"a relation without & at the top", `(jobname = x)`, nil,
			[]string{`xrsl line 1, column 1 (byte 0): expected an attribute name, or "&" to start a job description, found '('`}},
		{"& without a relation", `& jobname = x`, nil,
			[]string{`expected "(" after '&', found 'j'`}},
		{"an unclosed relation, naming it and where it opened", "&(executable = x)\n (jobname = \"y\"", nil,
			[]string{`xrsl line 2, column 16 (byte 33): expected ")" to close the relation "jobname" opened at line 2, column 2, found end of input`}},
		{"an unclosed inputfiles relation", `&(inputfiles = ("a" "https://h/a")` + "\n" + `("b" "https://h/b")`, nil,
			[]string{`expected ")" to close the relation "inputfiles" opened at line 1, column 2, found end of input`}},
		{"an unclosed entry", `&(inputfiles = ("a" "https://h/a"`, nil,
			[]string{`xrsl line 1, column 34 (byte 33): expected ")" to close the list opened at line 1, column 16, found end of input`}},
		{"an unclosed string, pointing at its start", "&(jobname = \"abc)\n", nil,
			[]string{`xrsl line 1, column 13 (byte 12): string opened here is not closed: expected '"' before the end of input`}},
		{"an unclosed comment", "&(jobname = x) (* note", nil,
			[]string{`xrsl line 1, column 16 (byte 15): comment "(*" is not closed: expected "*)"`}},
		{"a missing operator", `&(jobname "x")`, nil,
			[]string{`expected a relation operator (=, !=, <, <=, >, >=) after attribute "jobname", found '"'`}},
		{"an unquoted URL with =, hinting at quotes", `&(inputfiles = ("a" https://h/x?a=b))`, nil,
			[]string{`expected ")" to close the list opened at line 1, column 16, found '=' (a value containing any of +&|()=<>!"'^#$ or spaces must be quoted)`}},
		{"text after the end", `&(jobname = x) junk`, nil,
			[]string{`xrsl line 1, column 16 (byte 15): unexpected 'j' after the end of the description`}},
		{"# with nothing on its left", `&(jobname = # "x")`, nil,
			[]string{`"#" (concatenation) needs a string or variable on its left`}},
		{"# with nothing on its right", `&(jobname = "x" # )`, nil,
			[]string{`expected a string or variable after "#", found ')'`}},
		{"a malformed variable", `&(jobname = $NAME)`, nil,
			[]string{`expected "(" after "$" (a variable is written $(NAME)), found 'N'`}},
		{"nesting deeper than 64 levels", "&(jobname = " + strings.Repeat("(", 70), nil,
			[]string{`xrsl line 1, column 76 (byte 75): parentheses are nested more than 64 deep`}},
		{"an empty description", ``, nil,
			[]string{`expected an attribute name, or "&" to start a job description, found end of input`}},

		// Structure.
		{"a multi-job description", `+(&(jobname = a))(&(jobname = b))`, nil,
			[]string{`a multi-job description ("+" with 2 jobs) is not supported`}},
		{"alternatives", `&(jobname = a)(|(queue = a)(queue = b))`, nil,
			[]string{`alternatives ("|") are not supported`}},
		{"a non-integer priority, naming it", `&(priority = "high")`, nil,
			[]string{`xrsl line 1, column 14 (byte 13): priority: "high" is not an integer`}},
		{"jobname given twice", "&(jobname = a)\n(jobname = b)", nil,
			[]string{`xrsl line 2, column 2 (byte 16): jobname is given twice (first at line 1, column 3)`}},
		{"inputfiles given twice", `&(inputfiles = ("a" "https://h/a"))(InputFiles = ("b" "https://h/b"))`, nil,
			[]string{`InputFiles is given twice`}},
		{"a list as jobname", `&(jobname = ("a" "b"))`, nil,
			[]string{`jobname: expected a string, found a list`}},
		{"two values as jobname", `&(jobname = a b)`, nil,
			[]string{`jobname: expected one value, found 2`}},
		{"another operator on a data attribute", `&(priority != 5)`, nil,
			[]string{`priority: operator "!=" is not allowed here; use "="`}},
		{"an entry that is not a list", `&(inputfiles = "a" "https://h/a")`, nil,
			[]string{`inputfiles entry 1: expected ("name" "URL"), found the string "a"`, `inputfiles entry 2: expected ("name" "URL")`}},
		{"an entry with only a name", `&(outputfiles = ("a"))`, nil,
			[]string{`outputfiles entry 1: expected ("name" "URL"), found a list of 1`}},
		{"an entry holding a list", `&(inputfiles = ("a" ("https://h/a")))`, nil,
			[]string{`inputfiles entry 1: expected strings, found a nested list`}},
		{"a bad overwrite option", `&(outputfiles = ("a" "https://h/a" "overwrite=maybe"))`, nil,
			[]string{`outputfiles entry 1: option "overwrite=maybe": expected overwrite=yes or overwrite=no`}},
		{"a bad stage option", `&(inputfiles = ("a" "https://h/a" "stage=later"))`, nil,
			[]string{`inputfiles entry 1: option "stage=later": expected stage=yes or stage=no`}},
		{"two checksums", `&(inputfiles = ("a" "https://h/a" "md5:00" "md5:11"))`, nil,
			[]string{`inputfiles entry 1: a second checksum "md5:11" (the first is "md5:00")`}},
		{"an undefined variable", `&(inputfiles = ("a" $(BASE)/a))`, nil,
			[]string{`variable $(BASE) is not defined; define it earlier with (rsl_substitution = ("BASE" "value"))`}},
		{"a variable used before it is defined", `&(jobname = $(X))(rsl_substitution = ("X" "x"))`, nil,
			[]string{`variable $(X) is not defined`}},
		{"a variable defined in a nested group is not seen outside it", `&(&(rsl_substitution = ("X" "x")))(jobname = $(X))`, nil,
			[]string{`variable $(X) is not defined`}},
		{"a malformed rsl_substitution", `&(rsl_substitution = ("X"))`, nil,
			[]string{`rsl_substitution: expected ("NAME" "value") pairs`}},

		// File names and the session directory.
		{"a name with .. elements, which would escape the session directory", `&(inputfiles = ("../../etc/passwd" "https://h/a"))`, nil,
			[]string{`xrsl line 1, column 17 (byte 16): inputfiles entry 1: file name "../../etc/passwd" has a ".." element, which would leave the session directory`}},
		{"a name with .. in the middle", `&(outputfiles = ("a/../../b" "https://h/b"))`, nil,
			[]string{`file name "a/../../b" has a ".." element`}},
		{"an absolute name", `&(outputfiles = ("/etc/passwd" "https://h/b"))`, nil,
			[]string{`outputfiles entry 1: file name "/etc/passwd" is absolute`}},
		{"an empty name", `&(inputfiles = ("" "https://h/b"))`, nil,
			[]string{`inputfiles entry 1: file name is empty`}},
		{"a name that is the session directory itself", `&(inputfiles = ("./" "https://h/b"))`, nil,
			[]string{`file name "./" names the session directory itself`}},
		{"a bad name is refused even for a file the user uploads", `&(inputfiles = ("../x" ""))`, nil,
			[]string{`file name "../x" has a ".." element`}},
		{"no session directory when files need one, reported once", `&(inputfiles = ("a" "https://h/a") ("b" "https://h/b"))`, &XRSLOptions{},
			[]string{`inputfiles: no session directory was given (XRSLOptions.SessionDir), so files cannot be placed`}},
		{"a relative session directory", `&(outputfiles = ("a" "https://h/a"))`, &XRSLOptions{SessionDir: "sess"},
			[]string{`session directory "sess" is not an absolute path`}},

		{"all problems are reported together", `&(priority = x)(inputfiles = ("../a" "https://h/a") ("/b" "https://h/b"))(jobname = $(N))`, nil,
			[]string{`priority: "x" is not an integer`, `inputfiles entry 1: file name "../a"`, `inputfiles entry 2: file name "/b"`, `variable $(N)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := opt
			if tt.opt != nil {
				o = *tt.opt
			}
			j, err := ParseXRSL([]byte(tt.in), o)
			if err == nil {
				t.Fatalf("ParseXRSL = %+v, want an error", j)
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
		})
	}
}

func TestParseXRSLSyntaxErrorIsAParseError(t *testing.T) {
	in := "&(executable = run.sh)\n (inputfiles = (\"a\" \"https://h/a\"\n"
	_, err := ParseXRSL([]byte(in), XRSLOptions{SessionDir: "/s"})
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v is not a *ParseError", err)
	}
	if pe.Format != "xrsl" || pe.Line != 3 || pe.Column != 1 || pe.Offset != len(in) {
		t.Errorf("ParseError = %+v, want xrsl at line 3, column 1, byte %d", pe, len(in))
	}
}

func TestParseXRSLPriorityErrorWrapsTheCause(t *testing.T) {
	_, err := ParseXRSL([]byte(`&(priority = 1.5)`), XRSLOptions{})
	if !errors.Is(err, strconv.ErrSyntax) {
		t.Fatalf("error %v does not wrap strconv.ErrSyntax", err)
	}
}
