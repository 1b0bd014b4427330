package generator

// An FTS3 job submission (fts-rest's POST /jobs body) read into a Sluice
// job. Every field FTS3 clients send is either used, kept to be returned,
// or named in a warning that says it is ignored; a value Sluice cannot use
// is refused with an error that names the field.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// ftsSuffix is the key suffix, in the jobs bucket, of what a job submitted
// over the FTS3 API keeps of its submission: <job>.fts.
const ftsSuffix = ".fts"

// ftsRecord is what Sluice keeps of an FTS3 submission, to answer in FTS3's
// words: the metadata given, the parameters, the files as FTS3 named them.
type ftsRecord struct {
	Submitted      time.Time       `json:"submitted"`
	Priority       int             `json:"priority"`
	VerifyChecksum string          `json:"verify_checksum"`
	Overwrite      bool            `json:"overwrite,omitempty"`
	Retry          int             `json:"retry,omitempty"`
	JobMetadata    json.RawMessage `json:"job_metadata,omitempty"`
	Files          []ftsFile       `json:"files"`
	// Cancelled is when the job's owner cancelled it (DELETE /jobs/<id>).
	Cancelled time.Time `json:"cancelled,omitzero"`
}

// ftsFile is one file of an FTS3 submission.
type ftsFile struct {
	Sources     []string        `json:"sources"`
	Destination string          `json:"destination"`
	Checksum    string          `json:"checksum,omitempty"`
	Filesize    int64           `json:"filesize,omitempty"`
	Activity    string          `json:"activity,omitempty"`
	Metadata    json.RawMessage `json:"metadata,omitempty"`
}

// ftsPriority maps FTS3's job priorities (1–5, 3 by default) onto Sluice's
// 1–100 (50 by default): evenly spaced around the default, so that an FTS3
// client's relative order survives and its default is Sluice's.
var ftsPriority = map[int]int{1: 20, 2: 35, 3: 50, 4: 65, 5: 80}

// ftsDefaultPriority is FTS3's priority of a job that gives none.
const ftsDefaultPriority = 3

// ftsVerify says, for each of FTS3's verify_checksum values, whether the
// checksum a file gives is checked. Sluice checks a given checksum against
// the bytes as they stream, which covers FTS3's source, destination and
// both; it always computes one for the record.
var ftsVerify = map[string]bool{
	"both": true, "source": true, "destination": true, "target": true, "true": true,
	"none": false, "false": false,
}

// ftsSubmission is a submission being read: the job it becomes, what is
// kept, and the warnings for what is ignored.
type ftsSubmission struct {
	caller   auth.Caller
	job      *job.Job
	rec      ftsRecord
	verify   bool
	scitag   int
	warnings []string
	errs     []error
}

func (s *ftsSubmission) warn(format string, args ...any) {
	s.warnings = append(s.warnings, fmt.Sprintf(format, args...))
}

func (s *ftsSubmission) fail(format string, args ...any) {
	s.errs = append(s.errs, fmt.Errorf(format, args...))
}

// ignoredParam warns that a parameter Sluice does not use was given, unless
// its value is null, false, 0 or -1 (which ask for nothing).
func ignoredParam(why string) func(*ftsSubmission, string, json.RawMessage) {
	return func(s *ftsSubmission, name string, raw json.RawMessage) {
		switch strings.TrimSpace(string(raw)) {
		case "null", "false", "0", "-1", `""`, `"standard"`:
			return
		}
		s.warn("params.%s: ignored: %s", name, why)
	}
}

// ftsParams reads each job parameter Sluice knows; any other is named in a
// warning.
var ftsParams = map[string]func(*ftsSubmission, string, json.RawMessage){
	"overwrite": func(s *ftsSubmission, name string, raw json.RawMessage) {
		decodeInto(s, "params."+name, raw, &s.rec.Overwrite, "true or false")
	},
	"priority": func(s *ftsSubmission, name string, raw json.RawMessage) {
		var p int
		if !decodeInto(s, "params."+name, raw, &p, "a whole number 1–5") {
			return
		}
		if _, ok := ftsPriority[p]; !ok {
			s.fail("params.priority: %d is outside FTS3's 1–5", p)
			return
		}
		s.rec.Priority = p
	},
	"verify_checksum": func(s *ftsSubmission, name string, raw json.RawMessage) {
		var v any
		_ = json.Unmarshal(raw, &v)
		var key string
		switch x := v.(type) {
		case bool:
			key = strconv.FormatBool(x)
		case string:
			key = strings.ToLower(x)
		}
		verify, ok := ftsVerify[key]
		if !ok {
			s.fail("params.%s: %s is none of true, false, \"both\", \"source\", \"destination\", \"target\", \"none\"", name, shorten(dtr.RedactText(string(raw)), 64))
			return
		}
		s.verify, s.rec.VerifyChecksum = verify, key
	},
	"job_metadata": func(s *ftsSubmission, _ string, raw json.RawMessage) {
		s.rec.JobMetadata = compactJSON(raw)
	},
	"retry": func(s *ftsSubmission, name string, raw json.RawMessage) {
		if !decodeInto(s, "params."+name, raw, &s.rec.Retry, "a whole number") {
			return
		}
		if s.rec.Retry > 0 {
			s.warn("params.retry: Sluice retries a failed transfer by its own settings (SLUICE_MAXTRANSFERTRIES), not %d times", s.rec.Retry)
		}
	},
	"scitag": func(s *ftsSubmission, name string, raw json.RawMessage) {
		decodeScitag(s, "params."+name, raw, &s.scitag)
	},
	"bring_online":      ignoredParam("Sluice does not stage from tape through FTS3's bring-online"),
	"copy_pin_lifetime": ignoredParam("Sluice does not pin files for FTS3 jobs"),
	"id_generator":      ignoredParam("Sluice chooses random job ids"),
	"sid":               ignoredParam("Sluice chooses random job ids"),
	"multihop": func(s *ftsSubmission, _ string, raw json.RawMessage) {
		if strings.TrimSpace(string(raw)) == "true" {
			s.fail("params.multihop: multi-hop jobs are not supported; submit each hop as its own job")
		}
	},
}

// ftsFileFields reads each field of a file that Sluice knows; any other is
// named in a warning. Field readers take the file's index and the file
// being built.
var ftsFileFields = map[string]func(s *ftsSubmission, field string, raw json.RawMessage, f *ftsFile, jf *job.File){
	"sources": func(s *ftsSubmission, field string, raw json.RawMessage, f *ftsFile, _ *job.File) {
		decodeInto(s, field, raw, &f.Sources, "an array of URLs")
	},
	"destinations": func(s *ftsSubmission, field string, raw json.RawMessage, f *ftsFile, _ *job.File) {
		var ds []string
		if !decodeInto(s, field, raw, &ds, "an array of URLs") {
			return
		}
		if len(ds) != 1 {
			s.fail("%s: %d destinations; Sluice takes exactly one per file", field, len(ds))
			return
		}
		f.Destination = ds[0]
	},
	"checksum": func(s *ftsSubmission, field string, raw json.RawMessage, f *ftsFile, _ *job.File) {
		var c *string
		if !decodeInto(s, field, raw, &c, "a string such as \"ADLER32:1a2b3c4d\", or null") || c == nil {
			return
		}
		f.Checksum = *c
	},
	"filesize": func(s *ftsSubmission, field string, raw json.RawMessage, f *ftsFile, _ *job.File) {
		var n *int64
		if !decodeInto(s, field, raw, &n, "a whole number of bytes, or null") || n == nil {
			return
		}
		if *n < 0 {
			s.fail("%s: %d is negative", field, *n)
			return
		}
		f.Filesize = *n
	},
	"activity": func(s *ftsSubmission, field string, raw json.RawMessage, f *ftsFile, _ *job.File) {
		var a *string
		if !decodeInto(s, field, raw, &a, "a string, or null") || a == nil {
			return
		}
		if err := dtr.CheckActivity(*a); err != nil {
			s.fail("%s: %v", field, err)
			return
		}
		f.Activity = *a
	},
	"metadata": func(_ *ftsSubmission, _ string, raw json.RawMessage, f *ftsFile, _ *job.File) {
		f.Metadata = compactJSON(raw)
	},
	"scitag": func(s *ftsSubmission, field string, raw json.RawMessage, _ *ftsFile, jf *job.File) {
		decodeScitag(s, field, raw, &jf.SciTag)
	},
	// Sluice tries a file's sources in the order given.
	"selection_strategy": func(*ftsSubmission, string, json.RawMessage, *ftsFile, *job.File) {},
	// Storage tokens a client sends for the transfer are never kept,
	// logged or echoed: Sluice's workers use the site's own credentials.
	"source_tokens":      ignoredToken,
	"destination_tokens": ignoredToken,
}

func ignoredToken(s *ftsSubmission, field string, raw json.RawMessage, _ *ftsFile, _ *job.File) {
	if t := strings.TrimSpace(string(raw)); t != "null" && t != "[]" {
		s.warn("%s: ignored (not kept): Sluice's workers reach storage with the site's own credentials (SLUICE_HTTP_TOKENS, SLUICE_STORAGE_TOKEN_*)", field)
	}
}

// decodeInto decodes raw into v, failing the submission with the field's
// name and what it must be if it cannot.
func decodeInto(s *ftsSubmission, field string, raw json.RawMessage, v any, want string) bool {
	if err := json.Unmarshal(raw, v); err != nil {
		s.fail("%s: %s is not %s", field, shorten(dtr.RedactText(string(raw)), 64), want)
		return false
	}
	return true
}

// decodeScitag reads a SciTag, 65–65535, into tag.
func decodeScitag(s *ftsSubmission, field string, raw json.RawMessage, tag *int) {
	var t *int
	if !decodeInto(s, field, raw, &t, "a whole number 65–65535, or null") || t == nil {
		return
	}
	if *t < dtr.MinSciTag || *t > dtr.MaxSciTag {
		s.fail("%s: %d is outside %d–%d", field, *t, dtr.MinSciTag, dtr.MaxSciTag)
		return
	}
	if err := s.caller.MayTag(); err != nil {
		s.warn("%s: ignored: only trusted callers and administrators may choose a SciTag; the site's mapping of the VO and activity marks the transfer", field)
		return
	}
	*tag = *t
}

// compactJSON returns raw without insignificant space, nil for null.
func compactJSON(raw json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil || b.String() == "null" {
		return nil
	}
	return b.Bytes()
}

// ftsChecksum turns FTS3's checksum forms ("ADLER32:1a2b3c4d",
// "adler32:1a2b3c4d", "MD5:...") into Sluice's ("adler32:1a2b3c4d"). A type
// alone, with no value, asks for nothing to compare: "".
func ftsChecksum(field, c string) (string, error) {
	typ, val, _ := strings.Cut(strings.TrimSpace(c), ":")
	if val == "" {
		return "", nil
	}
	sum := strings.ToLower(typ) + ":" + strings.ToLower(val)
	if _, _, err := dtr.ParseChecksum(sum); err != nil {
		return "", fmt.Errorf("%s: %q: %w", field, c, err)
	}
	return sum, nil
}

// parseFTSSubmission reads an FTS3 job submission of caller into a Sluice
// job and what is kept of it, or every problem it has, joined, each naming
// its field.
func parseFTSSubmission(body []byte, caller auth.Caller, now time.Time) (*ftsSubmission, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, fmt.Errorf("the body is not a JSON object: %w", err)
	}
	s := &ftsSubmission{caller: caller, job: &job.Job{}, verify: true,
		rec: ftsRecord{Submitted: now, Priority: ftsDefaultPriority, VerifyChecksum: "both"}}
	var params map[string]json.RawMessage
	if raw, ok := top["params"]; ok && strings.TrimSpace(string(raw)) != "null" {
		if err := json.Unmarshal(raw, &params); err != nil {
			return nil, fmt.Errorf("params: %s is not an object", shorten(dtr.RedactText(string(raw)), 64))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(params)) {
		if read, ok := ftsParams[name]; ok {
			read(s, name, params[name])
		} else {
			s.warn("params.%s: ignored: Sluice does not use it", name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(top)) {
		if name != "files" && name != "params" {
			s.warn("%s: ignored: Sluice does not use it", name)
		}
	}
	var files []map[string]json.RawMessage
	if raw, ok := top["files"]; !ok {
		return nil, errors.New("files: missing: a job lists its files")
	} else if err := json.Unmarshal(raw, &files); err != nil {
		return nil, fmt.Errorf("files: not an array of objects: %w", err)
	}
	if len(files) == 0 {
		return nil, errors.New("files: empty: a job lists at least one file")
	}
	s.job.Priority = ftsPriority[s.rec.Priority]
	for i, fields := range files {
		at := fmt.Sprintf("files[%d]", i)
		var f ftsFile
		jf := job.File{Overwrite: s.rec.Overwrite, SciTag: s.scitag}
		for _, name := range slices.Sorted(maps.Keys(fields)) {
			if read, ok := ftsFileFields[name]; ok {
				read(s, at+"."+name, fields[name], &f, &jf)
			} else {
				s.warn("%s.%s: ignored: Sluice does not use it", at, name)
			}
		}
		switch {
		case len(f.Sources) == 0:
			s.fail("%s.sources: missing or empty: a file has at least one source", at)
			continue
		case f.Destination == "":
			s.fail("%s.destinations: missing: a file has one destination", at)
			continue
		}
		sum, err := ftsChecksum(at+".checksum", f.Checksum)
		if err != nil {
			s.errs = append(s.errs, err)
		}
		jf.Source, jf.Replicas, jf.Destination, jf.Activity = f.Sources[0], slices.Clone(f.Sources[1:]), f.Destination, f.Activity
		if s.verify {
			jf.Checksum = sum
		}
		// Each file stands alone, as in FTS3: as outputs, one that fails
		// does not cancel the others (a failed download would), and none
		// goes through the cache.
		s.job.Outputs = append(s.job.Outputs, jf)
		s.rec.Files = append(s.rec.Files, f)
	}
	if len(s.errs) > 0 {
		return nil, errors.Join(s.errs...)
	}
	return s, nil
}
