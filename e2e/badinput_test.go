package e2e

// The bad input tour: every kind of bad input tried on a real Sluice, and
// what Sluice answers to each. docs/bad-input.md's table names the test
// of each row.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// watch collects what arrives on a subject (core NATS: it sees every
// message published there, whoever consumes it).
func watch[T any](t *testing.T, nc *nats.Conn, subject string, decode func(*nats.Msg) (T, bool)) <-chan T {
	t.Helper()
	return watchEach(t, nc, subject, func(m *nats.Msg) []T {
		if v, ok := decode(m); ok {
			return []T{v}
		}
		return nil
	})
}

// watchEach collects every value that decode finds in the messages on
// subject, several per message if it finds several.
func watchEach[T any](t *testing.T, nc *nats.Conn, subject string, decode func(*nats.Msg) []T) <-chan T {
	t.Helper()
	ch := make(chan T, 1000)
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		for _, v := range decode(m) {
			ch <- v
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return ch
}

// watchRejections collects the scheduler's rejection events.
func watchRejections(t *testing.T, nc *nats.Conn) <-chan api.Rejection {
	return watch(t, nc, api.SubjectRejected, func(m *nats.Msg) (api.Rejection, bool) {
		var r api.Rejection
		_, err := codec.DecodeData(context.Background(), m, api.TypeRejected, &r)
		return r, err == nil
	})
}

// termination is JetStream's advisory that a consumer terminated a message
// (the consumer will not see it again; on a work queue it is gone).
type termination struct {
	Stream    string `json:"stream"`
	Consumer  string `json:"consumer"`
	StreamSeq uint64 `json:"stream_seq"`
}

// watchTerminations collects JetStream's advisories of terminated messages.
func watchTerminations(t *testing.T, nc *nats.Conn) <-chan termination {
	return watch(t, nc, "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.>", func(m *nats.Msg) (termination, bool) {
		var a termination
		return a, json.Unmarshal(m.Data, &a) == nil
	})
}

// watchResults collects every result a worker publishes, one by one
// whether it came alone or with others.
func watchResults(t *testing.T, nc *nats.Conn) <-chan api.Result {
	return watchEach(t, nc, api.SubjectResultPrefix+">", func(m *nats.Msg) []api.Result {
		rs, _ := codec.DecodeResults(context.Background(), m)
		return rs
	})
}

// next returns the first value that ok accepts, failing after within.
func next[T any](t *testing.T, ch <-chan T, within time.Duration, what string, ok func(T) bool) T {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case v := <-ch:
			if ok(v) {
				return v
			}
		case <-timeout:
			t.Fatalf("no %s within %s", what, within)
		}
	}
}

// none fails if a value that ok accepts arrives within d.
func none[T any](t *testing.T, ch <-chan T, d time.Duration, what string, ok func(T) bool) {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case v := <-ch:
			if ok(v) {
				t.Fatalf("unexpected %s: %+v", what, v)
			}
		case <-timeout:
			return
		}
	}
}

// publish sends m to JetStream with a fresh message id and returns the id
// and the stream sequence it was stored at.
func (s *system) publish(m *nats.Msg) (msgID string, seq uint64) {
	s.t.Helper()
	if m.Header.Get(nats.MsgIdHdr) == "" {
		m.Header.Set(nats.MsgIdHdr, uuid.NewString())
	}
	// The streams appear once the scheduler has set them up, a moment
	// after the roles start.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ack, err := s.js.PublishMsg(context.Background(), m)
		if errors.Is(err, jetstream.ErrNoStreamResponse) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err != nil {
			s.t.Fatalf("publish to %s: %v", m.Subject, err)
		}
		return m.Header.Get(nats.MsgIdHdr), ack.Sequence
	}
}

// event builds a binary-mode CloudEvent message as Sluice's own services
// send them.
func event(t *testing.T, subject, typ string, data any) *nats.Msg {
	t.Helper()
	ev, err := codec.NewEvent(typ, "e2e-test", "", data)
	if err != nil {
		t.Fatal(err)
	}
	m, err := codec.Encode(context.Background(), subject, "", ev)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// dtrRecord is the scheduler's record of a DTR, as sluice.api.dtr answers
// (the scheduler's DTRs, its journal, then the sluice_dtrs bucket), and
// that record's JSON, which changes with any change of the DTR; ok is false
// when the scheduler never stored it.
func (s *system) dtrRecord(id uuid.UUID) (d dtr.DTR, version string, ok bool) {
	s.t.Helper()
	var r api.DTRReply
	err := s.request(api.SubjectDTR, []byte(id.String()), nil, &r)
	if err != nil && strings.Contains(err.Error(), "unknown DTR") {
		return d, "", false
	}
	if err != nil {
		s.t.Fatal(err)
	}
	b, err := json.Marshal(r.DTR)
	if err != nil {
		s.t.Fatal(err)
	}
	return r.DTR, string(b), true
}

// awaitDTR polls the scheduler's record of a DTR until ok accepts it.
func (s *system) awaitDTR(id uuid.UUID, within time.Duration, ok func(dtr.DTR) bool) dtr.DTR {
	s.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var r api.DTRReply
		err := s.request(api.SubjectDTR, []byte(id.String()), nil, &r)
		if err == nil && ok(r.DTR) {
			return r.DTR
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("DTR %s is %s (%v) after %s", id, r.DTR.State, err, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// drained waits until the scheduler has acknowledged or terminated every
// message of its two input streams.
func (s *system) drained() {
	s.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		left := uint64(0)
		for _, name := range []string{bus.StreamSubmit, bus.StreamResults} {
			st, err := s.js.Stream(context.Background(), name)
			if err != nil {
				s.t.Fatal(err)
			}
			left += st.CachedInfo().State.Msgs
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%d messages still wait for the scheduler", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// durable is what bad input must leave alone: every DTR record, every grant
// ever published and every job record.
type durable struct {
	DTRs         map[string]uint64
	Grants, Jobs [3]uint64
	// Journaled is the last sequence of the scheduler's journal: it
	// grows with every change of a DTR.
	Journaled uint64
}

// durableState is taken once the scheduler has checkpointed its journal
// (testConfig checkpoints soon after every change).
func durableState(t *testing.T, js jetstream.JetStream) durable {
	t.Helper()
	st := snapshot(t, js)
	for deadline := time.Now().Add(10 * time.Second); st.Streams[bus.StreamJournal][0] > 0; st = snapshot(t, js) {
		if time.Now().After(deadline) {
			t.Fatalf("the scheduler's journal still holds %d messages", st.Streams[bus.StreamJournal][0])
		}
		time.Sleep(20 * time.Millisecond)
	}
	return durable{DTRs: st.DTRs, Grants: st.Streams[bus.StreamGrants], Jobs: st.Streams["KV_"+bus.BucketJobs],
		Journaled: st.Streams[bus.StreamJournal][2]}
}

func TestMalformedEventsOnEveryInputSubjectAreRejectedTerminatedAndChangeNothing(t *testing.T) {
	s := start(t, testConfig())
	s.shares() // the scheduler is up: it has set up the streams
	rejections, terms := watchRejections(t, s.nc), watchTerminations(t, s.nc)
	before := durableState(t, s.js)

	// What each input subject takes, well formed.
	valid := map[string]struct {
		typ  string
		data func() string
	}{
		api.SubjectSubmit: {api.TypeSubmit, func() string {
			return fmt.Sprintf(`{"id":%q,"source":"file:///in/a","destination":"file:///out/a"}`, uuid.New())
		}},
		api.SubjectCancelCommand: {api.TypeCancel, func() string { return fmt.Sprintf(`{"dtr":%q}`, uuid.New()) }},
		api.ResultSubject(dtr.StageDelivery): {api.TypeResult, func() string {
			id := uuid.New()
			return fmt.Sprintf(`{"dtr":%q,"grant":"%s.1","state":"TRANSFERRING"}`, id, id)
		}},
		api.ProgressSubject(dtr.StagePre): {api.TypeProgress, func() string {
			id := uuid.New()
			return fmt.Sprintf(`{"dtr":%q,"grant":"%s.1","bytes":1}`, id, id)
		}},
	}
	binary := func(subject, typ, data string) *nats.Msg {
		m := nats.NewMsg(subject)
		m.Header.Set("ce-specversion", "1.0")
		m.Header.Set("ce-id", uuid.NewString())
		m.Header.Set("ce-source", "e2e-test")
		m.Header.Set("ce-type", typ)
		m.Header.Set("content-type", "application/json")
		m.Data = []byte(data)
		return m
	}
	kinds := []struct {
		name string
		msg  func(subject string) *nats.Msg
		// want is what the reason says, per subject ("" for the others).
		want map[string]string
	}{
		{"binary CloudEvent without ce-type", func(subject string) *nats.Msg {
			m := binary(subject, valid[subject].typ, valid[subject].data())
			m.Header.Del("ce-type")
			return m
		}, map[string]string{"": "invalid CloudEvent: type: MUST be a non-empty string"}},
		{"binary CloudEvent of an unknown ce-specversion", func(subject string) *nats.Msg {
			m := binary(subject, valid[subject].typ, valid[subject].data())
			m.Header.Set("ce-specversion", "9.9")
			return m
		}, map[string]string{"": `unknown CloudEvents specversion "9.9"`}},
		{"binary CloudEvent of another subject's type", func(subject string) *nats.Msg {
			return binary(subject, api.TypeGrant, valid[subject].data())
		}, map[string]string{"": `event type "org.sluice.grant.v1", want "org.sluice.`}},
		{"binary CloudEvent with no data", func(subject string) *nats.Msg {
			return binary(subject, valid[subject].typ, "")
		}, map[string]string{"": "data: unexpected end of JSON input", api.SubjectSubmit: "empty DTR"}},
		{"binary CloudEvent whose data is not JSON", func(subject string) *nats.Msg {
			return binary(subject, valid[subject].typ, "{not json")
		}, map[string]string{"": "data: invalid character", api.SubjectSubmit: "DTR JSON: invalid character"}},
		{"structured CloudEvent that is not JSON", func(subject string) *nats.Msg {
			m := nats.NewMsg(subject)
			m.Header.Set("content-type", "application/cloudevents+json")
			m.Data = []byte(`{"specversion":"1.0",`)
			return m
		}, map[string]string{"": "malformed CloudEvent"}},
		{"plain JSON with an unknown field", func(subject string) *nats.Msg {
			m := nats.NewMsg(subject)
			d := valid[subject].data()
			m.Data = []byte(d[:len(d)-1] + `,"sauce":1}`)
			return m
		}, map[string]string{"": "not a CloudEvent", api.SubjectSubmit: `unknown field "sauce"`}},
		{"an empty body and no headers", func(subject string) *nats.Msg { return nats.NewMsg(subject) },
			map[string]string{"": "not a CloudEvent", api.SubjectSubmit: "empty DTR"}},
	}
	subjects := []string{api.SubjectSubmit, api.SubjectCancelCommand, api.ResultSubject(dtr.StageDelivery), api.ProgressSubject(dtr.StagePre)}
	for _, k := range kinds {
		for _, subject := range subjects {
			t.Run(k.name+" on "+subject, func(t *testing.T) {
				want, ok := k.want[subject]
				if !ok {
					want = k.want[""]
				}
				msgID, seq := s.publish(k.msg(subject))
				r := next(t, rejections, 10*time.Second, "rejection of "+msgID, func(r api.Rejection) bool { return r.MsgID == msgID })
				t.Logf("reason: %s", r.Reason)
				mustContain(t, "reason", r.Reason, want)
				if r.Subject != subject {
					t.Fatalf("the rejection names subject %q, want %q", r.Subject, subject)
				}
				stream := bus.StreamSubmit
				if strings.HasPrefix(subject, "sluice.result.") || strings.HasPrefix(subject, "sluice.progress.") {
					stream = bus.StreamResults
				}
				next(t, terms, 10*time.Second, "termination", func(a termination) bool {
					return a.Stream == stream && a.Consumer == bus.ConsumerSched && a.StreamSeq == seq
				})
			})
		}
	}
	s.drained()
	if after := durableState(t, s.js); !reflect.DeepEqual(before, after) {
		t.Fatalf("bad input changed what it must not:\nbefore %+v\nafter  %+v", before, after)
	}
}

// submitDTR publishes a DTR as plain JSON to dtr.submit and returns its id.
func (s *system) submitDTR(fields string) uuid.UUID {
	s.t.Helper()
	id := uuid.New()
	m := nats.NewMsg(api.SubjectSubmit)
	m.Data = fmt.Appendf(nil, `{"id":%q,%s}`, id, fields)
	m.Header.Set(nats.MsgIdHdr, id.String())
	s.publish(m)
	return id
}

func final(d dtr.DTR) bool { return d.State.Final() }

func TestADTRInAShareWithNoConfiguredPriorityGetsTheDefaultOne(t *testing.T) {
	cfg := testConfig()
	cfg.SharePolicy, cfg.SharePriority = "voms:vo", "atlas=60"
	s := start(t, cfg)
	src := filepath.Join(s.dir, "src")
	writeFile(t, src, 1000, 1)
	submit := func(vo string, userPriority int) dtr.DTR {
		t.Helper()
		id := s.submitDTR(fmt.Sprintf(`"source":%q,"destination":%q,"owner":{"fqans":["/%s"]},"direction":"download","user_priority":%d`,
			fileURL(src), fileURL(filepath.Join(s.dir, "out", uuid.NewString())), vo, userPriority))
		d := s.awaitDTR(id, 30*time.Second, final)
		if d.State != dtr.Done {
			t.Fatalf("DTR of %s ended %s: %+v", vo, d.State, d.Error)
		}
		return d
	}
	reconfigure := func(prios map[string]int) {
		t.Helper()
		var r api.SharesReply
		b, _ := json.Marshal(api.ReconfigureRequest{SharePriority: prios})
		if err := s.request(api.SubjectReconfigure, b, nil, &r); err != nil {
			t.Fatalf("reconfigure %v: %v", prios, err)
		}
	}
	tests := []struct {
		name         string
		before       func()
		vo           string
		userPriority int
		share        string
		priority     int
	}{
		{"a configured share: 60 × 50 / 100", nil, "atlas", 0, "atlas-download", 30},
		{"a share not in SLUICE_SHAREPRIORITY takes _default's 50", nil, "lhcb", 0, "lhcb-download", 25},
		{"and its user priority still counts", nil, "lhcb", 80, "lhcb-download", 40},
		{"reconfigure may name a share that has no DTR yet; its DTRs take it when they come",
			func() { reconfigure(map[string]int{"lhcb": 90, "no-such-vo": 10}) }, "lhcb", 0, "lhcb-download", 45},
		{"reconfigure replaces the whole table: a share it leaves out falls back to _default", nil, "atlas", 0, "atlas-download", 25},
		{"a configured _default is the priority of every share not named",
			func() { reconfigure(map[string]int{"_default": 20}) }, "cms", 0, "cms-download", 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.before != nil {
				tt.before()
			}
			d := submit(tt.vo, tt.userPriority)
			if d.Share != tt.share || d.Priority != tt.priority {
				t.Fatalf("share %q at priority %d, want %q at %d", d.Share, d.Priority, tt.share, tt.priority)
			}
		})
	}
}

func TestControlRequestsNamingUnknownDTRsJobsOrSharesAnswerAndChangeNothing(t *testing.T) {
	s := start(t, testConfig())
	src := filepath.Join(s.dir, "src")
	writeFile(t, src, 1000, 1)
	done := s.submit(&job.Job{Inputs: []job.File{{Source: fileURL(src), Destination: fileURL(filepath.Join(s.dir, "out", "done"))}}})
	s.wait(done.JobID, 30*time.Second)
	finished := done.DTRs[0]
	rejections, terms := watchRejections(t, s.nc), watchTerminations(t, s.nc)
	before := durableState(t, s.js)

	unknown := uuid.New()
	tests := []struct {
		name, subject, body string
		want                string // the error; "" for a reply
		reply               string // what the reply holds
	}{
		{"the priority of an unknown DTR", api.SubjectPriority, fmt.Sprintf(`{"dtr":%q,"priority":50}`, unknown), "404 unknown DTR " + unknown.String() + " (or it has finished)", ""},
		{"the priority of a finished DTR", api.SubjectPriority, fmt.Sprintf(`{"dtr":%q,"priority":50}`, finished), "404 unknown DTR " + finished.String() + " (or it has finished)", ""},
		{"priority 0", api.SubjectPriority, fmt.Sprintf(`{"dtr":%q,"priority":0}`, finished), "400 priority 0 is outside 1–100", ""},
		{"priority 101", api.SubjectPriority, fmt.Sprintf(`{"dtr":%q,"priority":101}`, unknown), "400 priority 101 is outside 1–100", ""},
		{"cancel of an unknown DTR", api.SubjectCancel, fmt.Sprintf(`{"dtr":%q}`, unknown), "404 unknown DTR " + unknown.String() + " (or it has finished)", ""},
		{"cancel of a finished DTR", api.SubjectCancel, fmt.Sprintf(`{"dtr":%q}`, finished), "404 unknown DTR " + finished.String() + " (or it has finished)", ""},
		{"cancel of a DTR and a job at once", api.SubjectCancel, fmt.Sprintf(`{"dtr":%q,"job":"x"}`, unknown), "400 name either a dtr or a job to cancel", ""},
		{"cancel of a finished job", api.SubjectCancel, fmt.Sprintf(`{"job":%q}`, done.JobID), fmt.Sprintf(`404 unknown job %q (or every DTR of it has finished)`, done.JobID), ""},
		{"a share priority of 0", api.SubjectReconfigure, `{"sharepriority":{"atlas":0}}`, `400 share "atlas": priority 0 is outside 1–100`, ""},
		{"an empty share name", api.SubjectReconfigure, `{"sharepriority":{"":50}}`, "400 a share name is empty", ""},
		{"the why of a DTR id that is not a UUID", api.SubjectDTR, `twelve`, `400 DTR id "twelve" is not a UUID`, ""},
		{"the why of an unknown DTR", api.SubjectDTR, unknown.String(), "404 unknown DTR " + unknown.String(), ""},
		{"the history of a DTR id that is not a UUID", api.SubjectHistory, `twelve`, `400 DTR id "twelve" is not a UUID`, ""},
		{"the history of an unknown DTR", api.SubjectHistory, unknown.String(), "404 unknown DTR " + unknown.String() + " (never submitted, or its record has expired)", ""},
		{"the status of an unknown job", api.SubjectJobStatus, "no-such-job", `404 unknown job "no-such-job"`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := nats.NewMsg(tt.subject)
			m.Data = []byte(tt.body)
			reply, err := s.nc.RequestMsg(m, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.TrimSpace(reply.Header.Get("Nats-Service-Error-Code") + " " + reply.Header.Get("Nats-Service-Error"))
			if got != tt.want {
				t.Fatalf("error %q, want %q", got, tt.want)
			}
			if tt.reply != "" && strings.TrimSpace(string(reply.Data)) != tt.reply {
				t.Fatalf("reply %s, want %s", reply.Data, tt.reply)
			}
		})
	}
	// A cancel command on the stream for a DTR the scheduler does not know
	// is taken (acknowledged) and does nothing.
	_, seq := s.publish(event(t, api.SubjectCancelCommand, api.TypeCancel, api.Cancel{DTR: unknown}))
	s.drained()
	none(t, terms, 500*time.Millisecond, "termination of the cancel", func(a termination) bool { return a.StreamSeq == seq })
	none(t, rejections, 100*time.Millisecond, "rejection", func(api.Rejection) bool { return true })
	if after := durableState(t, s.js); !reflect.DeepEqual(before, after) {
		t.Fatalf("the requests changed what they must not:\nbefore %+v\nafter  %+v", before, after)
	}

	// A share that has no DTR may be given a priority.
	var shares api.SharesReply
	if err := s.request(api.SubjectReconfigure, []byte(`{"sharepriority":{"no-such-share":70}}`), nil, &shares); err != nil {
		t.Fatalf("reconfigure naming a share with no DTR: %v", err)
	}
	// A job id that no DTR has is unknown, and is not remembered: made-up
	// ids grow nothing, and a DTR of that job that comes later runs.
	var c api.CancelReply
	if err := s.request(api.SubjectCancel, []byte(`{"job":"not-yet-submitted"}`), nil, &c); err == nil || !strings.Contains(err.Error(), `unknown job "not-yet-submitted"`) {
		t.Fatalf("cancel of an unknown job: %v, %+v; want unknown job", err, c)
	}
	late := s.submitDTR(fmt.Sprintf(`"job_id":"not-yet-submitted","source":%q,"destination":%q`, fileURL(src), fileURL(filepath.Join(s.dir, "out", "late"))))
	if d := s.awaitDTR(late, 30*time.Second, final); d.State != dtr.Done {
		t.Fatalf("a DTR of a job whose cancel came before any of its DTRs ended %s, want DONE", d.State)
	}
}

// forgedGrant is a grant published by someone other than the scheduler.
func forgedGrant(t *testing.T, stage dtr.Stage, state dtr.State, grant string, d dtr.DTR) *nats.Msg {
	t.Helper()
	return event(t, api.GrantSubject(stage), api.TypeGrant, api.Grant{ID: grant, Stage: stage, State: state, DTR: &d, LeaseSeconds: 60})
}

// TestForgedGrantsAreCarriedOutByWorkersButChangeNoDTR shows what a grant
// published by someone other than the scheduler does on a NATS server that
// lets anyone publish to sluice.grant.> (the embedded one; the deployment's
// permissions refuse it, see TestEachRoleWorksWithOnlyItsOwnNATSPermissions).
// A worker cannot tell a forged grant from a real one: it does the work,
// within SLUICE_FILE_ROOTS. The scheduler ignores what the worker reports,
// so no DTR record changes.
func TestForgedGrantsAreCarriedOutByWorkersButChangeNoDTR(t *testing.T) {
	cfg := testConfig()
	root, outside := t.TempDir(), t.TempDir()
	cfg.FileRoots = []string{root}
	s := start(t, cfg)
	results, terms := watchResults(t, s.nc), watchTerminations(t, s.nc)
	secret := filepath.Join(root, "secret")
	writeFile(t, secret, 3000, 9)
	want, _ := os.ReadFile(secret)
	victim := filepath.Join(root, "victim")
	writeFile(t, victim, 100, 1)
	writeFile(t, filepath.Join(outside, "private"), 100, 2)
	// A real DTR, finished before the forgeries.
	real := s.submit(&job.Job{Inputs: []job.File{{Source: fileURL(secret), Destination: fileURL(filepath.Join(root, "real"))}}})
	s.wait(real.JobID, 30*time.Second)
	realDTR, _, _ := s.dtrRecord(real.DTRs[0])
	before := durableState(t, s.js)

	forged := uuid.New()
	planted := filepath.Join(root, "planted")
	tmp := func(dst, grant string) string {
		p, err := transfer.LocalPath(transfer.TempURL(fileURL(dst), grant))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Each forged grant is run by a worker whose result the scheduler
	// ignores; check says what the work did.
	tests := []struct {
		name  string
		stage dtr.Stage
		state dtr.State
		grant string
		dtr   dtr.DTR
		kind  dtr.ErrorKind // of the worker's result; "" for success
		check func(t *testing.T)
	}{
		{"a delivery grant for a DTR the scheduler never had copies the source to the destination's temporary name",
			dtr.StageDelivery, dtr.Transferring, "forged.1",
			dtr.DTR{ID: forged, Source: fileURL(secret), Destination: fileURL(planted), TransferGrant: "forged.1"}, "",
			func(t *testing.T) {
				if got, err := os.ReadFile(tmp(planted, "forged.1")); err != nil || !bytes.Equal(got, want) {
					t.Fatalf("the forged transfer's file: %v", err)
				}
			}},
		{"a post-processing grant then renames it into place",
			dtr.StagePost, dtr.RegisteringReplica, "forged.2",
			dtr.DTR{ID: forged, Source: fileURL(secret), Destination: fileURL(planted), TransferGrant: "forged.1"}, "",
			func(t *testing.T) {
				if got, err := os.ReadFile(planted); err != nil || !bytes.Equal(got, want) {
					t.Fatalf("the planted file: %v", err)
				}
			}},
		{"a pre-cleaning grant with overwrite deletes nothing (pre-cleaning never deletes)",
			dtr.StagePre, dtr.PreCleaning, "forged.3",
			dtr.DTR{ID: forged, Source: fileURL(secret), Destination: fileURL(victim), Options: dtr.Options{Overwrite: true}}, "",
			func(t *testing.T) {
				if _, err := os.Stat(victim); err != nil {
					t.Fatalf("the victim: %v", err)
				}
			}},
		{"a grant naming a real DTR with a grant id never issued is run too",
			dtr.StageDelivery, dtr.Transferring, real.DTRs[0].String() + ".99",
			func() dtr.DTR { d := realDTR; d.TransferGrant = real.DTRs[0].String() + ".99"; return d }(), "",
			func(t *testing.T) {
				if _, err := os.Stat(tmp(filepath.Join(root, "real"), real.DTRs[0].String()+".99")); err != nil {
					t.Fatalf("the forged transfer of the real DTR: %v", err)
				}
			}},
		{"SLUICE_FILE_ROOTS hold: a forged grant cannot read outside them",
			dtr.StageDelivery, dtr.Transferring, "forged.4",
			dtr.DTR{ID: forged, Source: fileURL(filepath.Join(outside, "private")), Destination: fileURL(filepath.Join(root, "stolen")), TransferGrant: "forged.4"},
			dtr.ErrLocalFile, func(t *testing.T) {
				if _, err := os.Stat(tmp(filepath.Join(root, "stolen"), "forged.4")); err == nil {
					t.Fatal("a file outside the roots was copied")
				}
			}},
		{"nor write outside them",
			dtr.StageDelivery, dtr.Transferring, "forged.5",
			dtr.DTR{ID: forged, Source: fileURL(secret), Destination: fileURL(filepath.Join(outside, "planted")), TransferGrant: "forged.5"},
			dtr.ErrLocalFile, func(t *testing.T) {
				if es, _ := os.ReadDir(outside); len(es) != 1 {
					t.Fatalf("written outside the roots: %v", es)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s.publish(forgedGrant(t, tt.stage, tt.state, tt.grant, tt.dtr))
			r := next(t, results, 20*time.Second, "result of "+tt.grant, func(r api.Result) bool { return r.Grant == tt.grant })
			if kind := dtr.ErrNone; r.Error != nil {
				kind = r.Error.Kind
				if tt.kind != kind {
					t.Fatalf("the worker's result: %+v, want %q", r.Error, tt.kind)
				}
			} else if tt.kind != "" {
				t.Fatalf("the worker succeeded, want %s", tt.kind)
			}
			tt.check(t)
			s.drained() // the scheduler has taken the result
		})
	}
	// The scheduler ignored every result: no DTR record was made or
	// changed, no grant was published.
	if after := durableState(t, s.js); !reflect.DeepEqual(before.DTRs, after.DTRs) || before.Grants[2] != after.Grants[2]-uint64(len(tests)) {
		t.Fatalf("forged grants changed DTR records or brought grants:\nbefore %+v\nafter  %+v", before, after)
	}
	if _, _, ok := s.dtrRecord(forged); ok {
		t.Fatal("the scheduler stored the forged DTR")
	}
	// A grant that is not an event at all is dropped by the worker
	// (terminated), and does nothing.
	_, seq := s.publish(func() *nats.Msg {
		m := nats.NewMsg(api.GrantSubject(dtr.StageDelivery))
		m.Data = []byte(`{}`)
		return m
	}())
	next(t, terms, 10*time.Second, "termination of the malformed grant", func(a termination) bool {
		return a.Stream == bus.StreamGrants && a.Consumer == string(dtr.StageDelivery) && a.StreamSeq == seq
	})
}

// TestForgedResultsAreIgnoredUnlessTheyNameTheCurrentGrant: a result or
// progress event for a grant that is not a DTR's current one, or on another
// stage's subject, changes nothing. Grant ids are "<dtr id>.<n>", so one
// who may publish results of the grant's stage and knows a DTR's id can
// name its current grant: that result is taken.
func TestForgedResultsAreIgnoredUnlessTheyNameTheCurrentGrant(t *testing.T) {
	s := start(t, testConfig(), "scheduler") // no processor: the pre-processing grant stays in hand
	rejections, terms := watchRejections(t, s.nc), watchTerminations(t, s.nc)
	id := s.submitDTR(fmt.Sprintf(`"source":"https://storage.example/a","destination":%q`, fileURL(filepath.Join(s.dir, "a"))))
	current := id.String() + ".1"
	held := s.awaitDTR(id, 10*time.Second, func(d dtr.DTR) bool { return d.State == dtr.QueryingReplica })
	if held.Grant != current {
		t.Fatalf("grant %q, want %q", held.Grant, current)
	}
	_, rev, _ := s.dtrRecord(id)
	fail := &dtr.Failure{Kind: dtr.ErrPermanentRemote, Text: "forged failure"}
	tests := []struct {
		name string
		msg  *nats.Msg
	}{
		{"a result for a DTR the scheduler does not know", event(t, api.ResultSubject(dtr.StagePre), api.TypeResult,
			api.Result{DTR: uuid.New(), Grant: uuid.NewString() + ".1", Error: fail})},
		{"a result naming a grant never issued", event(t, api.ResultSubject(dtr.StagePre), api.TypeResult,
			api.Result{DTR: id, Grant: id.String() + ".7", Error: fail})},
		{"a result naming the current grant on another stage's subject (a deliverer's for a pre-processing grant)",
			event(t, api.ResultSubject(dtr.StageDelivery), api.TypeResult, api.Result{DTR: id, Grant: current, Error: fail})},
		{"a progress event naming a grant never issued", event(t, api.ProgressSubject(dtr.StagePre), api.TypeProgress,
			api.Progress{DTR: id, Grant: id.String() + ".7", Bytes: 5})},
		{"a result whose data has unknown fields (ignored fields) for a grant never issued", event(t, api.ResultSubject(dtr.StagePre), api.TypeResult,
			map[string]any{"dtr": id, "grant": id.String() + ".8", "sauce": 1})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msgID, seq := s.publish(tt.msg)
			s.drained()
			none(t, terms, 300*time.Millisecond, "termination", func(a termination) bool { return a.StreamSeq == seq && a.Stream == bus.StreamResults })
			none(t, rejections, 100*time.Millisecond, "rejection", func(r api.Rejection) bool { return r.MsgID == msgID })
			if d, r, _ := s.dtrRecord(id); r != rev || d.State != dtr.QueryingReplica || d.Grant != current {
				t.Fatalf("the DTR changed: %s, grant %s:\nbefore %s\nafter  %s", d.State, d.Grant, rev, r)
			}
		})
	}
	// The current grant's id is predictable: a forged result naming it on
	// its stage's subject is taken as the worker's.
	s.publish(event(t, api.ResultSubject(dtr.StagePre), api.TypeResult, api.Result{DTR: id, Grant: current, Error: fail}))
	d := s.awaitDTR(id, 10*time.Second, final)
	if d.State != dtr.Error || d.Error == nil || d.Error.Text != "forged failure" {
		t.Fatalf("after a forged result naming the current grant the DTR is %s (%+v)", d.State, d.Error)
	}
}

func TestURLsWithPasswordsAreRefusedWithoutRepeatingThePassword(t *testing.T) {
	s := start(t, testConfig())
	rejections := watchRejections(t, s.nc)
	const password = "hunter2"
	url := "https://alice:" + password + "@storage.example/f"
	dst := fileURL(filepath.Join(s.dir, "out", "f"))
	t.Run("a DTR on dtr.submit", func(t *testing.T) {
		id := uuid.New()
		m := nats.NewMsg(api.SubjectSubmit)
		m.Data = fmt.Appendf(nil, `{"id":%q,"source":%q,"destination":%q}`, id, url, dst)
		msgID, _ := s.publish(m)
		r := next(t, rejections, 10*time.Second, "rejection", func(r api.Rejection) bool { return r.MsgID == msgID })
		mustContain(t, "reason", r.Reason, `source: URL "https://alice:xxxxx@storage.example/f" carries a password`)
		if b, _ := json.Marshal(r); strings.Contains(string(b), password) {
			t.Fatalf("the rejection event repeats the password: %s", b)
		}
		if _, _, ok := s.dtrRecord(id); ok {
			t.Fatal("the DTR was stored")
		}
	})
	for _, tt := range []struct{ name, description string }{
		{"a JSON job", fmt.Sprintf(`{"inputs":[{"source":%q,"destination":%q}]}`, url, dst)},
		{"an xRSL job", fmt.Sprintf(`&(inputfiles=("f" %q))`, url)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var reply api.SubmitReply
			h := nats.Header{api.HeaderSessionDir: []string{filepath.Join(s.dir, "session")}}
			err := s.request(api.SubjectJobSubmit, []byte(tt.description), h, &reply)
			if err == nil {
				t.Fatalf("accepted as job %s", reply.JobID)
			}
			mustContain(t, "error", err.Error(), "carries a password")
			if strings.Contains(err.Error(), password) {
				t.Fatalf("the error repeats the password: %v", err)
			}
		})
	}
}

// TestABadTraceparentIsIgnoredAndTheDTRGetsATraceOfItsOwn: a traceparent
// that is not W3C's format is not an error; the DTR runs in a new trace.
func TestABadTraceparentIsIgnoredAndTheDTRGetsATraceOfItsOwn(t *testing.T) {
	rec := recordSpans(t)
	s := start(t, testConfig())
	src := filepath.Join(s.dir, "src")
	writeFile(t, src, 1000, 1)
	rejections := watchRejections(t, s.nc)
	data := func(id uuid.UUID) string {
		return fmt.Sprintf(`{"id":%q,"source":%q,"destination":%q}`, id, fileURL(src), fileURL(filepath.Join(s.dir, "out", id.String())))
	}
	tests := []struct {
		name string
		msg  func(id uuid.UUID) *nats.Msg
	}{
		{"a traceparent header that is not one", func(id uuid.UUID) *nats.Msg {
			m := nats.NewMsg(api.SubjectSubmit)
			m.Header.Set("traceparent", "not a traceparent")
			m.Data = []byte(data(id))
			return m
		}},
		{"an all-zero trace id", func(id uuid.UUID) *nats.Msg {
			m := nats.NewMsg(api.SubjectSubmit)
			m.Header.Set("traceparent", "00-00000000000000000000000000000000-0000000000000000-01")
			m.Data = []byte(data(id))
			return m
		}},
		{"a bad ce-traceparent extension", func(id uuid.UUID) *nats.Msg {
			m := event(t, api.SubjectSubmit, api.TypeSubmit, json.RawMessage(data(id)))
			m.Header.Del("traceparent")
			m.Header.Set("ce-traceparent", "00-xyz-01")
			return m
		}},
		{"a bad traceparent in a structured event", func(id uuid.UUID) *nats.Msg {
			m := nats.NewMsg(api.SubjectSubmit)
			m.Header.Set("content-type", "application/cloudevents+json")
			m.Data = fmt.Appendf(nil, `{"specversion":"1.0","id":"1","source":"test","type":%q,"traceparent":"garbage","datacontenttype":"application/json","data":%s}`,
				api.TypeSubmit, data(id))
			return m
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := uuid.New()
			msgID, _ := s.publish(tt.msg(id))
			d := s.awaitDTR(id, 30*time.Second, final)
			if d.State != dtr.Done {
				t.Fatalf("the DTR ended %s: %+v", d.State, d.Error)
			}
			none(t, rejections, 100*time.Millisecond, "rejection", func(r api.Rejection) bool { return r.MsgID == msgID })
			var tid trace.TraceID
			for _, sp := range rec.Ended() {
				if sp.Name() == "schedule dtr.submit" && spanAttr(sp, "messaging.message.id") == msgID {
					if sp.Parent().IsValid() {
						t.Fatalf("schedule dtr.submit has a parent %v", sp.Parent())
					}
					tid = sp.SpanContext().TraceID()
				}
			}
			if !tid.IsValid() || !strings.Contains(d.TraceParent, tid.String()) {
				t.Fatalf("the DTR's traceparent %q, want the new trace %s", d.TraceParent, tid)
			}
		})
	}
}

// TestADTRIdReusedByAnotherDTRIsRefused: a DTR id that is taken, reused
// for another source or destination, runs nothing; after JetStream's
// duplicate window the publisher is told why in a rejection event, and
// the same DTR sent again is taken quietly as a resubmission.
func TestADTRIdReusedByAnotherDTRIsRefused(t *testing.T) {
	s := start(t, testConfig())
	rejections := watchRejections(t, s.nc)
	src, other := filepath.Join(s.dir, "src"), filepath.Join(s.dir, "other")
	writeFile(t, src, 1000, 1)
	writeFile(t, other, 2000, 2)
	id := uuid.New()
	body := func(src, dst string) []byte {
		return fmt.Appendf(nil, `{"id":%q,"source":%q,"destination":%q}`, id, fileURL(src), fileURL(filepath.Join(s.dir, dst)))
	}
	m := nats.NewMsg(api.SubjectSubmit)
	m.Header.Set(nats.MsgIdHdr, id.String())
	m.Data = body(src, "first")
	s.publish(m)
	first := s.awaitDTR(id, 30*time.Second, final)
	_, rev, _ := s.dtrRecord(id)

	t.Run("with the same message id, within JetStream's 2-minute window", func(t *testing.T) {
		m := nats.NewMsg(api.SubjectSubmit)
		m.Header.Set(nats.MsgIdHdr, id.String())
		m.Data = body(other, "second")
		ack, err := s.js.PublishMsg(context.Background(), m)
		if err != nil || !ack.Duplicate {
			t.Fatalf("ack %+v, error %v; want a duplicate", ack, err)
		}
	})
	reused := []struct {
		name, src, dst string
	}{
		{"another source", other, "first"},
		{"another destination", src, "third"},
		{"both", other, "fourth"},
	}
	for _, c := range reused {
		t.Run("with another message id and "+c.name, func(t *testing.T) {
			m := nats.NewMsg(api.SubjectSubmit)
			m.Data = body(c.src, c.dst)
			msgID, _ := s.publish(m)
			r := next(t, rejections, 10*time.Second, "rejection", func(r api.Rejection) bool { return r.MsgID == msgID })
			if !strings.Contains(r.Reason, "taken by another DTR") || !strings.Contains(r.Reason, id.String()) {
				t.Fatalf("rejection reason %q; want the id and that it is taken", r.Reason)
			}
			if strings.Contains(r.Reason, "src") {
				t.Fatalf("rejection reason %q names the earlier DTR's source", r.Reason)
			}
		})
	}
	t.Run("the same DTR again, with another message id", func(t *testing.T) {
		m := nats.NewMsg(api.SubjectSubmit)
		m.Data = body(src, "first")
		msgID, _ := s.publish(m)
		s.drained()
		none(t, rejections, 300*time.Millisecond, "rejection", func(r api.Rejection) bool { return r.MsgID == msgID })
	})
	// None ran: the first DTR's record is as it was.
	if d, r, _ := s.dtrRecord(id); r != rev || d.Source != first.Source || d.State != dtr.Done {
		t.Fatalf("the DTR is now %s from %s:\nbefore %s\nafter  %s", d.State, d.Source, rev, r)
	}
	for _, name := range []string{"second", "third", "fourth"} {
		if _, err := os.Stat(filepath.Join(s.dir, name)); err == nil {
			t.Fatalf("the reused id wrote %s", name)
		}
	}
}

// TestADTRIdReusedIsRefusedWhereverTheFirstDTRIs: the earlier DTR under
// an id is found while the core holds it, within the same message, and after
// a scheduler restart in the sluice_dtrs bucket; each reuse by another DTR
// is refused, each resubmission of the same DTR taken quietly.
func TestADTRIdReusedIsRefusedWhereverTheFirstDTRIs(t *testing.T) {
	cfg := testConfig()
	cfg.Lease = 300 * time.Millisecond // a grant no worker takes is back soon
	s := start(t, cfg, "scheduler")    // no workers: DTRs are never carried out
	rejections := watchRejections(t, s.nc)
	dtrJSON := func(id uuid.UUID, dst string) json.RawMessage {
		return fmt.Appendf(nil, `{"id":%q,"source":"file:///data/in","destination":%q}`, id, "file:///data/"+dst)
	}
	single := func(id uuid.UUID, dst string) *nats.Msg {
		m := nats.NewMsg(api.SubjectSubmit)
		m.Data = dtrJSON(id, dst)
		return m
	}
	refused := func(t *testing.T, msgID string, id uuid.UUID) {
		t.Helper()
		r := next(t, rejections, 10*time.Second, "rejection", func(r api.Rejection) bool { return r.MsgID == msgID })
		if !strings.Contains(r.Reason, "taken by another DTR") || !strings.Contains(r.Reason, id.String()) {
			t.Fatalf("rejection reason %q; want the id and that it is taken", r.Reason)
		}
	}
	taken := func(t *testing.T, msgID string) {
		t.Helper()
		s.drained()
		none(t, rejections, 300*time.Millisecond, "rejection", func(r api.Rejection) bool { return r.MsgID == msgID })
	}

	queued := uuid.New()
	s.publish(single(queued, "a"))
	s.awaitDTR(queued, 10*time.Second, func(dtr.DTR) bool { return true })
	t.Run("while the first is held", func(t *testing.T) {
		msgID, _ := s.publish(single(queued, "b"))
		refused(t, msgID, queued)
		msgID, _ = s.publish(single(queued, "a"))
		taken(t, msgID)
	})
	t.Run("twice in one message", func(t *testing.T) {
		id := uuid.New()
		msgID, _ := s.publish(event(t, api.SubjectSubmit, api.TypeSubmits, api.Submits{DTRs: []api.SubmitEntry{
			{DTR: dtrJSON(id, "c")}, {DTR: dtrJSON(id, "c")}, {DTR: dtrJSON(id, "d")}}}))
		r := next(t, rejections, 10*time.Second, "rejection", func(r api.Rejection) bool { return r.MsgID == msgID })
		if !strings.Contains(r.Reason, "taken by another DTR") || !strings.Contains(r.Payload, "/data/d") {
			t.Fatalf("rejection %+v; want the third DTR refused as taken", r)
		}
		none(t, rejections, 300*time.Millisecond, "second rejection", func(r api.Rejection) bool { return r.MsgID == msgID })
		if d := s.awaitDTR(id, 10*time.Second, func(dtr.DTR) bool { return true }); d.Destination != "file:///data/c" {
			t.Fatalf("the DTR kept is to %s", d.Destination)
		}
	})
	t.Run("after a restart, from the bucket", func(t *testing.T) {
		var c api.Cancel
		c.DTR = queued
		s.publish(event(t, api.SubjectCancelCommand, api.TypeCancel, c))
		s.awaitDTR(queued, 10*time.Second, final)
		kv, err := s.js.KeyValue(context.Background(), bus.BucketDTRs)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for { // checkpointed: the journal no longer holds it
			var d dtr.DTR
			if e, err := kv.Get(context.Background(), queued.String()); err == nil && json.Unmarshal(e.Value(), &d) == nil && d.State == dtr.Cancelled {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the cancelled DTR was not checkpointed: %s", d.State)
			}
			time.Sleep(20 * time.Millisecond)
		}
		s.stopRole("scheduler")
		s.startRole("scheduler")
		msgID, _ := s.publish(single(queued, "e"))
		refused(t, msgID, queued)
		msgID, _ = s.publish(single(queued, "a"))
		taken(t, msgID)
		if d, _, _ := s.dtrRecord(queued); d.State != dtr.Cancelled || d.Destination != "file:///data/a" {
			t.Fatalf("the first DTR is now %s to %s", d.State, d.Destination)
		}
	})
}

// startWithMaxPayload is start on a NATS server whose max_payload is n
// bytes (NATS's default is 1MB; the embedded server's 8MB).
func startWithMaxPayload(t *testing.T, cfg app.Config, n int32, roles ...string) *system {
	t.Helper()
	dir := t.TempDir()
	ns, err := server.NewServer(&server.Options{ServerName: "small-payload", Host: "127.0.0.1", Port: -1,
		JetStream: true, StoreDir: filepath.Join(dir, "jetstream"), NoSigs: true, NoLog: true, MaxPayload: n})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	return startOn(t, ns, dir, cfg, roles...)
}

// bigDTR is a DTR of about n bytes (its owner's DN is long) from src.
func bigDTR(id uuid.UUID, src, dst string, n int) []byte {
	b := fmt.Appendf(nil, `{"id":%q,"source":%q,"destination":%q,"owner":{"dn":"/CN=`, id, fileURL(src), fileURL(dst))
	b = append(b, bytes.Repeat([]byte("x"), max(n-len(b)-3, 0))...)
	return append(b, `"}}`...)
}

func TestOversizedMessagesAreRefusedBeforeTheyReachTheScheduler(t *testing.T) {
	cfg := testConfig()
	cfg.Generator.MaxFiles = 3
	s := start(t, cfg)
	s.shares()
	rejections, terms := watchRejections(t, s.nc), watchTerminations(t, s.nc)
	src := filepath.Join(s.dir, "src")
	writeFile(t, src, 1000, 1)
	submitStream := func() uint64 {
		st, err := s.js.Stream(context.Background(), bus.StreamSubmit)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().State.LastSeq
	}
	msg := func(data []byte) *nats.Msg {
		m := nats.NewMsg(api.SubjectSubmit)
		m.Header.Set(nats.MsgIdHdr, uuid.NewString())
		m.Data = data
		return m
	}
	overStream := bigDTR(uuid.New(), src, filepath.Join(s.dir, "out", "over"), bus.MaxMessageBytes+1)

	t.Run("a dtr.submit message over SLUICE_SUBMIT's 1 MiB is refused by JetStream", func(t *testing.T) {
		before := durableState(t, s.js)
		last := submitStream()
		_, err := s.js.PublishMsg(context.Background(), msg(overStream))
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamMessageExceedsMaximum {
			t.Fatalf("publish: %v, want JetStream's error %d", err, jetstream.JSErrCodeStreamMessageExceedsMaximum)
		}
		mustContain(t, "error", err.Error(), "message size exceeds maximum allowed")
		// Published without waiting for JetStream's answer it is dropped
		// just the same, without a word.
		if err := s.nc.PublishMsg(msg(overStream)); err != nil {
			t.Fatal(err)
		}
		s.nc.Flush()
		none(t, rejections, 500*time.Millisecond, "rejection", func(api.Rejection) bool { return true })
		if got := submitStream(); got != last {
			t.Fatalf("SLUICE_SUBMIT's last sequence %d → %d", last, got)
		}
		if after := durableState(t, s.js); !reflect.DeepEqual(before, after) {
			t.Fatalf("before %+v\nafter  %+v", before, after)
		}
	})
	t.Run("a message over the server's max_payload never leaves the client", func(t *testing.T) {
		m := msg(make([]byte, s.nc.MaxPayload()+1))
		if err := s.nc.PublishMsg(m); !errors.Is(err, nats.ErrMaxPayload) {
			t.Fatalf("publish: %v, want %v", err, nats.ErrMaxPayload)
		}
		if _, err := s.js.PublishMsg(context.Background(), m); !errors.Is(err, nats.ErrMaxPayload) {
			t.Fatalf("publish to JetStream: %v, want %v", err, nats.ErrMaxPayload)
		}
	})
	t.Run("a malformed message under the limit is rejected, quoting its first 512 bytes", func(t *testing.T) {
		m := msg(bytes.Repeat([]byte("{"), bus.MaxMessageBytes-1000))
		msgID, seq := s.publish(m)
		r := next(t, rejections, 10*time.Second, "rejection", func(r api.Rejection) bool { return r.MsgID == msgID })
		if len(r.Payload) != 512 {
			t.Fatalf("the rejection quotes %d bytes", len(r.Payload))
		}
		next(t, terms, 10*time.Second, "termination", func(a termination) bool { return a.StreamSeq == seq && a.Stream == bus.StreamSubmit })
	})
	t.Run("a DTR of nearly 1 MiB is taken and runs", func(t *testing.T) {
		id := uuid.New()
		s.publish(msg(bigDTR(id, src, filepath.Join(s.dir, "out", "big"), bus.MaxMessageBytes-1000)))
		if d := s.awaitDTR(id, 30*time.Second, final); d.State != dtr.Done {
			t.Fatalf("the DTR ended %s: %+v", d.State, d.Error)
		}
	})
	jobs := []struct {
		name string
		job  *job.Job
		want string
	}{
		{"a job with more files than SLUICE_GENERATOR_MAX_FILES", &job.Job{Inputs: []job.File{
			{Source: fileURL(src), Destination: fileURL(filepath.Join(s.dir, "out", "1"))},
			{Source: fileURL(src), Destination: fileURL(filepath.Join(s.dir, "out", "2"))},
			{Source: fileURL(src), Destination: fileURL(filepath.Join(s.dir, "out", "3"))},
			{Source: fileURL(src), Destination: fileURL(filepath.Join(s.dir, "out", "4"))},
		}}, "job refused: job has 4 files; at most 3 are allowed"},
		{"a job whose DTR would be over 1 MiB", &job.Job{Inputs: []job.File{
			{Source: fileURL(src), Destination: fileURL(filepath.Join(s.dir, "out", strings.Repeat("d", bus.MaxMessageBytes)))},
		}}, "job refused: file 1 (download): its DTR is "},
	}
	for _, tt := range jobs {
		t.Run(tt.name, func(t *testing.T) {
			before := durableState(t, s.js)
			b, _ := json.Marshal(tt.job)
			var reply api.SubmitReply
			err := s.request(api.SubjectJobSubmit, b, nil, &reply)
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
			if after := durableState(t, s.js); !reflect.DeepEqual(before, after) {
				t.Fatalf("a refused job stored something:\nbefore %+v\nafter  %+v", before, after)
			}
		})
	}
}

// TestOnANATSServerWithASmallMaxPayloadATooLargeDTRIsRefused: with NATS's
// default max_payload of 1MB, a DTR of nearly 1 MiB fits SLUICE_SUBMIT but
// its grant would not fit a message. It is refused, with the reason, and the
// scheduler runs on.
func TestOnANATSServerWithASmallMaxPayloadATooLargeDTRIsRefused(t *testing.T) {
	s := startWithMaxPayload(t, testConfig(), 1<<20)
	s.shares()
	rejections, terms := watchRejections(t, s.nc), watchTerminations(t, s.nc)
	src := filepath.Join(s.dir, "src")
	writeFile(t, src, 1000, 1)
	limit := bus.MaxDTRBytes(s.nc.MaxPayload())
	if limit != 128<<10 {
		t.Fatalf("limit %d, want 128 KiB", limit)
	}
	for _, n := range []int{bus.MaxMessageBytes - 1000, limit + 1} {
		t.Run(fmt.Sprintf("a DTR of %d bytes", n), func(t *testing.T) {
			id := uuid.New()
			m := nats.NewMsg(api.SubjectSubmit)
			m.Data = bigDTR(id, src, filepath.Join(s.dir, "out", id.String()), n)
			msgID, seq := s.publish(m)
			r := next(t, rejections, 30*time.Second, "rejection", func(r api.Rejection) bool { return r.MsgID == msgID })
			mustContain(t, "reason", r.Reason, fmt.Sprintf("the DTR is %d bytes, more than the %d that a DTR may have", n, limit))
			next(t, terms, 30*time.Second, "termination", func(a termination) bool { return a.StreamSeq == seq && a.Stream == bus.StreamSubmit })
			if _, _, ok := s.dtrRecord(id); ok {
				t.Fatal("the DTR was stored")
			}
		})
	}
	t.Run("a DTR at the limit runs", func(t *testing.T) {
		id := uuid.New()
		m := nats.NewMsg(api.SubjectSubmit)
		m.Data = bigDTR(id, src, filepath.Join(s.dir, "out", id.String()), limit)
		s.publish(m)
		if d := s.awaitDTR(id, 30*time.Second, final); d.State != dtr.Done {
			t.Fatalf("the DTR ended %s: %+v", d.State, d.Error)
		}
	})
	t.Run("a job whose DTR would be over the limit is refused by the generator", func(t *testing.T) {
		before := durableState(t, s.js)
		j := &job.Job{Owner: dtr.Identity{DN: "/CN=" + strings.Repeat("x", limit)},
			Inputs: []job.File{{Source: fileURL(src), Destination: fileURL(filepath.Join(s.dir, "out", "job"))}}}
		b, _ := json.Marshal(j)
		var reply api.SubmitReply
		err := s.request(api.SubjectJobSubmit, b, nil, &reply)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("more than the %d that a DTR may have", limit)) {
			t.Fatalf("error %v", err)
		}
		if after := durableState(t, s.js); !reflect.DeepEqual(before, after) {
			t.Fatalf("a refused job stored something:\nbefore %+v\nafter  %+v", before, after)
		}
	})
}

func TestADotDotOutOfAFileRootIsRefusedLikeAnyPathOutside(t *testing.T) {
	cfg := testConfig()
	parent := t.TempDir()
	root, outside := filepath.Join(parent, "root"), filepath.Join(parent, "outside")
	cfg.FileRoots = []string{root}
	s := start(t, cfg)
	rejections := watchRejections(t, s.nc)
	writeFile(t, filepath.Join(root, "in"), 100, 1)
	writeFile(t, filepath.Join(outside, "secret"), 100, 2)
	tests := []struct{ name, source, destination string }{
		{"a source that climbs out", "file://" + root + "/../outside/secret", fileURL(filepath.Join(root, "out", "a"))},
		{"a destination that climbs out", fileURL(filepath.Join(root, "in")), "file://" + root + "/sub/../../outside/planted"},
		{"percent-encoded dots", "file://" + root + "/%2e%2e/outside/secret", fileURL(filepath.Join(root, "out", "b"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := s.submitDTR(fmt.Sprintf(`"source":%q,"destination":%q`, tt.source, tt.destination))
			r := next(t, rejections, 10*time.Second, "rejection", func(r api.Rejection) bool { return r.MsgID == id.String() })
			mustContain(t, "reason", r.Reason, "file:// URL not allowed", "is not under SLUICE_FILE_ROOTS")
			if _, _, known := s.dtrRecord(id); known {
				t.Fatalf("the refused DTR %s has a record", id)
			}
		})
	}
	if es, _ := os.ReadDir(outside); len(es) != 1 {
		t.Fatalf("written outside the root: %v", es)
	}
	if es, _ := os.ReadDir(filepath.Join(root, "out")); len(es) != 0 {
		t.Fatalf("copied in from outside: %v", es)
	}
}

func TestAnInvalidDTRIsRefusedWithEveryProblemListed(t *testing.T) {
	s := start(t, testConfig())
	rejections := watchRejections(t, s.nc)
	tests := []struct {
		name, fields string
		want         []string
	}{
		{"an unknown scheme and a relative file path", `"source":"gopher://old.example/a","destination":"file://relative/b"`,
			[]string{`source: URL "gopher://old.example/a": scheme "gopher" is not one of`, `destination: URL "file://relative/b": file URLs must be local`}},
		{"no destination", `"source":"file:///a"`, []string{"destination: URL is empty"}},
		{"source = destination", `"source":"file:///a","destination":"file:///a"`, []string{"source and destination are the same"}},
		{"a bad checksum and a priority out of range", `"source":"file:///a","destination":"file:///b","options":{"checksum":"md5"},"user_priority":101`,
			[]string{`checksum "md5" is not type:value`, "user_priority 101 is outside 1–100"}},
		{"a replica that is the destination, a bad direction", `"source":"file:///a","destination":"file:///b","replicas":["file:///b"],"direction":"sideways"`,
			[]string{"is the destination", `direction "sideways" is neither download nor upload`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := uuid.New()
			m := nats.NewMsg(api.SubjectSubmit)
			m.Data = fmt.Appendf(nil, `{"id":%q,%s}`, id, tt.fields)
			msgID, _ := s.publish(m)
			r := next(t, rejections, 10*time.Second, "rejection", func(r api.Rejection) bool { return r.MsgID == msgID })
			mustContain(t, "reason", r.Reason, tt.want...)
			if _, _, ok := s.dtrRecord(id); ok {
				t.Fatal("the DTR was stored")
			}
		})
	}
}

func TestASubmitsEventRunsItsGoodDTRsAndRefusesEachBadOneAlone(t *testing.T) {
	s := start(t, testConfig())
	s.shares()
	rejections, terms := watchRejections(t, s.nc), watchTerminations(t, s.nc)
	src := filepath.Join(s.dir, "src")
	writeFile(t, src, 1000, 3)
	want, _ := os.ReadFile(src)
	one, two := uuid.New(), uuid.New()
	entry := func(id uuid.UUID, name string) string {
		return fmt.Sprintf(`{"dtr":{"id":%q,"source":%q,"destination":%q}}`, id, fileURL(src), fileURL(filepath.Join(s.dir, name)))
	}
	data := `{"dtrs":[` + entry(one, "one") + `,{"dtr":{"id":"x","source":"file:///a","destination":"file:///b"}},` +
		`{"dtr":{"id":"` + uuid.NewString() + `","source":"gopher://x/y","destination":"file:///b"}},` + entry(two, "two") + `]}`
	msgID, seq := s.publish(event(t, api.SubjectSubmit, api.TypeSubmits, json.RawMessage(data)))
	for _, reason := range []string{"dtrs[1]: DTR JSON: invalid UUID length", `dtrs[2]: source: URL "gopher://x/y"`} {
		r := next(t, rejections, 10*time.Second, "rejection", func(r api.Rejection) bool {
			return r.MsgID == msgID && strings.HasPrefix(r.Reason, reason[:8])
		})
		mustContain(t, "reason", r.Reason, reason)
	}
	for _, id := range []uuid.UUID{one, two} {
		if d := s.awaitDTR(id, 30*time.Second, final); d.State != dtr.Done {
			t.Fatalf("DTR %s of the event ended %s: %+v", id, d.State, d.Error)
		}
	}
	for _, name := range []string{"one", "two"} {
		if got, err := os.ReadFile(filepath.Join(s.dir, name)); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// The event was taken (acknowledged), not refused as a whole.
	none(t, terms, 300*time.Millisecond, "termination", func(a termination) bool { return a.StreamSeq == seq && a.Stream == bus.StreamSubmit })
	s.drained()
}

// TestAJobWhoseEndEventWouldNotFitAMessageEndsWithoutItsFileLines: on a
// server whose max_payload is 128 KiB, a job of 350 files fits (its file
// list does, each line with its DTR's trace id), but its end event with a
// line per file would not. The job
// ends all the same: the event and the status answer leave out the lines
// of DONE files and say how many, and the counts are whole. (It used to be
// never announced, its last final DTRs redelivered for ever.)
func TestAJobWhoseEndEventWouldNotFitAMessageEndsWithoutItsFileLines(t *testing.T) {
	cfg := testConfig()
	cfg.Generator.MaxFiles = 1000
	s := startWithMaxPayload(t, cfg, 128<<10)
	s.shares()
	const files = 350
	ends := watch(t, s.nc, api.SubjectJobFinished, func(m *nats.Msg) (api.JobEvent, bool) {
		var ev api.JobEvent
		return ev, json.Unmarshal(m.Data, &ev) == nil
	})
	j := &job.Job{}
	for i := range files {
		src := filepath.Join(s.dir, "in", strconv.Itoa(i))
		writeFile(t, src, 100, i)
		j.Inputs = append(j.Inputs, job.File{Source: fileURL(src), Destination: fileURL(filepath.Join(s.dir, "out", strconv.Itoa(i)))})
	}
	reply := s.submit(j)
	ev := next(t, ends, 60*time.Second, "job end event", func(ev api.JobEvent) bool { return ev.Job.ID == reply.JobID })
	if ev.Done != files || ev.FilesOmitted != files || len(ev.Files) != 0 {
		t.Fatalf("end event: %d done, %d file lines, %d left out; want %d done, every line left out", ev.Done, len(ev.Files), ev.FilesOmitted, files)
	}
	st := s.wait(reply.JobID, 10*time.Second)
	if st.Done != files || st.FilesOmitted != files || st.State != api.JobFinished {
		t.Fatalf("status: %s, %d done, %d left out", st.State, st.Done, st.FilesOmitted)
	}
}
