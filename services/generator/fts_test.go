package generator

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// openAPI is the part of schemas/fts3-openapi.json the tests compare.
type openAPI struct {
	Paths      map[string]map[string]json.RawMessage `json:"paths"`
	Components struct {
		Schemas map[string]struct {
			Properties map[string]json.RawMessage `json:"properties"`
		} `json:"schemas"`
	} `json:"components"`
}

func TestTheFTS3OpenAPIDocumentDescribesExactlyTheRoutesServed(t *testing.T) {
	b, err := os.ReadFile("../../schemas/fts3-openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPI
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("schemas/fts3-openapi.json: %v", err)
	}
	var documented, served []string
	for path, ops := range doc.Paths {
		for method := range ops {
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	for _, r := range ftsRoutes {
		served = append(served, r.method+" "+strings.TrimSuffix(r.pattern, "{$}")) // "/{$}" is the path "/" alone
	}
	slices.Sort(documented)
	slices.Sort(served)
	if !slices.Equal(documented, served) {
		t.Errorf("the document has %q, the API serves %q", documented, served)
	}
	// A file's fields, the parameters read and the fields of a submitted
	// file are the document's.
	for _, tt := range []struct {
		schema string
		served []string
	}{
		{"File", ftsFileFieldNames},
		{"Params", slices.Collect(maps.Keys(ftsParams))},
		{"SubmittedFile", slices.Collect(maps.Keys(ftsFileFields))},
	} {
		doc := slices.Sorted(maps.Keys(doc.Components.Schemas[tt.schema].Properties))
		served := slices.Sorted(slices.Values(tt.served))
		if !slices.Equal(doc, served) {
			t.Errorf("schema %s has %q, the API has %q", tt.schema, doc, served)
		}
	}
}

func TestEveryDTRStateHasAnFTS3FileState(t *testing.T) {
	for _, tt := range []struct {
		state dtr.State
		want  string
	}{
		{dtr.New, ftsSubmitted}, {dtr.QueryReplica, ftsSubmitted}, {dtr.StagedPrepared, ftsSubmitted},
		{dtr.Transfer, ftsReady}, {dtr.Transferring, ftsActive}, {dtr.ReplicaFinalised, ftsActive}, {dtr.CacheProcessed, ftsActive},
		{dtr.Done, ftsFinished}, {dtr.Cancelled, ftsCanceled}, {dtr.Error, ftsFailed},
	} {
		if got := ftsFileState(tt.state); got != tt.want {
			t.Errorf("%s is %s in FTS3's words, want %s", tt.state, got, tt.want)
		}
	}
}

func TestAnFTS3JobsStateSumsUpItsFiles(t *testing.T) {
	ended := func(states ...dtr.State) *ftsJob {
		j := &ftsJob{finals: map[uuid.UUID]*dtr.DTR{}, live: map[uuid.UUID]*dtr.DTR{}}
		for _, st := range states {
			id := uuid.New()
			j.refs = append(j.refs, api.FileRef{DTR: id})
			j.fts.Files = append(j.fts.Files, ftsFile{Sources: []string{"https://s.example.org/f"}})
			switch {
			case st.Final():
				j.finals[id] = &dtr.DTR{State: st, Error: &dtr.Failure{Text: "it broke"}}
			case st != dtr.New:
				j.live[id] = &dtr.DTR{State: st}
			}
		}
		return j
	}
	for _, tt := range []struct {
		name string
		job  *ftsJob
		want string
	}{
		{"nothing started", ended(dtr.New, dtr.New), ftsSubmitted},
		{"one transferring", ended(dtr.Transferring, dtr.New), ftsActive},
		{"one ended, one waiting", ended(dtr.Done, dtr.New), ftsActive},
		{"every file done", ended(dtr.Done, dtr.Done), ftsFinished},
		{"one failed", ended(dtr.Done, dtr.Error), ftsFinishedDirty},
		{"every file failed", ended(dtr.Error, dtr.Cancelled), ftsFailed},
	} {
		if got, _ := tt.job.state(); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
	j := ended(dtr.Done, dtr.Transferring)
	j.fts.Cancelled = time.Now()
	if got, _ := j.state(); got != ftsCanceled {
		t.Errorf("a cancelled job is %s", got)
	}
}

func TestAnFTS3SubmissionBecomesAJobOfOutputsWithReplicasAndMappedPriority(t *testing.T) {
	body := `{"files": [
		{"sources": ["https://a.example.org/f", "https://b.example.org/f"], "destinations": ["https://c.example.org/f"],
		 "checksum": "ADLER32:0A0B0C0D", "filesize": 10, "activity": "Production Input", "metadata": {"request_id": "r1"}},
		{"sources": ["https://a.example.org/g"], "destinations": ["https://c.example.org/g"], "checksum": "MD5:00112233445566778899aabbccddeeff"}],
		"params": {"priority": 4, "overwrite": true, "verify_checksum": "target", "bring_online": 3600, "copy_pin_lifetime": -1, "spacetoken": "DATADISK", "scitag": 200}}`
	sub, err := parseFTSSubmission([]byte(body), auth.Caller{Via: auth.ViaToken}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	j := sub.job
	if len(j.Inputs) != 0 || len(j.Outputs) != 2 || j.Priority != 65 {
		t.Fatalf("job %+v: want two outputs at priority 65", j)
	}
	f := j.Outputs[0]
	if f.Source != "https://a.example.org/f" || !slices.Equal(f.Replicas, []string{"https://b.example.org/f"}) || f.Checksum != "adler32:0a0b0c0d" ||
		!f.Overwrite || f.Activity != "Production Input" || f.SciTag != 0 {
		t.Fatalf("first file %+v", f)
	}
	if j.Outputs[1].Checksum != "md5:00112233445566778899aabbccddeeff" {
		t.Fatalf("second file's checksum %q", j.Outputs[1].Checksum)
	}
	warned := strings.Join(sub.warnings, "\n")
	for _, want := range []string{"params.bring_online: ignored", "params.spacetoken: ignored", "params.scitag: ignored: only trusted callers"} {
		if !strings.Contains(warned, want) {
			t.Errorf("no warning says %q: %s", want, warned)
		}
	}
	if strings.Contains(warned, "copy_pin_lifetime") {
		t.Errorf("copy_pin_lifetime -1 asks for nothing, yet: %s", warned)
	}
	if string(sub.rec.Files[0].Metadata) != `{"request_id":"r1"}` || sub.rec.VerifyChecksum != "target" {
		t.Errorf("kept %+v", sub.rec)
	}
	// An administrator's scitag is used; verify_checksum false drops the
	// checksum compared.
	admin := auth.Caller{Via: auth.ViaToken, Admin: true}
	sub, err = parseFTSSubmission([]byte(strings.Replace(body, `"verify_checksum": "target"`, `"verify_checksum": false`, 1)), admin, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if f := sub.job.Outputs[0]; f.SciTag != 200 || f.Checksum != "" || sub.rec.Files[0].Checksum != "ADLER32:0A0B0C0D" {
		t.Fatalf("an administrator's file %+v (kept checksum %q)", f, sub.rec.Files[0].Checksum)
	}
}

// ftsBenchJob is a Rucio-shaped submission of n files.
func ftsBenchJob(n int) []byte {
	var files []string
	for i := range n {
		files = append(files, `{"sources": ["https://a.example.org/dd/mc23/EVNT.`+strconv.Itoa(i)+`.root"],
		"destinations": ["https://b.example.org/dd/mc23/EVNT.`+strconv.Itoa(i)+`.root"],
		"metadata": {"request_id": "`+uuid.NewString()+`", "scope": "mc23", "name": "EVNT.`+strconv.Itoa(i)+`.root", "src_rse": "A", "dst_rse": "B", "filesize": 4096, "adler32": "0a0b0c0d"},
		"filesize": 4096, "checksum": "ADLER32:0a0b0c0d", "selection_strategy": "orderly", "activity": "Production Input"}`)
	}
	return []byte(`{"files": [` + strings.Join(files, ",") + `], "params": {"verify_checksum": "both", "copy_pin_lifetime": 172800,
		"job_metadata": {"issuer": "rucio", "multi_sources": false}, "overwrite": true, "priority": 3}}`)
}

// BenchmarkFTS3SubmissionOf200FilesRead reads a 200-file Rucio-shaped
// submission into a job: the API's own cost of a POST /jobs.
func BenchmarkFTS3SubmissionOf200FilesRead(b *testing.B) {
	body := ftsBenchJob(200)
	c := auth.Caller{Via: auth.ViaToken}
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := parseFTSSubmission(body, c, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFTS3JobOf200FilesShown builds the answer of GET
// /jobs/<id>?files=... for a finished 200-file job, encoded.
func BenchmarkFTS3JobOf200FilesShown(b *testing.B) {
	sub, err := parseFTSSubmission(ftsBenchJob(200), auth.Caller{Via: auth.ViaToken}, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	j := &ftsJob{fts: sub.rec, finals: map[uuid.UUID]*dtr.DTR{}}
	now := time.Now()
	for _, f := range sub.rec.Files {
		id := uuid.New()
		j.refs = append(j.refs, api.FileRef{DTR: id})
		j.finals[id] = &dtr.DTR{ID: id, State: dtr.Done, Source: f.Sources[0], Size: 4096, Checksum: "adler32:0a0b0c0d",
			Started: now, Ended: now.Add(time.Second), Updated: now}
	}
	for b.Loop() {
		v := j.view()
		v["files"] = j.fileViews()
		if _, err := json.Marshal(v); err != nil {
			b.Fatal(err)
		}
	}
}

func TestAnFTS3FieldRefusedIsQuotedWithoutAPassword(t *testing.T) {
	_, err := parseFTSSubmission([]byte(`{"files": [{"sources": "https://alice:s3cret@a.example.org/f", "destinations": ["https://b.example.org/f"]}]}`),
		auth.Caller{Via: auth.ViaToken}, time.Now())
	if err == nil || !strings.Contains(err.Error(), "files[0].sources") || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("a sources field that is a string with a password: %v", err)
	}
}

func TestTheFTS3PythonClientsDefaultSubmissionIsTakenAtDefaultPriorityWithoutWarnings(t *testing.T) {
	body, err := os.ReadFile("../../e2e/testdata/fts/fts3-client-default.json")
	if err != nil {
		t.Fatal(err)
	}
	body = []byte(strings.ReplaceAll(string(body), "@STORAGE@", "https://s.example.org"))
	sub, err := parseFTSSubmission(body, auth.Caller{Via: auth.ViaToken}, time.Now())
	if err != nil {
		t.Fatalf("the client's default submission: %v", err)
	}
	if sub.rec.Priority != ftsDefaultPriority || sub.job.Priority != 50 {
		t.Errorf("priority null is FTS3 %d, Sluice %d; want 3 and 50", sub.rec.Priority, sub.job.Priority)
	}
	if len(sub.warnings) > 0 {
		t.Errorf("params that are null, false or their defaults were warned about: %q", sub.warnings)
	}
	// Null means "not given" for every parameter and field Sluice reads.
	for _, tt := range []struct{ name, body string }{
		{"every known param null", `{"files": [{"sources": ["https://s.example.org/a"], "destinations": ["https://d.example.org/a"]}],
			"params": {"priority": null, "overwrite": null, "verify_checksum": null, "retry": null, "scitag": null, "job_metadata": null, "multihop": null}}`},
		{"file fields null", `{"files": [{"sources": ["https://s.example.org/a"], "destinations": ["https://d.example.org/a"],
			"checksum": null, "filesize": null, "activity": null, "metadata": null, "scitag": null, "selection_strategy": null}], "delete": null, "staging": null}`},
	} {
		sub, err := parseFTSSubmission([]byte(tt.body), auth.Caller{Via: auth.ViaToken}, time.Now())
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if sub.rec.Priority != 3 || sub.rec.VerifyChecksum != "both" || len(sub.warnings) > 0 {
			t.Errorf("%s: priority %d, verify %q, warnings %q", tt.name, sub.rec.Priority, sub.rec.VerifyChecksum, sub.warnings)
		}
	}
	// A deletion job is not something Sluice does: refused, not ignored.
	if _, err := parseFTSSubmission([]byte(`{"files": [], "delete": ["https://s.example.org/a"]}`), auth.Caller{Via: auth.ViaToken}, time.Now()); err == nil || !strings.Contains(err.Error(), "delete") {
		t.Errorf("a deletion job: %v", err)
	}
}

// BenchmarkFTS3SubmissionOf430000TinyFilesRefused is what a 1.3 MB body of
// 430,000 empty files costs before it is refused at the 2,001st: its
// allocations per operation bound the memory one such request takes.
func BenchmarkFTS3SubmissionOf430000TinyFilesRefused(b *testing.B) {
	body := []byte(`{"files": [` + strings.Repeat(`{},`, 429999) + `{}]}`)
	c := auth.Caller{Via: auth.ViaToken}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := readFTSSubmission(bytes.NewReader(body), 2000, c, time.Now()); !errors.Is(err, errTooManyFiles) {
			b.Fatal(err)
		}
	}
}

func TestAnFTS3FileWhoseActivityHoldsTheShareSeparatorIsRefused(t *testing.T) {
	body := `{"files": [{"sources": ["https://s.example.org/a"], "destinations": ["https://d.example.org/a"], "activity": "g0#Production"}]}`
	_, err := parseFTSSubmission([]byte(body), auth.Caller{Via: auth.ViaToken}, time.Now())
	if err == nil || !strings.Contains(err.Error(), "files[0].activity") || !strings.Contains(err.Error(), `"#"`) {
		t.Fatalf("an activity with #: %v", err)
	}
}
