package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
	"github.com/sluice-dtr/sluice/pkg/token"
	"github.com/sluice-dtr/sluice/pkg/token/tokentest"
	"github.com/sluice-dtr/sluice/pkg/transfer/xrootdtest"
)

// TestWithTheirOwnPermissionsTheRolesHandTheSubmittersTokenToItsTransfers:
// every role as its own user of deploy/nats/sluice.conf; a user submits a
// DTR with alice's token on its own subject, and the real xrootd
// (SciTokens) serves it with tokens exchanged from hers: the scheduler may
// keep the token in sluice_subject_tokens, and the workers may read it,
// with nothing refused by the server. A job submitted with her token goes
// the same way, the generator handing the token on with its DTRs.
func TestWithTheirOwnPermissionsTheRolesHandTheSubmittersTokenToItsTransfers(t *testing.T) {
	const aud = "https://sluice.test"
	is := tokentest.Start(t)
	xs := xrootdtest.Start(t, xrootdtest.Options{HTTP: true, Tokens: &xrootdtest.Tokens{Issuer: is.URL}})
	xs.WriteFile(t, "/data/alice/f", []byte("alice's file"))
	xs.MkdirAll(t, "/out/alice")
	client := is.Client(t)
	ns, passwords, serverLog := permissionsServer(t)
	fts, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rolesAs(t, ns, passwords, func(cfg *app.Config) {
		cfg.FTS = fts
		cfg.Tokens = token.Config{Issuers: []string{is.URL}, Audience: []string{aud}, Leeway: time.Second}
		cfg.StorageTokens = token.StorageConfig{Issuer: is.URL, ClientID: client.ID, ClientSecretFile: client.SecretFile,
			Margin: time.Minute, FloorRate: 1e6}
		cfg.StorageHTTP = xs.Client()
	})
	alice := is.Mint(t, tokentest.Mint{Subject: "alice", Audience: []string{aud}, NotBefore: time.Now().Add(-time.Minute),
		Scopes: []string{"compute.create", "compute.read", "storage.read:/data/alice", "storage.read:/out/alice", "storage.create:/out/alice"}})

	user := connectAs(t, ns, "submitter", passwords["submitter"])
	id := uuid.New()
	m := nats.NewMsg(api.SubjectSubmit + ".submitter")
	m.Data, _ = json.Marshal(map[string]string{"id": id.String(), "source": xs.HTTPS + "/data/alice/f", "destination": xs.HTTPS + "/out/alice/f"})
	m.Header.Set("Authorization", "Bearer "+alice)
	m.Header.Set(nats.MsgIdHdr, id.String())
	if _, err := user.js.PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	ops := connectAs(t, ns, "client", passwords["client"])
	var d api.DTRReply
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		reply, err := ops.nc.Request(api.SubjectDTR, []byte(id.String()), 5*time.Second)
		if err == nil && json.Unmarshal(reply.Data, &d) == nil && d.DTR.State.Final() {
			break
		}
	}
	if d.DTR.State != dtr.Done {
		t.Fatalf("alice's DTR: %s (%+v), want DONE", d.DTR.State, d.DTR.Error)
	}
	if b, err := os.ReadFile(xs.Path("/out/alice/f")); err != nil || string(b) != "alice's file" {
		t.Fatalf("the copy on xrootd: %q, %v", b, err)
	}
	if d.DTR.Owner.DN != "alice@"+is.URL || d.DTR.TokenRef == "" {
		t.Fatalf("the DTR's owner %q and token_ref %q: want alice's, and a reference", d.DTR.Owner.DN, d.DTR.TokenRef)
	}
	if is.Exchanges() < 2 {
		t.Fatalf("%d token exchanges, want the source's and the destination's", is.Exchanges())
	}
	if v := serverLog.violations(); len(v) > 0 {
		t.Fatalf("the NATS server refused: %q", v)
	}
	// A job submitted with her token: the generator hands the token on
	// with the job's DTRs, and they too move with her rights.
	jobUser := as(t, ns, "submitter", passwords["submitter"])
	j := &job.Job{Inputs: []job.File{{Source: xs.HTTPS + "/data/alice/f", Destination: xs.HTTPS + "/out/alice/by-job"}}}
	var reply api.SubmitReply
	if err := jobUser.request(api.SubjectJobSubmit, jobJSON(t, j), nats.Header{"Authorization": {"Bearer " + alice}}, &reply); err != nil {
		t.Fatalf("a job with alice's token: %v", err)
	}
	exchanges := is.Exchanges()
	var jd api.DTRReply
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		r, err := ops.nc.Request(api.SubjectDTR, []byte(reply.DTRs[0].String()), 5*time.Second)
		if err == nil && json.Unmarshal(r.Data, &jd) == nil && jd.DTR.State.Final() {
			break
		}
	}
	if jd.DTR.State != dtr.Done || jd.DTR.TokenRef == "" {
		t.Fatalf("the job's DTR: %s (%+v), token_ref %q: want DONE with alice's token", jd.DTR.State, jd.DTR.Error, jd.DTR.TokenRef)
	}
	if is.Exchanges() == exchanges {
		t.Fatal("the job's transfers exchanged no token: they went with Sluice's own")
	}
	if b, err := os.ReadFile(xs.Path("/out/alice/by-job")); err != nil || string(b) != "alice's file" {
		t.Fatalf("the job's copy on xrootd: %q, %v", b, err)
	}
	if v := serverLog.violations(); len(v) > 0 {
		t.Fatalf("the NATS server refused: %q", v)
	}

	// A job submitted with her token over the FTS3 REST API goes the
	// same way.
	fc := &ftsClient{t: t, base: "http://" + fts.Addr().String(), token: alice}
	var sub struct {
		JobID string `json:"job_id"`
	}
	body := `{"files": [{"sources": ["` + xs.HTTPS + `/data/alice/f"], "destinations": ["` + xs.HTTPS + `/out/alice/by-fts"]}]}`
	if code := fc.do("POST", "/jobs", []byte(body), &sub); code != http.StatusOK {
		t.Fatalf("an FTS3 job with alice's token: %d", code)
	}
	exchanges = is.Exchanges()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		var fj struct {
			JobState string `json:"job_state"`
		}
		if code := fc.do("GET", "/jobs/"+sub.JobID, nil, &fj); code != http.StatusOK {
			t.Fatalf("poll of the FTS3 job: %d", code)
		}
		if fj.JobState == "FINISHED" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the FTS3 job is %s after a minute", fj.JobState)
		}
	}
	if is.Exchanges() == exchanges {
		t.Fatal("the FTS3 job's transfers exchanged no token: they went with Sluice's own")
	}
	if b, err := os.ReadFile(xs.Path("/out/alice/by-fts")); err != nil || string(b) != "alice's file" {
		t.Fatalf("the FTS3 job's copy on xrootd: %q, %v", b, err)
	}

	// A trusted caller (here the generator's user) that sends her token
	// with a DTR owned by someone else gets no token kept for it: the
	// token is only ever used for its holder's work, and the DTR fails
	// rather than run with Sluice's own credentials.
	gen := connectAs(t, ns, "generator", passwords["generator"])
	other := uuid.New()
	om := nats.NewMsg(api.SubjectSubmit)
	om.Data, _ = json.Marshal(map[string]any{"id": other.String(), "source": xs.HTTPS + "/data/alice/f", "destination": xs.HTTPS + "/out/alice/other",
		"owner": map[string]string{"dn": "/DC=org/CN=Mallory"}})
	om.Header.Set(api.HeaderSubjectToken, alice)
	om.Header.Set(nats.MsgIdHdr, other.String())
	if _, err := gen.js.PublishMsg(t.Context(), om); err != nil {
		t.Fatal(err)
	}
	var od api.DTRReply
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		r, err := ops.nc.Request(api.SubjectDTR, []byte(other.String()), 5*time.Second)
		if err == nil && json.Unmarshal(r.Data, &od) == nil && od.DTR.State.Final() {
			break
		}
	}
	if od.DTR.State != dtr.Error || od.DTR.TokenRef != "" || od.DTR.Owner.DN != "/DC=org/CN=Mallory" ||
		od.DTR.Error == nil || !strings.Contains(od.DTR.Error.Text, "was not kept for its transfers") {
		t.Fatalf("mallory's DTR sent with alice's token: %s (%+v), owner %q, token_ref %q: want it ERROR, mallory's, with no token kept",
			od.DTR.State, od.DTR.Error, od.DTR.Owner.DN, od.DTR.TokenRef)
	}

	// A processor gets an entry by its key only: it may not list the
	// keys (stream info with a subjects filter), and an entry it gets
	// with a wildcard for its key is sealed, holding neither the token
	// nor the reference.
	proc := connectAs(t, ns, "processor", passwords["processor"])
	if r, err := proc.nc.Request("$JS.API.STREAM.INFO.KV_sluice_subject_tokens", []byte(`{"subjects_filter":">"}`), 2*time.Second); err == nil {
		t.Fatalf("a processor listed the keys of the tokens: %q", r.Data)
	}
	r, err := proc.nc.Request("$JS.API.DIRECT.GET.KV_sluice_subject_tokens.$KV.sluice_subject_tokens.*", nil, 5*time.Second)
	if err != nil {
		t.Fatalf("a processor's direct get: %v", err)
	}
	for _, secret := range []string{alice, alice[strings.LastIndex(alice, ".")+1:], d.DTR.TokenRef} {
		if strings.Contains(string(r.Data), secret) || strings.Contains(fmt.Sprint(r.Header), secret) {
			t.Fatalf("an entry got by a wildcard shows a token or a token_ref (%q)", r.Header)
		}
	}
	// The scheduler may not make a consumer on the bucket to read it.
	sched := connectAs(t, ns, "scheduler", passwords["scheduler"])
	if _, err := sched.js.CreateOrUpdateConsumer(t.Context(), "KV_sluice_subject_tokens", jetstream.ConsumerConfig{Name: "peek"}); err == nil {
		t.Fatal("the scheduler made a consumer on the bucket of tokens")
	}

	// A user cannot read the bucket of tokens.
	if kv, err := user.js.KeyValue(t.Context(), "sluice_subject_tokens"); err == nil {
		if e, err := kv.Get(t.Context(), bus.SubjectTokenKey(d.DTR.TokenRef)); err == nil {
			t.Fatalf("a user read a kept token (%d bytes)", len(e.Value()))
		}
	}
}
