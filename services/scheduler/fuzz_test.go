package scheduler

import (
	"context"
	"fmt"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/tracing"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// Seeds of the fuzz targets below: bodies of dtr.submit, valid and not.
var submitBodies = []string{
	`{"id":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","source":"https://data.example/a","destination":"file:///scratch/a","owner":{"fqans":["/cms"]},"direction":"download","user_priority":70}`,
	`{"id":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","job_id":"reco-42","source":"s3://h:9000/b/k","destination":"davs://h/x","replicas":["root://r//a","http://m/a"],"options":{"checksum":"adler32:0a1b2c3d","overwrite":true,"stage":true}}`,
	`{"id":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","job_id":"a job","source":"file:///a","destination":"file:///b"}`,
	`{"id":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","source":"file:///a","destination":"file:///b","replicas":["file:///a","file:///c","file:///c"]}`,
	`{"id":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","source":"https://u:secret@h/a","destination":"file:///b"}`,
	`{"id":"twelve","source":"file:///a","destination":"file:///b"}`,
	`{"id":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","sauce":"file:///a","destination":"file:///b"}`,
	`{"id":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","source":"file:///a","destination":"file:///b","state":"DONE"}`,
	`{"id":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","source":"gopher://x/y","destination":"file:///tmp/y"}`,
	`{"id":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","source":"file:///a","destination":"file:///b"}{"more":1}`,
	`{"specversion":"1.0","id":"1","source":"s","type":"org.sluice.dtr.submit.v1","datacontenttype":"application/json","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","data":{"id":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","source":"file:///a","destination":"file:///b"}}`,
	`{"specversion":"1.0","id":"1","source":"s","type":"org.sluice.dtr.submit.v1","data_base64":"eyJpZCI6IjZjMWQ4ZWEwLTQzYTUtNGY0Yy05YTU1LTFiOGY0YTBmN2U0MiJ9"}`,
	`null`, `[]`, `{}`, ``, ` `, `this is not { json`, `{{{`,
}

// FuzzDecodeSubmitNeverPanicsAndRefusesWithAReason feeds DecodeSubmit
// messages as any publisher may send them to dtr.submit: plain JSON, binary
// CloudEvents (ce-* headers) and structured ones, with any body and any
// values of the headers that matter. It checks that DecodeSubmit returns a
// DTR or an error, never both and never neither; that an error has a
// message; and that a DTR passes its own validation, carries nothing the
// scheduler owns (state, share, priority, attempts, ...), has a job id the
// generator can use as a key, a trace parent that is either empty or a
// valid W3C traceparent, and is taken by the scheduler's core as it is.
func FuzzDecodeSubmitNeverPanicsAndRefusesWithAReason(f *testing.F) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for i, body := range submitBodies {
		// plain, binary and structured (the structured bodies are the
		// CloudEvents among the seeds)
		f.Add([]byte(body), "", "", "", "", "", "")
		f.Add([]byte(body), "application/json", api.TypeSubmit, "1.0", fmt.Sprint(i), "test", tp)
		f.Add([]byte(body), "application/cloudevents+json", "", "", "", "", "")
	}
	f.Add([]byte(submitBodies[0]), "application/json", "com.example.other", "1.0", "1", "test", "")
	f.Add([]byte(submitBodies[0]), "", api.TypeSubmit, "1.0", "", "test", "")
	f.Add([]byte(submitBodies[0]), "", api.TypeSubmit, "9.9", "1", "test", "")
	f.Add([]byte(submitBodies[0]), "text/plain", api.TypeSubmit, "0.3", "1", "", "garbage")
	f.Add([]byte(submitBodies[0]), "application/json", api.TypeSubmit, "1.0", "1", "test", "00-00000000000000000000000000000000-0000000000000000-00")
	// Submits events: several DTRs, good and bad, each with a traceparent.
	batch := `{"dtrs":[{"traceparent":"` + tp + `","dtr":` + submitBodies[0] + `},{"dtr":` + submitBodies[5] + `},{"traceparent":"x","dtr":` + submitBodies[1] + `}]}`
	f.Add([]byte(batch), "application/json", api.TypeSubmits, "1.0", "1", "test", tp)
	f.Add([]byte(`{"dtrs":[]}`), "application/json", api.TypeSubmits, "1.0", "1", "test", "")
	f.Add([]byte(`{"dtrs":[{"dtr":null},{"dtr":"a string"},{}]}`), "application/json", api.TypeSubmits, "1.0", "1", "test", "")
	f.Fuzz(func(t *testing.T, body []byte, contentType, ceType, specVersion, ceID, ceSource, traceparent string) {
		m := nats.NewMsg(api.SubjectSubmit)
		for k, v := range map[string]string{"content-type": contentType, "ce-type": ceType, "ce-specversion": specVersion,
			"ce-id": ceID, "ce-source": ceSource, "ce-traceparent": traceparent, "traceparent": traceparent} {
			if v != "" {
				m.Header[k] = []string{v}
			}
		}
		m.Data = body
		// As the scheduler reads dtr.submit: one DTR, or a Submits event's
		// several, each taken or refused alone.
		subs, err := DecodeSubmits(context.Background(), m, bus.MaxMessageBytes)
		if (len(subs) == 0) == (err == nil) {
			t.Fatalf("DecodeSubmits gave %d DTRs and error %v: want DTRs or an error", len(subs), err)
		}
		if err != nil && strings.TrimSpace(err.Error()) == "" {
			t.Fatal("a refusal without a reason")
		}
		for _, sub := range subs {
			if (sub.DTR == nil) == (sub.Err == nil) {
				t.Fatalf("an entry with DTR %v and error %v: want exactly one", sub.DTR, sub.Err)
			}
			if sub.Err != nil {
				if strings.TrimSpace(sub.Err.Error()) == "" {
					t.Fatal("a refusal without a reason")
				}
				continue
			}
			if sub.TraceParent != "" && !tracing.ValidTraceParent(sub.TraceParent) {
				t.Fatalf("an entry kept trace parent %q, which is not a valid traceparent", sub.TraceParent)
			}
			checkSubmitted(t, sub.DTR)
		}
		if m.Header.Get("ce-type") == api.TypeSubmits {
			return
		}
		d, err := DecodeSubmit(context.Background(), m)
		if (d == nil) == (err == nil) {
			t.Fatalf("DecodeSubmit gave DTR %v and error %v: want exactly one", d, err)
		}
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("a refusal without a reason")
			}
			return
		}
		checkSubmitted(t, d)
	})
}

// checkSubmitted fails unless d is what a publisher may submit, and the
// scheduler's core takes it.
func checkSubmitted(t *testing.T, d *dtr.DTR) {
	t.Helper()
	if err := d.Validate(); err != nil {
		t.Fatalf("accepted a DTR that does not validate: %v", err)
	}
	if d.JobID != "" && !dtr.ValidJobID(d.JobID) {
		t.Fatalf("accepted a DTR with job id %q", d.JobID)
	}
	if d.TraceParent != "" && !tracing.ValidTraceParent(d.TraceParent) {
		t.Fatalf("accepted a DTR with trace parent %q, which is not a valid traceparent", d.TraceParent)
	}
	// Everything the scheduler owns is zero: only what a Submission holds
	// (and the trace parent) may be set.
	owned := *d
	owned.ID, owned.JobID, owned.Source, owned.Destination, owned.Owner = uuid.Nil, "", "", "", dtr.Identity{}
	owned.Direction, owned.UserPriority, owned.Options, owned.Replicas, owned.TraceParent = "", 0, dtr.Options{}, nil, ""
	if !reflect.DeepEqual(owned, dtr.DTR{}) {
		t.Fatalf("accepted a DTR with fields the scheduler owns: %+v", *d)
	}
	if len(d.Replicas) > 0 && d.Replicas[0] != d.Source {
		t.Fatalf("accepted a DTR whose replicas %q do not start with its source %q", d.Replicas, d.Source)
	}
	c := core.New(core.DefaultConfig())
	cp := *d
	cp.Owner.FQANs = slices.Clone(d.Owner.FQANs)
	cp.Replicas = slices.Clone(d.Replicas)
	if err := c.Submit(time.Now(), &cp); err != nil {
		t.Fatalf("the core refused an accepted DTR: %v", err)
	}
	got, ok := c.Get(d.ID)
	if !ok {
		t.Fatal("the core lost an accepted DTR")
	}
	if got.JobID != d.JobID || got.Destination != d.Destination || got.Owner.DN != d.Owner.DN ||
		!slices.Equal(got.Owner.FQANs, d.Owner.FQANs) || got.Direction != d.Direction ||
		got.UserPriority != d.UserPriority || got.Options != d.Options {
		t.Fatalf("the core changed an accepted DTR:\n%+v\n%+v", got, *d)
	}
}

// FuzzControlRequestsAreRefusedWithAReasonOrWithinBounds feeds the same
// bytes to the decoders of sluice.api.priority, sluice.api.cancel and
// sluice.api.reconfigure, and, as text, to api.ParseSharePriorities
// (SLUICE_SHAREPRIORITY). Each returns an error with a message, or a
// request within the documented bounds: a DTR id and a priority 1–100; a
// DTR id or a job id, not both; share names that are not empty with
// priorities 1–100.
func FuzzControlRequestsAreRefusedWithAReasonOrWithinBounds(f *testing.F) {
	id := "c3e12bfa-ba9a-4a45-be73-0b3b2a206e1c"
	for _, s := range []string{
		`{"dtr":"` + id + `","priority":90}`,
		`{"dtr":"` + id + `","priority":101}`,
		`{"dtr":"` + id + `","priority":0}`,
		`{"dtr":"` + id + `","priority":-5}`,
		`{"dtr":"` + id + `","priority":1e2}`,
		`{"dtr":"` + id + `","priority":50.5}`,
		`{"dtr":"` + id + `","prio":5}`,
		`{"dtr":"00000000-0000-0000-0000-000000000000","priority":50}`,
		`{"dtr":"x","priority":50}`,
		`{"dtr":`,
		`{"dtr":"` + id + `"}`,
		`{"job":"controlled"}`,
		`{"job":""}`,
		`{"dtr":"` + id + `","job":"j"}`,
		`{}`, `null`, `[]`, `""`, ``, `{} {}`, `{"sharepriority":null}`,
		`{"sharepriority":{"atlas":80,"cms":20}}`,
		`{"sharepriority":{"_default":200}}`,
		`{"sharepriority":{"":50}}`,
		`{"sharepriority":{}}`,
		`{"sharepriority":{"a":1,"a":2}}`,
		`atlas=80,cms=20`,
		`atlas:validation 80, atlas:slow-prod=20`,
		`=5`, `a=0`, `a=+7`, `a= 7`, ` =7,b=1`, `a=1=2`, `a = 3 `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		refused := func(what string, err error) bool {
			t.Helper()
			if err != nil && strings.TrimSpace(err.Error()) == "" {
				t.Fatalf("%s: a refusal without a reason", what)
			}
			return err != nil
		}
		if req, err := decodePriorityRequest(data); !refused("priority", err) {
			if req.DTR == uuid.Nil || req.Priority < 1 || req.Priority > 100 {
				t.Fatalf("priority request %+v accepted", req)
			}
		}
		if req, err := decodeCancelRequest(data); !refused("cancel", err) {
			if (req.DTR == uuid.Nil) == (req.Job == "") {
				t.Fatalf("cancel request %+v accepted", req)
			}
		}
		if req, err := decodeReconfigureRequest(data); !refused("reconfigure", err) {
			checkSharePriorities(t, req.SharePriority, false)
			// What the decoder accepts, the core takes.
			if err := core.New(core.DefaultConfig()).SetSharePriorities(time.Now(), req.SharePriority); err != nil {
				t.Fatalf("reconfigure request %+v accepted, but the core refuses it: %v", req, err)
			}
		}
		if prios, err := api.ParseSharePriorities(string(data)); !refused("share priorities", err) {
			checkSharePriorities(t, prios, true)
		}
	})
}

// checkSharePriorities fails unless every share has a name and a priority
// 1–100; trimmed says the names must have no surrounding space, nor the
// "=" that separates a name from its priority.
func checkSharePriorities(t *testing.T, prios map[string]int, trimmed bool) {
	t.Helper()
	if prios == nil {
		t.Fatal("share priorities accepted as nil")
	}
	for share, p := range prios {
		if share == "" || p < 1 || p > 100 || trimmed && (strings.TrimSpace(share) != share || strings.HasSuffix(share, "=")) {
			t.Fatalf("share priorities %v accepted", prios)
		}
	}
}

// FuzzParsePriorityFileReportsBadLinesByNumberAndTakesTheRest feeds
// ParsePriorityFile any dtr.state.prio file. It checks that every change
// returned is a DTR id and a priority 1–100 that stand on a line of the
// file, in the file's order; that every problem names a line number of the
// file; and that each line of the file either gave a change, was blank or
// a comment, or was reported.
func FuzzParsePriorityFileReportsBadLinesByNumberAndTakesTheRest(f *testing.F) {
	id := "c3e12bfa-ba9a-4a45-be73-0b3b2a206e1c"
	for _, s := range []string{
		id + " 90\nff2d5329-5440-49aa-83cb-72daeb5e3e59 95\n",
		"\n# raise one\n" + id + " 90\n",
		id + " 101", id + " high", "job-7 50", id + " 50 extra", "x 1\n" + id + " 70\n",
		id + "\t+7\r\n", id + " 007", "{" + id + "} 5", "urn:uuid:" + id + " 5",
		"\x00\xff\n" + id + " 1", "\n\n\n" + id + " -1", id + " 9999999999999999999999",
		strings.Repeat("#", 70000) + "\n" + id + " 5\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		changes, err := ParsePriorityFile(data)
		lines := strings.Split(string(data), "\n")
		reported := map[int]bool{}
		if err != nil {
			var list []error
			if j, ok := err.(interface{ Unwrap() []error }); ok {
				list = j.Unwrap()
			} else {
				list = []error{err}
			}
			for _, e := range list {
				var n int
				if _, serr := fmt.Sscanf(e.Error(), "line %d", &n); serr != nil {
					t.Fatalf("a problem that names no line: %q", e)
				}
				if n < 1 || n > len(lines) {
					t.Fatalf("a problem on line %d of a file of %d lines: %q", n, len(lines), e)
				}
				reported[n] = true
			}
		}
		// Walk the file: each change is the next good line.
		next := 0
		for i, line := range lines {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") || reported[i+1] {
				continue
			}
			if next >= len(changes) {
				t.Fatalf("line %d %q neither applied nor reported", i+1, line)
			}
			c := changes[next]
			next++
			if c.Priority < 1 || c.Priority > 100 {
				t.Fatalf("line %d: priority %d taken", i+1, c.Priority)
			}
			fields := strings.Fields(line)
			if len(fields) != 2 {
				t.Fatalf("line %d %q taken as %+v", i+1, line, c)
			}
			if u, err := uuid.Parse(fields[0]); err != nil || u != c.DTR || fmt.Sprint(c.Priority) != strings.TrimLeft(strings.TrimPrefix(fields[1], "+"), "0") {
				t.Fatalf("line %d %q taken as %+v", i+1, line, c)
			}
		}
		if next != len(changes) {
			t.Fatalf("%d changes from %d good lines", len(changes), next)
		}
	})
}

// FuzzHostOfNamesTheEndpointAsURLParseDoes checks hostOf's quick path
// against url.Parse: the same endpoint for every string.
func FuzzHostOfNamesTheEndpointAsURLParseDoes(f *testing.F) {
	for _, s := range []string{"http://host.example:8080/a/b?c#d", "file:///data/x", "https://user@h/p", "HTTP://h/", "http://h:x/",
		"http://h/%zz", "root://eos.cern.ch:1094//eos/f", "s3://bucket/key", "http://[::1]:80/", "http://h:/p", "a+b-c.d://H-1.x/", "1http://h/",
		"http://h\x7f/", "http://h/a b", "://h/", "http:/h/p", "http://h#frag%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		want := ""
		if u, err := url.Parse(raw); err == nil {
			want = u.Scheme + "://" + u.Host
		}
		if got := hostOf(raw); got != want {
			t.Fatalf("hostOf(%q) = %q, url.Parse gives %q", raw, got, want)
		}
	})
}
