package app

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/token"
	"github.com/sluice-dtr/sluice/pkg/token/tokentest"
	"github.com/sluice-dtr/sluice/pkg/transfer"
	"github.com/sluice-dtr/sluice/pkg/transfer/xrootdtest"
)

// wlcgStorage is an HTTPS storage on loopback that authorises as a WLCG
// storage does: a request needs a bearer token of the issuer whose aud is
// this storage and whose scope grants what the request does on its path
// (storage.read for reads, storage.create or storage.modify for a new
// file, storage.modify for other changes).
type wlcgStorage struct {
	srv      *httptest.Server
	audience string
	verifier *token.Verifier

	mu    sync.Mutex
	files map[string][]byte
	seen  []seenRequest // every authorised request
	delay map[string]time.Duration
	// refused are the requests whose token did not allow them.
	refused []string
}

// seenRequest is a request the storage authorised, with what its token
// said.
type seenRequest struct {
	method, path, subject string
	escaped               string // the path as sent
	scopes                []string
	raw                   string
}

func startWLCGStorage(t *testing.T, iss *tokentest.Issuer) *wlcgStorage {
	t.Helper()
	s := &wlcgStorage{files: map[string][]byte{}, delay: map[string]time.Duration{}}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.srv.StartTLS()
	t.Cleanup(s.srv.Close)
	s.audience = transfer.Audience(mustParse(t, s.srv.URL))
	v, err := token.NewVerifier(t.Context(), token.Config{Issuers: []string{iss.URL}, Audience: []string{s.audience},
		Leeway: time.Second, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s.verifier = v
	return s
}

// grants says which scope verbs allow a request of method.
var grants = map[string][]string{
	http.MethodGet: {"storage.read"}, http.MethodHead: {"storage.read"}, "PROPFIND": {"storage.read"},
	http.MethodPut: {"storage.create", "storage.modify"}, "MKCOL": {"storage.create", "storage.modify"},
}

func (s *wlcgStorage) serve(w http.ResponseWriter, r *http.Request) {
	raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		http.Error(w, "no bearer token", http.StatusUnauthorized)
		return
	}
	c, err := s.verifier.Verify(r.Context(), raw)
	if err != nil {
		http.Error(w, "token refused", http.StatusForbidden)
		return
	}
	verbs, ok := grants[r.Method]
	if !ok {
		verbs = []string{"storage.modify"}
	}
	p := path.Clean(r.URL.Path)
	allowed := false
	for _, sc := range c.Scopes {
		verb, dir, _ := strings.Cut(sc, ":")
		dir = path.Clean(dir)
		if slices.Contains(verbs, verb) && (p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")) {
			allowed = true
		}
	}
	if !allowed {
		s.mu.Lock()
		s.refused = append(s.refused, r.Method+" "+p+" by "+c.Subject+" with scopes "+strings.Join(c.Scopes, " "))
		s.mu.Unlock()
		http.Error(w, "the token does not allow "+r.Method+" on "+p, http.StatusForbidden)
		return
	}
	s.mu.Lock()
	s.seen = append(s.seen, seenRequest{method: r.Method, path: p, escaped: r.URL.EscapedPath(), subject: c.Subject, scopes: c.Scopes, raw: raw})
	d := s.delay[p]
	delete(s.delay, p)
	s.mu.Unlock()
	time.Sleep(d)
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		s.mu.Lock()
		b, ok := s.files[p]
		s.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		http.ServeContent(w, r, p, time.Time{}, strings.NewReader(string(b)))
	case http.MethodPut:
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.files[p] = b
		s.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	case http.MethodDelete:
		s.mu.Lock()
		delete(s.files, p)
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	default:
		http.Error(w, "not here", http.StatusMethodNotAllowed)
	}
}

func (s *wlcgStorage) put(p, content string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.files[p] = []byte(content)
}

func (s *wlcgStorage) file(p string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.files[p]
	return string(b), ok
}

// requests returns the requests authorised on paths under prefix.
func (s *wlcgStorage) requests(prefix string) []seenRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []seenRequest
	for _, r := range s.seen {
		if strings.HasPrefix(r.path, prefix) {
			out = append(out, r)
		}
	}
	return out
}

func (s *wlcgStorage) allTokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, r := range s.seen {
		out = append(out, r.raw)
	}
	return out
}

func mustParse(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// tokenRig is every role, with the submitters' tokens of iss and storage
// tokens from iss for client, and what they log and announce.
type tokenRig struct {
	logs, events syncBuffer
	r            *running
	nc           *nats.Conn
}

const rigAudience = "https://sluice.example.org"

func startTokenRig(t *testing.T, iss *tokentest.Issuer, client tokentest.Client, storageHTTP *http.Client) *tokenRig {
	t.Helper()
	return startTokenRigWith(t, iss, client, storageHTTP, true)
}

// startTokenRigWith is startTokenRig, with the scheduler and generator
// given no SLUICE_STORAGE_TOKEN_* unless schedulerKeeps (the workers have
// them either way).
func startTokenRigWith(t *testing.T, iss *tokentest.Issuer, client tokentest.Client, storageHTTP *http.Client, schedulerKeeps bool) *tokenRig {
	t.Helper()
	rig := &tokenRig{}
	oldLog := slog.Default()
	slog.SetDefault(slog.New(slog.NewJSONHandler(&rig.logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(oldLog) })

	ns, err := bus.Embedded(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	cfg := defaults(t)
	cfg.NATSURL = ns.ClientURL()
	cfg.AllowNetworks = []string{"127.0.0.0/8"}
	cfg.RetryBase = 100 * time.Millisecond
	cfg.Processor.StageDir = t.TempDir()
	cfg.Tokens.Issuers, cfg.Tokens.Audience = []string{iss.URL}, []string{rigAudience}
	cfg.StorageTokens.Issuer, cfg.StorageTokens.ClientID, cfg.StorageTokens.ClientSecretFile = iss.URL, client.ID, client.SecretFile
	cfg.StorageHTTP = storageHTTP
	if schedulerKeeps {
		rig.r = runRoles(t, cfg, Roles...)
	} else {
		front := cfg
		front.StorageTokens = token.StorageConfig{}
		runRoles(t, front, "scheduler", "generator").healthy(t, nil)
		rig.r = runRoles(t, cfg, "processor", "delivery")
	}
	rig.r.healthy(t, nil)

	if rig.nc, err = nats.Connect(ns.ClientURL()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rig.nc.Close)
	if _, err := rig.nc.Subscribe("sluice.event.>", func(m *nats.Msg) { rig.events.Write(append(m.Data, '\n')) }); err != nil {
		t.Fatal(err)
	}
	return rig
}

// submit publishes a DTR on dtr.submit with a bearer token ("": none, as
// the operator).
func (rig *tokenRig) submit(t *testing.T, bearer, src, dst string) uuid.UUID {
	t.Helper()
	js, _ := jetstream.New(rig.nc)
	id := uuid.New()
	b, _ := json.Marshal(map[string]string{"id": id.String(), "source": src, "destination": dst})
	m := nats.NewMsg(api.SubjectSubmit)
	m.Data = b
	if bearer != "" {
		m.Header.Set("Authorization", "Bearer "+bearer)
	}
	if _, err := js.PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	return id
}

// noTokenIn fails the test if a token of tokens, or its signature, is in
// the logs, the events or the records of the DTRs ids.
func (rig *tokenRig) noTokenIn(t *testing.T, tokens []string, ids ...uuid.UUID) {
	t.Helper()
	var records strings.Builder
	for _, id := range ids {
		b, _ := json.Marshal(waitFinal(t, rig.nc, id))
		records.Write(b)
	}
	for what, text := range map[string]string{
		"the logs": rig.logs.String() + rig.r.log.String(), "the events": rig.events.String(), "the DTR records": records.String(),
	} {
		if text == "" {
			t.Errorf("%s are empty: nothing was looked at", what)
		}
		for _, s := range tokens {
			sig := s[strings.LastIndex(s, ".")+1:]
			if strings.Contains(text, s) || strings.Contains(text, sig) {
				t.Errorf("%s hold a token", what)
			}
		}
	}
}

// TestStorageSeesTheSubmittersRightsThroughExchangedTokensScopedToEachPath
// runs every role against a real OIDC issuer and a WLCG-style HTTPS
// storage: a DTR submitted with alice's token reads and writes with
// tokens exchanged from hers, each scoped to exactly the path of its
// request; a path beyond her rights is refused by the issuer, with a clear
// error and no retry; her token expiring half way fails the DTR naming
// that; work without a token keeps Sluice's own client credentials; and
// no token shows in the logs, the events or the DTR records.
func TestStorageSeesTheSubmittersRightsThroughExchangedTokensScopedToEachPath(t *testing.T) {
	const sluiceAud = rigAudience
	iss := tokentest.Start(t)
	client := iss.Client(t)
	storage := startWLCGStorage(t, iss)
	storage.put("/data/alice/f1", "alice's first file")
	storage.put("/data/alice/slow", "a file behind a slow stat")
	storage.put("/data/bob/f2", "bob's file")
	aliceScopes := []string{"compute.create", "storage.read:/data/alice", "storage.read:/out/alice", "storage.create:/out/alice"}
	alice := iss.Mint(t, tokentest.Mint{Subject: "alice", Audience: []string{sluiceAud}, Scopes: aliceScopes})
	// One that runs out while its DTR's source is looked at.
	aliceShort := iss.Mint(t, tokentest.Mint{Subject: "alice", Audience: []string{sluiceAud}, Scopes: aliceScopes,
		Expiry: time.Now().Add(3 * time.Second)})

	rig := startTokenRig(t, iss, client, storage.srv.Client())
	nc, submit := rig.nc, rig.submit
	at := storage.srv.URL

	// Alice's own files: read and written with her rights, each request's
	// token scoped to exactly its path.
	ok := submit(t, alice, at+"/data/alice/f1", at+"/out/alice/f1")
	if d := waitFinal(t, nc, ok); d.State != dtr.Done {
		t.Fatalf("alice's DTR: %s (%+v), want DONE; the storage refused %q; token_ref %q", d.State, d.Error, storage.refused, d.TokenRef+" owner "+d.Owner.DN)
	}
	if got, _ := storage.file("/out/alice/f1"); got != "alice's first file" {
		t.Fatalf("the copy holds %q", got)
	}
	t.Logf("alice's DTR took %d token exchanges", iss.Exchanges())
	reqs := append(storage.requests("/data/alice/f1"), storage.requests("/out/alice")...)
	if len(reqs) < 2 {
		t.Fatalf("the storage saw %d requests of alice's DTR, want a read and a write at least", len(reqs))
	}
	for _, q := range reqs {
		want := string(transfer.AccessOf(q.method)) + ":" + q.escaped
		t.Logf("%s %s with a token of %s for %q", q.method, q.path, q.subject, q.scopes)
		if q.subject != "alice" || !slices.Equal(q.scopes, []string{want}) {
			t.Errorf("%s %s: a token of %q with scopes %q, want alice's with exactly [%s]", q.method, q.path, q.subject, q.scopes, want)
		}
	}

	// Bob's file is beyond her rights: the issuer refuses, the storage is
	// never asked, and the DTR fails at once, saying so.
	beyond := submit(t, alice, at+"/data/bob/f2", at+"/out/alice/f2")
	d := waitFinal(t, nc, beyond)
	if d.State != dtr.Error || d.Error == nil || !strings.Contains(d.Error.Text, "refused to exchange the submitter's token") ||
		!strings.Contains(d.Error.Text, "storage.read:/data/bob/f2 is beyond") {
		t.Fatalf("a DTR beyond alice's rights: %s (%+v), want ERROR saying the issuer refused storage.read:/data/bob/f2", d.State, d.Error)
	}
	if d.Attempts > 1 {
		t.Errorf("the refusal was tried %d times; it cannot change", d.Attempts)
	}
	if n := len(storage.requests("/data/bob/")); n != 0 {
		t.Errorf("the storage saw %d requests for bob's file", n)
	}

	// Her token runs out while the source is looked at (3 s): the write
	// cannot get a token any more.
	storage.mu.Lock()
	storage.delay["/data/alice/slow"] = 4 * time.Second
	storage.mu.Unlock()
	late := submit(t, aliceShort, at+"/data/alice/slow", at+"/out/alice/slow")
	d = waitFinal(t, nc, late)
	if d.State != dtr.Error || d.Error == nil || !strings.Contains(d.Error.Text, "the submitter's token has expired") {
		t.Fatalf("a DTR whose token expired: %s (%+v), want ERROR saying the submitter's token has expired", d.State, d.Error)
	}
	if d.Attempts > 1 {
		t.Errorf("the expired token was tried %d times", d.Attempts)
	}

	// The operator's work, with no token: Sluice's own client, as before.
	ops := submit(t, "", at+"/data/bob/f2", at+"/out/ops/f2")
	if d := waitFinal(t, nc, ops); d.State != dtr.Done {
		t.Fatalf("the operator's DTR: %s (%+v), want DONE", d.State, d.Error)
	}
	for _, q := range storage.requests("/out/ops/") {
		if q.subject != client.ID {
			t.Errorf("%s %s: a token of %q, want Sluice's client %q", q.method, q.path, q.subject, client.ID)
		}
	}

	// No token anywhere: not alice's, not the storage's.
	for _, id := range []uuid.UUID{ok, beyond, late} {
		if d := waitFinal(t, rig.nc, id); d.TokenRef == "" {
			t.Errorf("DTR %s submitted with a token has no token_ref", id)
		}
	}
	rig.noTokenIn(t, append([]string{alice, aliceShort}, storage.allTokens()...), ok, beyond, late, ops)
	if !strings.Contains(rig.r.log.String(), "grant failed") {
		t.Error("the roles' logs do not say a grant failed: were they captured?")
	}
}

// TestADTRSubmittedWithATokenMovesThroughTheRealXrootdWithItsSubmittersRights:
// the real xrootd, authorising by its SciTokens plugin, serves alice's DTR
// the tokens exchanged from hers (each for exactly its path), refuses none
// of them, and writes the copy; a DTR to a path she has no rights on is
// refused by the issuer before xrootd is asked; no token shows in the
// logs, events or records.
func TestADTRSubmittedWithATokenMovesThroughTheRealXrootdWithItsSubmittersRights(t *testing.T) {
	iss := tokentest.Start(t)
	s := xrootdtest.Start(t, xrootdtest.Options{HTTP: true, Tokens: &xrootdtest.Tokens{Issuer: iss.URL}})
	s.WriteFile(t, "/data/alice/f1", []byte("alice's file on xrootd"))
	s.WriteFile(t, "/data/bob/f2", []byte("bob's file on xrootd"))
	s.MkdirAll(t, "/out/alice")
	client := iss.Client(t)
	alice := iss.Mint(t, tokentest.Mint{Subject: "alice", Audience: []string{rigAudience}, NotBefore: time.Now().Add(-time.Minute),
		Scopes: []string{"compute.create", "storage.read:/data/alice", "storage.read:/out/alice", "storage.create:/out/alice"}})
	rig := startTokenRig(t, iss, client, s.Client())

	ok := rig.submit(t, alice, s.HTTPS+"/data/alice/f1", s.HTTPS+"/out/alice/f1")
	if d := waitFinal(t, rig.nc, ok); d.State != dtr.Done {
		t.Fatalf("alice's DTR through xrootd: %s (%+v), want DONE", d.State, d.Error)
	}
	if b, err := os.ReadFile(s.Path("/out/alice/f1")); err != nil || string(b) != "alice's file on xrootd" {
		t.Fatalf("the copy on xrootd: %q, %v", b, err)
	}
	if n := iss.Exchanges(); n < 2 {
		t.Errorf("%d token exchanges, want one for the source and one for the destination at least", n)
	}

	exchanges := iss.Exchanges()
	beyond := rig.submit(t, alice, s.HTTPS+"/data/bob/f2", s.HTTPS+"/out/alice/f2")
	d := waitFinal(t, rig.nc, beyond)
	if d.State != dtr.Error || d.Error == nil || !strings.Contains(d.Error.Text, "storage.read:/data/bob/f2 is beyond the subject token's rights") {
		t.Fatalf("a DTR beyond alice's rights: %s (%+v), want ERROR naming the scope refused", d.State, d.Error)
	}
	if iss.Exchanges() != exchanges {
		t.Error("a token beyond alice's rights was issued")
	}
	if _, err := os.Stat(s.Path("/out/alice/f2")); err == nil {
		t.Error("bob's file was copied")
	}
	rig.noTokenIn(t, []string{alice}, ok, beyond)
}

// TestTheRealXrootdDeletesWithAnExchangedTokenOfReadAndModify: the token of
// a delete, exchanged from the submitter's, names storage.read beside
// storage.modify, without which xrootd refuses it; a submitter who may
// only create there gets no such token.
func TestTheRealXrootdDeletesWithAnExchangedTokenOfReadAndModify(t *testing.T) {
	iss := tokentest.Start(t)
	s := xrootdtest.Start(t, xrootdtest.Options{HTTP: true, Tokens: &xrootdtest.Tokens{Issuer: iss.URL}})
	s.WriteFile(t, "/out/alice/old", []byte("to be deleted"))
	client := iss.Client(t)
	cfg := Config{StorageTokens: token.StorageConfig{Issuer: iss.URL, ClientID: client.ID, ClientSecretFile: client.SecretFile, Margin: time.Minute}}
	source, err := cfg.storageTokens()
	if err != nil {
		t.Fatal(err)
	}
	as := func(scopes ...string) context.Context {
		raw := iss.Mint(t, tokentest.Mint{Subject: "alice", NotBefore: time.Now().Add(-time.Minute), Scopes: scopes})
		return token.WithSubject(t.Context(), func(context.Context) (string, error) { return raw, nil })
	}
	u := mustParse(t, s.HTTPS+"/out/alice/old")

	if _, err := source(as("storage.read:/out/alice", "storage.create:/out/alice"), u, transfer.AccessModify); err == nil ||
		!strings.Contains(err.Error(), "storage.modify:/out/alice/old is beyond") {
		t.Fatalf("a delete by a submitter who may only create: %v, want the issuer's refusal", err)
	}
	tok, err := source(as("storage.read:/out/alice", "storage.modify:/out/alice"), u, transfer.AccessModify)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodDelete, u.String(), nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := s.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("DELETE with the exchanged token: %s", resp.Status)
	}
	if _, err := os.Stat(s.Path("/out/alice/old")); !os.IsNotExist(err) {
		t.Fatalf("the file is still there: %v", err)
	}
}

// submitFor publishes a DTR on dtr.submit as the generator does for a job
// submitted with a token: as a trusted caller (the operator here), naming
// the owner, with the submitter's token in api.HeaderSubjectToken.
func (rig *tokenRig) submitFor(t *testing.T, subjectToken, ownerDN, src, dst string) uuid.UUID {
	t.Helper()
	js, _ := jetstream.New(rig.nc)
	id := uuid.New()
	b, _ := json.Marshal(map[string]any{"id": id.String(), "source": src, "destination": dst, "owner": map[string]string{"dn": ownerDN}})
	m := nats.NewMsg(api.SubjectSubmit)
	m.Data = b
	m.Header.Set(api.HeaderSubjectToken, subjectToken)
	if _, err := js.PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestDTRsWhoseTokenCannotBeKeptFailSayingSoNeitherLostNorRunWithSluicesCredentials:
// the generator checked a job's token and answered "submitted", but the
// token expired before the scheduler took its DTRs (a backlog, a
// failover); or the token sent is not the DTR owner's. The DTRs are not
// refused unseen, nor run with Sluice's own client credentials: they fail
// at their first request to storage, saying the token was not kept, and
// the storage never sees a request.
func TestDTRsWhoseTokenCannotBeKeptFailSayingSoNeitherLostNorRunWithSluicesCredentials(t *testing.T) {
	iss := tokentest.Start(t)
	client := iss.Client(t)
	storage := startWLCGStorage(t, iss)
	storage.put("/data/alice/f1", "alice's file")
	scopes := []string{"compute.create", "storage.read:/data/alice", "storage.create:/out/alice"}
	aliceDN := "alice@" + iss.URL
	expired := iss.Mint(t, tokentest.Mint{Subject: "alice", Audience: []string{rigAudience}, Scopes: scopes,
		Expiry: time.Now().Add(-time.Minute)})
	alice := iss.Mint(t, tokentest.Mint{Subject: "alice", Audience: []string{rigAudience}, Scopes: scopes})

	rig := startTokenRig(t, iss, client, storage.srv.Client())
	at := storage.srv.URL
	var ids []uuid.UUID
	for _, tt := range []struct {
		name         string
		token, owner string
	}{
		{"a token that expired after the generator took the job", expired, aliceDN},
		{"a token that is not the DTR owner's", alice, "bob@" + iss.URL},
	} {
		t.Run(tt.name, func(t *testing.T) {
			id := rig.submitFor(t, tt.token, tt.owner, at+"/data/alice/f1", at+"/out/alice/f1")
			ids = append(ids, id)
			d := waitFinal(t, rig.nc, id)
			if d.State != dtr.Error || d.Error == nil || !strings.Contains(d.Error.Text, "was not kept for its transfers") {
				t.Fatalf("%s (%+v), want ERROR saying the token was not kept", d.State, d.Error)
			}
			if !d.SubmittedWithToken || d.TokenRef != "" {
				t.Errorf("submitted_with_token %v, token_ref %q: want true and none", d.SubmittedWithToken, d.TokenRef)
			}
			if d.Attempts > 1 {
				t.Errorf("tried %d times; it cannot change", d.Attempts)
			}
		})
	}
	if reqs := storage.requests("/"); len(reqs) != 0 {
		t.Errorf("the storage saw %d requests, the first with a token of %q: want none", len(reqs), reqs[0].subject)
	}
	rig.noTokenIn(t, []string{expired, alice}, ids...)
}

// TestWithNoStorageIssuerAtTheSchedulerATokenSubmittersDTRIsNotRunWithSluicesCredentials:
// the workers have SLUICE_STORAGE_TOKEN_* but the scheduler has not, so
// it keeps no token: alice's DTR fails saying so, where it once ran with
// Sluice's own client credentials, broader than hers.
func TestWithNoStorageIssuerAtTheSchedulerATokenSubmittersDTRIsNotRunWithSluicesCredentials(t *testing.T) {
	iss := tokentest.Start(t)
	storage := startWLCGStorage(t, iss)
	storage.put("/data/alice/f1", "alice's file")
	alice := iss.Mint(t, tokentest.Mint{Subject: "alice", Audience: []string{rigAudience},
		Scopes: []string{"compute.create", "storage.read:/data/alice", "storage.create:/out/alice"}})
	rig := startTokenRigWith(t, iss, iss.Client(t), storage.srv.Client(), false)
	id := rig.submit(t, alice, storage.srv.URL+"/data/alice/f1", storage.srv.URL+"/out/alice/f1")
	d := waitFinal(t, rig.nc, id)
	if d.State != dtr.Error || d.Error == nil || !strings.Contains(d.Error.Text, "was not kept for its transfers") {
		t.Fatalf("%s (%+v), want ERROR saying the token was not kept", d.State, d.Error)
	}
	if reqs := storage.requests("/"); len(reqs) != 0 {
		t.Errorf("the storage saw %d requests, the first with a token of %q: want none", len(reqs), reqs[0].subject)
	}
}

// TestATransferWhoseIssuerAnswers503IsRetriedAndDoneWhenItRecovers: an
// issuer that cannot give a storage token now (503) does not fail the
// DTR for good, as an expired token or a refusal does: the attempt fails
// as TEMPORARY_REMOTE and a later one, once the issuer is back, moves
// the file with the submitter's rights.
func TestATransferWhoseIssuerAnswers503IsRetriedAndDoneWhenItRecovers(t *testing.T) {
	iss := tokentest.Start(t)
	storage := startWLCGStorage(t, iss)
	storage.put("/data/alice/f1", "alice's first file")
	storage.put("/data/alice/f2", "alice's second file")
	alice := iss.Mint(t, tokentest.Mint{Subject: "alice", Audience: []string{rigAudience},
		Scopes: []string{"compute.create", "storage.read:/data/alice", "storage.read:/out/alice", "storage.create:/out/alice"}})
	rig := startTokenRig(t, iss, iss.Client(t), storage.srv.Client())
	at := storage.srv.URL
	// A first DTR, so that every role knows the issuer's keys.
	if d := waitFinal(t, rig.nc, rig.submit(t, alice, at+"/data/alice/f1", at+"/out/alice/f1")); d.State != dtr.Done {
		t.Fatalf("the first DTR: %s (%+v)", d.State, d.Error)
	}
	iss.SetDown(true)
	id := rig.submit(t, alice, at+"/data/alice/f2", at+"/out/alice/f2")
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(rig.r.log.String(), "no bearer token now") {
		if time.Now().After(deadline) {
			t.Fatalf("no attempt failed for want of a token while the issuer was down:\n%s", rig.r.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	iss.SetDown(false)
	d := waitFinal(t, rig.nc, id)
	if d.State != dtr.Done {
		t.Fatalf("%s (%+v), want DONE once the issuer is back", d.State, d.Error)
	}
	if d.Attempts < 2 {
		t.Errorf("%d attempts, want a retry after the 503", d.Attempts)
	}
	if got, _ := storage.file("/out/alice/f2"); got != "alice's second file" {
		t.Errorf("the copy holds %q", got)
	}

	// No DTR needs her token any more: it is no longer kept.
	js, _ := jetstream.New(rig.nc)
	kv, err := js.KeyValue(t.Context(), bus.BucketSubjectTokens)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := kv.Get(t.Context(), bus.SubjectTokenKey(d.TokenRef))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the token is still kept after its DTRs finished: %v", err)
		}
	}
}
