package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/httpstore"
	"github.com/sluice-dtr/sluice/pkg/scitag"
	"github.com/sluice-dtr/sluice/pkg/token"
	"github.com/sluice-dtr/sluice/pkg/token/tokentest"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// ftsClient speaks to the FTS3 REST API as an FTS3 client does: JSON over
// HTTP with a bearer token.
type ftsClient struct {
	t     *testing.T
	base  string
	token string
	// seen collects every answer body, to check what never appears in one.
	mu   sync.Mutex
	seen bytes.Buffer
}

// do sends a request and returns the status and the JSON body decoded
// into v (if not nil).
func (c *ftsClient) do(method, path string, body []byte, v any) int {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, bytes.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	c.mu.Lock()
	c.seen.Write(b)
	c.mu.Unlock()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		c.t.Fatalf("%s %s: Content-Type %q, want application/json; body %s", method, path, ct, b)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			c.t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, b, err)
		}
	}
	return resp.StatusCode
}

// as returns a client of the same API with another token.
func (c *ftsClient) as(token string) *ftsClient {
	return &ftsClient{t: c.t, base: c.base, token: token}
}

// ftsFixture reads a request body from testdata/fts, with its
// placeholders replaced.
func ftsFixture(t *testing.T, name string, r *strings.Replacer) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "fts", name))
	if err != nil {
		t.Fatal(err)
	}
	return []byte(r.Replace(string(b)))
}

// sciTags records the SciTag header of every request the storage gets,
// by method and path.
type sciTags struct {
	mu   sync.Mutex
	tags map[string]string
}

func (s *sciTags) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.tags[r.Method+" "+r.URL.Path] = r.Header.Get(transfer.HeaderSciTag)
		s.mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

func (s *sciTags) of(method, path string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tags[method+" "+path]
}

// startFTS runs every role with the FTS3 API on a loopback port, tokens of
// a real OIDC issuer, and SciTags for atlas; it returns the API's base URL
// and the issuer.
func startFTS(t *testing.T, configure ...func(*app.Config)) (string, *tokentest.Issuer, *system) {
	is := tokentest.Start(t)
	cfg := testConfig()
	for _, f := range configure {
		f(&cfg)
	}
	cfg.Tokens = token.Config{Issuers: []string{is.URL}, Audience: []string{"https://sluice.test"}, Leeway: time.Second}
	cfg.SciTags = scitag.Config{Experiments: "atlas=2", Activities: "Production Output=7"}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.FTS = ln
	s := start(t, cfg)
	return "http://" + ln.Addr().String(), is, s
}

// mint makes a token of the issuer for sub in groups with the compute
// scopes.
func mint(t *testing.T, is *tokentest.Issuer, sub string, groups []string, scopes ...string) string {
	if len(scopes) == 0 {
		scopes = []string{"compute.create", "compute.read", "compute.modify", "compute.cancel"}
	}
	return is.Mint(t, tokentest.Mint{Subject: sub, Audience: []string{"https://sluice.test"}, Groups: groups, Scopes: scopes})
}

// ruciosFiles are the fields Rucio asks for when it polls jobs in bulk.
const ruciosFiles = "file_state,dest_surl,finish_time,start_time,staging_start,staging_finished,reason,source_surl,file_metadata"

func TestRucioAndDIRACSubmitFollowAndCancelTransfersOverTheFTS3API(t *testing.T) {
	base, is, _ := startFTS(t)
	dir := t.TempDir()
	tags := &sciTags{tags: map[string]string{}}
	storage := httpServer(t, tags.wrap(httpstore.Handler(dir)))

	// The source files, and their adler32 as the clients send it.
	sources := map[string]string{
		"1": "site-a/datadisk/mc23/EVNT.000101._000001.pool.root.1",
		"2": "site-a/datadisk/mc23/EVNT.000101._000002.pool.root.1",
		"3": "site-a/datadisk/mc23/EVNT.000101._000003.pool.root.1",
		"4": "cern-disk/lhcb/LHCb/Collision24/DST/00012345_00000001_1.dst",
		"5": "site-a/scratch/user.alice/data.000001.root",
	}
	sizes := map[string]int{"1": 40960, "2": 20480, "3": 10240, "4": 30000, "5": 5000}
	repl := []string{"@STORAGE@", storage, "@STORAGE_TOKEN@", "eyJhbGciOiJSUzI1NiJ9.a-storage-token-never-to-be-kept.c2ln"}
	for k, p := range sources {
		writeFile(t, filepath.Join(dir, p), sizes[k], len(p))
		sum, err := checksum.File(filepath.Join(dir, p), "adler32")
		if err != nil {
			t.Fatal(err)
		}
		repl = append(repl, "@ADLER32_"+k+"@", strings.TrimPrefix(sum, "adler32:"))
	}
	r := strings.NewReplacer(repl...)

	rucio := &ftsClient{t: t, base: base, token: mint(t, is, "rucio", []string{"/atlas", "/atlas/production"})}
	// DIRAC's FTS3 client joins its endpoint and paths with a slash of its
	// own (//jobs), and reads the API's version when it starts.
	dirac := &ftsClient{t: t, base: base + "/", token: mint(t, is, "dirac", []string{"/lhcb"})}
	var version struct {
		API struct{ Major, Minor, Patch int } `json:"api"`
	}
	if code := dirac.do("GET", "/", nil, &version); code != http.StatusOK || version.API.Major != 3 {
		t.Fatalf("GET //: %d %+v", code, version)
	}

	// Refused: no token, a token that does not verify, a token for
	// another audience, a token without the scope.
	var e struct{ Status, Message string }
	if code := rucio.as("").do("POST", "/jobs", ftsFixture(t, "rucio-bulk.json", r), &e); code != http.StatusUnauthorized || !strings.Contains(e.Message, "Bearer") {
		t.Fatalf("a submission without a token: %d %+v, want 401 asking for a bearer token", code, e)
	}
	for name, tok := range map[string]string{
		"not a JWT":         "not-a-token",
		"another audience":  is.Mint(t, tokentest.Mint{Subject: "rucio", Audience: []string{"https://other.example"}, Scopes: []string{"compute.create"}}),
		"no compute.create": mint(t, is, "rucio", []string{"/atlas"}, "compute.read"),
	} {
		if code := rucio.as(tok).do("POST", "/jobs", ftsFixture(t, "rucio-bulk.json", r), &e); code != http.StatusForbidden || e.Status != "403 Forbidden" {
			t.Fatalf("a submission with a token (%s): %d %+v, want 403", name, code, e)
		}
	}

	// Submitted as Rucio and DIRAC submit: 200 and the job id.
	var bulk, multi, lhcb, plain struct {
		JobID    string   `json:"job_id"`
		Warnings []string `json:"warnings"`
	}
	// plain is what FTS3's Python client (fts3.rest.client.easy) sends
	// when its caller chooses nothing: every parameter, most null.
	for _, s := range []struct {
		c       *ftsClient
		fixture string
		reply   any
	}{{rucio, "rucio-bulk.json", &bulk}, {rucio, "rucio-multisource.json", &multi}, {dirac, "dirac-transfer.json", &lhcb}, {rucio, "fts3-client-default.json", &plain}} {
		if code := s.c.do("POST", "/jobs", ftsFixture(t, s.fixture, r), s.reply); code != http.StatusOK {
			t.Fatalf("submit %s: %d", s.fixture, code)
		}
	}
	if bulk.JobID == "" || multi.JobID == "" || lhcb.JobID == "" || plain.JobID == "" {
		t.Fatalf("job ids %q, %q, %q, %q", bulk.JobID, multi.JobID, lhcb.JobID, plain.JobID)
	}
	if len(plain.Warnings) > 0 {
		t.Errorf("the FTS3 client's default parameters were warned about: %q", plain.Warnings)
	}
	warned := strings.Join(bulk.Warnings, "\n")
	for _, want := range []string{"params.copy_pin_lifetime: ignored", "files[0].source_tokens: ignored", "params.account: ignored"} {
		if !strings.Contains(warned, want) {
			t.Errorf("the warnings of the Rucio job do not say %q: %s", want, warned)
		}
	}

	// Rucio polls its jobs in bulk until they are final.
	type file struct {
		FileState    string          `json:"file_state"`
		SourceSURL   string          `json:"source_surl"`
		DestSURL     string          `json:"dest_surl"`
		Reason       *string         `json:"reason"`
		StartTime    *string         `json:"start_time"`
		FinishTime   *string         `json:"finish_time"`
		StagingStart *string         `json:"staging_start"`
		FileMetadata json.RawMessage `json:"file_metadata"`
	}
	type jobView struct {
		JobID       string          `json:"job_id"`
		JobState    string          `json:"job_state"`
		JobType     string          `json:"job_type"`
		HTTPStatus  string          `json:"http_status"`
		Reason      *string         `json:"reason"`
		JobMetadata json.RawMessage `json:"job_metadata"`
		SubmitTime  string          `json:"submit_time"`
		JobFinished *string         `json:"job_finished"`
		Files       []file          `json:"files"`
	}
	final := map[string]bool{"FINISHED": true, "FINISHEDDIRTY": true, "FAILED": true, "CANCELED": true}
	var jobs []jobView
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		jobs = nil
		if code := rucio.do("GET", "/jobs/"+bulk.JobID+","+multi.JobID+"?files="+ruciosFiles, nil, &jobs); code != http.StatusMultiStatus {
			t.Fatalf("bulk query: %d, want 207", code)
		}
		if len(jobs) == 2 && final[jobs[0].JobState] && final[jobs[1].JobState] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Rucio's jobs not final after a minute: %+v", jobs)
		}
	}
	for _, j := range jobs {
		if j.HTTPStatus != "200 Ok" || j.JobState != "FINISHED" || j.Reason != nil {
			t.Fatalf("job %s: %s %s (%v), want 200 and FINISHED", j.JobID, j.HTTPStatus, j.JobState, j.Reason)
		}
		if _, err := time.Parse("2006-01-02T15:04:05", j.SubmitTime); err != nil {
			t.Errorf("submit_time %q is not in FTS3's format: %v", j.SubmitTime, err)
		}
		if j.JobFinished == nil {
			t.Errorf("job %s is FINISHED with no job_finished", j.JobID)
		}
		var meta struct {
			Issuer       string `json:"issuer"`
			MultiSources bool   `json:"multi_sources"`
		}
		if err := json.Unmarshal(j.JobMetadata, &meta); err != nil || meta.Issuer != "rucio" {
			t.Errorf("job_metadata %s does not come back as given", j.JobMetadata)
		}
	}
	if jobs[0].JobType != "N" || jobs[1].JobType != "R" || len(jobs[0].Files) != 2 || len(jobs[1].Files) != 2 {
		t.Fatalf("the bulk job is %s with %d rows, the multi-source one %s with %d rows", jobs[0].JobType, len(jobs[0].Files), jobs[1].JobType, len(jobs[1].Files))
	}
	for i, f := range jobs[0].Files {
		var meta struct {
			RequestID string `json:"request_id"`
		}
		_ = json.Unmarshal(f.FileMetadata, &meta)
		if f.FileState != "FINISHED" || meta.RequestID != "0d6f2f0e4b6c4b1f9c3e7a5d2b8e4f0"+strconv.Itoa(i+1) || f.StartTime == nil || f.FinishTime == nil {
			t.Fatalf("file %d of the bulk job: %+v (metadata %s)", i, f, f.FileMetadata)
		}
		if _, err := time.Parse("2006-01-02T15:04:05", *f.FinishTime); err != nil || f.StagingStart != nil {
			t.Errorf("file %d: finish_time %q, staging_start %v", i, *f.FinishTime, f.StagingStart)
		}
	}
	// The multi-source file: the missing first source is NOT_USED, the
	// second moved it.
	if m := jobs[1].Files; m[0].FileState != "NOT_USED" || m[1].FileState != "FINISHED" || !strings.Contains(m[1].SourceSURL, "site-a") {
		t.Fatalf("the multi-source file's rows: %+v", m)
	}

	// DIRAC asks for the job, then for its files, until it is final.
	var dj jobView
	var dfiles []file
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if code := dirac.do("GET", "/jobs/"+lhcb.JobID, nil, &dj); code != http.StatusOK {
			t.Fatalf("DIRAC's job: %d", code)
		}
		if code := dirac.do("GET", "/jobs/"+lhcb.JobID+"/files", nil, &dfiles); code != http.StatusOK {
			t.Fatalf("DIRAC's job's files: %d", code)
		}
		if final[dj.JobState] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("DIRAC's job not final after a minute: %+v", dj)
		}
	}
	var fileID struct {
		FileID int `json:"fileID"`
	}
	if len(dfiles) != 1 || json.Unmarshal(dfiles[0].FileMetadata, &fileID) != nil || fileID.FileID != 4711 || dj.JobState != "FINISHED" || dfiles[0].FileState != "FINISHED" {
		t.Fatalf("DIRAC's job %s, files %+v", dj.JobState, dfiles)
	}

	// The FTS3 client's job ran at FTS3's default priority, 3.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		var j struct {
			JobState string `json:"job_state"`
			Priority int    `json:"priority"`
		}
		if code := rucio.do("GET", "/jobs/"+plain.JobID, nil, &j); code != http.StatusOK || j.Priority != 3 {
			t.Fatalf("the FTS3 client's job: %d %+v, want priority 3", code, j)
		}
		if j.JobState == "FINISHED" {
			break
		}
		if final[j.JobState] || time.Now().After(deadline) {
			t.Fatalf("the FTS3 client's job is %s", j.JobState)
		}
	}

	// The files really moved, byte for byte, each to its destination.
	for k, p := range sources {
		dst := strings.Replace(strings.Replace(p, "site-a", "site-b", 1), "cern-disk", "ral-disk", 1)
		want, _ := os.ReadFile(filepath.Join(dir, p))
		got, err := os.ReadFile(filepath.Join(dir, dst))
		if err != nil || !bytes.Equal(got, want) || len(got) != sizes[k] {
			t.Fatalf("%s: %d bytes (%v), want the %d of %s", dst, len(got), err, sizes[k], p)
		}
	}
	// Packet marking: atlas (2) Production Output (7) is 135, on the GET
	// and the PUT; lhcb has no experiment id here, so no tag.
	if g, p := tags.of("GET", "/"+sources["1"]), tags.of("PUT", "/site-b/datadisk/mc23/EVNT.000101._000001.pool.root.1"); g != "135" || p != "135" {
		t.Errorf("SciTag of atlas's Production Output: GET %q, PUT %q, want 135", g, p)
	}
	if g := tags.of("GET", "/"+sources["4"]); g != "" {
		t.Errorf("lhcb's transfer carried SciTag %q", g)
	}

	// Another token holder sees none of Rucio's jobs, and cannot cancel them.
	for _, req := range []struct{ method, path string }{
		{"GET", "/jobs/" + bulk.JobID}, {"GET", "/jobs/" + bulk.JobID + "/files"}, {"DELETE", "/jobs/" + bulk.JobID},
	} {
		if code := dirac.do(req.method, req.path, nil, &e); code != http.StatusNotFound || !strings.Contains(e.Message, "not yours") {
			t.Fatalf("DIRAC's %s %s of Rucio's job: %d %+v, want 404", req.method, req.path, code, e)
		}
	}

	// A job whose source stalls is cancelled: CANCELED at once, and its
	// file CANCELED once the scheduler has stopped it.
	stall := pausingSource(t, time.Minute)
	body := `{"files": [{"sources": ["` + stall + `/slow.root"], "destinations": ["` + storage + `/site-b/slow.root"]}], "params": {"priority": 5}}`
	var slow struct {
		JobID string `json:"job_id"`
	}
	if code := rucio.do("POST", "/jobs", []byte(body), &slow); code != http.StatusOK {
		t.Fatalf("submit the stalling job: %d", code)
	}
	// Rucio changes its priority, as its throttler does; DIRAC may not.
	var reprioritised struct {
		Priority int `json:"priority"`
	}
	if code := rucio.do("POST", "/jobs/"+slow.JobID, []byte(`{"params": {"priority": 1}}`), &reprioritised); code != http.StatusOK || reprioritised.Priority != 1 {
		t.Fatalf("priority 5 to 1: %d %+v", code, reprioritised)
	}
	if code := dirac.do("POST", "/jobs/"+slow.JobID, []byte(`{"params": {"priority": 1}}`), &e); code != http.StatusNotFound {
		t.Fatalf("DIRAC changes the priority of Rucio's job: %d %+v", code, e)
	}
	var cancelled jobView
	if code := rucio.do("DELETE", "/jobs/"+slow.JobID, nil, &cancelled); code != http.StatusOK || cancelled.JobState != "CANCELED" {
		t.Fatalf("cancel: %d %s, want 200 CANCELED", code, cancelled.JobState)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		var files []file
		rucio.do("GET", "/jobs/"+slow.JobID+"/files", nil, &files)
		var j jobView
		rucio.do("GET", "/jobs/"+slow.JobID, nil, &j)
		if j.JobState == "CANCELED" && len(files) == 1 && files[0].FileState == "CANCELED" && j.Reason != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cancelled job is %s with files %+v", j.JobState, files)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "site-b", "slow.root")); !os.IsNotExist(err) {
		t.Errorf("the cancelled file reached its destination: %v", err)
	}

	// whoami names the caller as its token does.
	var who struct {
		UserDN string   `json:"user_dn"`
		VOs    []string `json:"vos"`
		BaseID string   `json:"base_id"`
	}
	if code := rucio.do("GET", "/whoami", nil, &who); code != http.StatusOK || who.UserDN != "rucio@"+is.URL || len(who.VOs) != 1 || who.VOs[0] != "atlas" || who.BaseID == "" {
		t.Fatalf("whoami: %d %+v", code, who)
	}

	// The storage tokens Rucio sent are in no answer.
	if strings.Contains(rucio.seen.String(), "a-storage-token-never-to-be-kept") {
		t.Fatal("a storage token sent with a submission came back in an answer")
	}
}

func TestABadFTS3SubmissionIsRefusedNamingTheFieldAndLeavesNothing(t *testing.T) {
	base, is, s := startFTS(t)
	c := &ftsClient{t: t, base: base, token: mint(t, is, "rucio", []string{"/atlas"})}
	good := `{"sources": ["https://storage.example.org/a"], "destinations": ["https://storage.example.org/b"]}`
	for _, tt := range []struct{ name, body, want string }{
		{"two destinations", `{"files": [` + good + `, {"sources": ["https://s.example.org/x"], "destinations": ["https://d.example.org/1", "https://d.example.org/2"]}]}`,
			"files[1].destinations: 2 destinations"},
		{"a priority past 5", `{"files": [` + good + `], "params": {"priority": 9}}`, "params.priority: 9 is outside FTS3's 1–5"},
		{"a checksum that is not hex", `{"files": [{"sources": ["https://s.example.org/x"], "destinations": ["https://d.example.org/y"], "checksum": "ADLER32:zz"}]}`,
			"files[0].checksum"},
		{"verify_checksum unknown", `{"files": [` + good + `], "params": {"verify_checksum": "sometimes"}}`, "params.verify_checksum"},
		{"no sources", `{"files": [{"destinations": ["https://d.example.org/y"]}]}`, "files[0].sources: missing"},
		{"a scitag out of range", `{"files": [` + good + `], "params": {"scitag": 12}}`, "params.scitag: 12 is outside 65–65535"},
		{"multihop", `{"files": [` + good + `], "params": {"multihop": true}}`, "params.multihop"},
		{"a source Sluice cannot reach", `{"files": [` + good + `, {"sources": ["gsiftp://s.example.org/x"], "destinations": ["https://d.example.org/y"]}]}`,
			"files[1].source"},
		{"not JSON", `{"files": [`, "not a JSON object"},
	} {
		var e struct{ Status, Message string }
		if code := c.do("POST", "/jobs", []byte(tt.body), &e); code != http.StatusBadRequest || !strings.Contains(e.Message, tt.want) {
			t.Errorf("%s: %d %q, want 400 saying %q", tt.name, code, e.Message, tt.want)
		}
	}
	// Nothing of the refused jobs was kept: no job at all, not even one
	// of their good files.
	var list api.JobListReply
	if err := s.request(api.SubjectJobList, []byte(`{}`), nil, &list); err != nil || len(list.Jobs) != 0 {
		t.Fatalf("jobs after the refusals: %+v (%v), want none", list.Jobs, err)
	}
	var one map[string]any
	if code := c.do("GET", "/jobs/none-such", nil, &one); code != http.StatusNotFound || one["http_status"] != "404 Not Found" {
		t.Fatalf("an unknown job: %d %v", code, one)
	}
	// A token signed by a key the issuer rotated to while it cannot be
	// reached may be good: 503, not 403.
	is.Rotate(t)
	rotated := mint(t, is, "rucio", []string{"/atlas"})
	is.SetDown(true)
	var e struct{ Status, Message string }
	if code := c.as(rotated).do("GET", "/whoami", nil, &e); code != http.StatusServiceUnavailable {
		t.Fatalf("a token of an issuer that cannot be reached: %d %+v, want 503", code, e)
	}
}

// TestWithPermissionsAnFTS3JobIsSeenActiveThenFinished: the generator,
// logged in with only its own NATS permissions, reads the scheduler's DTR
// records for the live state of a job's file (ACTIVE while its source
// holds the transfer), then the end.
func TestWithPermissionsAnFTS3JobIsSeenActiveThenFinished(t *testing.T) {
	ns, passwords, serverLog := permissionsServer(t)
	is := tokentest.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rolesAs(t, ns, passwords, func(c *app.Config) {
		c.Tokens = token.Config{Issuers: []string{is.URL}, Audience: []string{"https://sluice.test"}, Leeway: time.Second}
		c.FTS = ln
	})
	storage := httpServer(t, httpstore.Handler(t.TempDir()))
	slow := pausingSource(t, 3*time.Second)
	c := &ftsClient{t: t, base: "http://" + ln.Addr().String(), token: mint(t, is, "rucio", []string{"/atlas"})}
	var sub struct {
		JobID string `json:"job_id"`
	}
	body := `{"files": [{"sources": ["` + slow + `/f"], "destinations": ["` + storage + `/f"]}]}`
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if code := c.do("POST", "/jobs", []byte(body), &sub); code == http.StatusOK {
			break
		} else if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("submit: %d", code)
		}
	}
	// A priority change goes to the scheduler with the caller's token.
	// (503 until the scheduler, which has just started, serves.)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var e struct{ Message string }
		code := c.do("POST", "/jobs/"+sub.JobID, []byte(`{"params": {"priority": 5}}`), &e)
		if code == http.StatusOK {
			break
		}
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("priority: %d %s", code, e.Message)
		}
	}
	seen := map[string]bool{}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		var j struct {
			JobState string `json:"job_state"`
			Files    []struct {
				FileState string `json:"file_state"`
			} `json:"files"`
		}
		if code := c.do("GET", "/jobs/"+sub.JobID+"?files=file_state", nil, &j); code != http.StatusOK || len(j.Files) != 1 {
			t.Fatalf("poll: %d %+v", code, j)
		}
		seen[j.JobState+"/"+j.Files[0].FileState] = true
		if j.JobState == "FINISHED" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job is %s after a minute; seen %v", j.JobState, seen)
		}
	}
	if !seen["ACTIVE/ACTIVE"] {
		t.Errorf("the file was never seen ACTIVE while its source held it: %v", seen)
	}
	if v := serverLog.violations(); len(v) > 0 {
		t.Fatalf("the server refused what the roles needed:\n%s", strings.Join(v, "\n"))
	}
}

func TestAnOversizedFTS3SubmissionIsRefusedShortAndBusyRequestsAreAskedToRetry(t *testing.T) {
	base, is, s := startFTS(t, func(c *app.Config) { c.Generator.MaxFiles, c.Generator.FTSMaxRequests = 100, 2 })
	tok := mint(t, is, "rucio", []string{"/atlas"})
	c := &ftsClient{t: t, base: base, token: tok}
	files := func(n int, file string) []byte {
		return []byte(`{"files": [` + strings.Repeat(file+",", n-1) + file + `]}`)
	}
	bad := `{"destinations": ["https://d.example.org/y"]}`
	for _, tt := range []struct {
		name string
		body []byte
		code int
		want string
	}{
		// Counted while decoded: refused at the 101st, not read whole.
		{"many tiny files, within the body's bound", files(20000, `{}`), http.StatusRequestEntityTooLarge, "files: too many files: more than 100"},
		{"430,000 tiny files", files(430000, `{}`), http.StatusRequestEntityTooLarge, "files: too many files: more than 100"},
		{"a body past 5 KiB a file", files(1, `{"metadata": "`+strings.Repeat("x", 600<<10)+`"}`), http.StatusRequestEntityTooLarge, "the body is larger than 577536 bytes"},
		{"a hundred bad files", files(100, bad), http.StatusBadRequest, "and 80 more problems"},
	} {
		var e struct{ Status, Message string }
		code := c.do("POST", "/jobs", tt.body, &e)
		if code != tt.code || !strings.Contains(e.Message, tt.want) {
			t.Errorf("%s: %d %q, want %d saying %q", tt.name, code, e.Message, tt.code, tt.want)
		}
		if len(e.Message) > 2000 {
			t.Errorf("%s: an answer of %d bytes", tt.name, len(e.Message))
		}
	}
	var list api.JobListReply
	if err := s.request(api.SubjectJobList, []byte(`{}`), nil, &list); err != nil || len(list.Jobs) != 0 {
		t.Fatalf("jobs after the refusals: %+v (%v), want none", list.Jobs, err)
	}

	// Two submissions whose bodies are slow to come take the two slots:
	// a third request is answered 503 with Retry-After, until they end.
	var held []*io.PipeWriter
	done := make(chan int, 2)
	for range 2 {
		pr, pw := io.Pipe()
		held = append(held, pw)
		req, _ := http.NewRequest("POST", base+"/jobs", pr)
		req.Header.Set("Authorization", "Bearer "+tok)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				done <- 0
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
		if _, err := pw.Write([]byte(`{"files": [`)); err != nil {
			t.Fatal(err)
		}
	}
	whoami := func() (int, string) {
		req, _ := http.NewRequest("GET", base+"/whoami", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, after := whoami()
		if code == http.StatusServiceUnavailable && after != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with both slots taken: %d (Retry-After %q), want 503 with Retry-After", code, after)
		}
	}
	for _, pw := range held {
		_ = pw.CloseWithError(io.ErrUnexpectedEOF)
	}
	for range 2 {
		<-done
	}
	if code, _ := whoami(); code != http.StatusOK {
		t.Fatalf("once the slow submissions ended: %d, want 200", code)
	}
}

func TestAnFTS3JobThatCannotBeStoredIsAnswered503AndLeavesNothingAndAnOwnerPastItsLimit429(t *testing.T) {
	base, is, s := startFTS(t, func(c *app.Config) { c.Generator.OwnerMaxJobs = 1 })
	c := &ftsClient{t: t, base: base, token: mint(t, is, "rucio", []string{"/atlas"})}
	body := []byte(`{"files": [{"sources": ["https://s.example.org/a"], "destinations": ["https://d.example.org/a"]}]}`)
	ctx := t.Context()

	// The stream of DTR submissions refuses every message (each is larger
	// than it now takes): the job's records are stored, its DTRs are not.
	st := submitStream(t, s)
	cfg := st.CachedInfo().Config
	small := cfg
	small.MaxMsgSize = 64
	if _, err := s.js.UpdateStream(ctx, small); err != nil {
		t.Fatal(err)
	}
	var e struct{ Status, Message string }
	if code := c.do("POST", "/jobs", body, &e); code != http.StatusServiceUnavailable || !strings.Contains(e.Message, "nothing of it was kept") {
		t.Fatalf("a job whose DTRs cannot be sent: %d %q, want 503 saying nothing was kept", code, e.Message)
	}
	var list api.JobListReply
	if err := s.request(api.SubjectJobList, []byte(`{}`), nil, &list); err != nil || len(list.Jobs) != 0 {
		t.Fatalf("jobs after the failure: %+v (%v), want none", list.Jobs, err)
	}
	if _, err := s.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}

	// The failed job took nothing of the owner's one job: the next is
	// taken, and one more is refused 429 naming the limit.
	var sub struct {
		JobID string `json:"job_id"`
	}
	if code := c.do("POST", "/jobs", body, &sub); code != http.StatusOK || sub.JobID == "" {
		t.Fatalf("a job once the stream takes it: %d %+v", code, sub)
	}
	if code := c.do("POST", "/jobs", body, &e); code != http.StatusTooManyRequests || !strings.Contains(e.Message, "SLUICE_GENERATOR_OWNER_MAX_JOBS") {
		t.Fatalf("a job past the owner's limit: %d %q, want 429 naming the limit", code, e.Message)
	}
}

func TestFTS3SubmissionsAtTheSameTimeCannotAllPassTheirOwnersLimit(t *testing.T) {
	base, is, s := startFTS(t, func(c *app.Config) { c.Generator.OwnerMaxJobs, c.Generator.FTSMaxRequests = 10, 64 })
	c := &ftsClient{t: t, base: base, token: mint(t, is, "rucio", []string{"/atlas"})}
	// Every job waits on a source that holds it, so that none ends (and
	// leaves its owner's count) during the test.
	stall := pausingSource(t, time.Minute)
	storage := httpServer(t, httpstore.Handler(t.TempDir()))
	body := func(i int) []byte {
		return []byte(`{"files": [{"sources": ["` + stall + `/f` + strconv.Itoa(i) + `"], "destinations": ["` + storage + `/f` + strconv.Itoa(i) + `"]}]}`)
	}
	for i := range 9 {
		if code := c.do("POST", "/jobs", body(i), nil); code != http.StatusOK {
			t.Fatalf("job %d of 9: %d", i+1, code)
		}
	}
	// At 9 of 10 jobs, 50 submissions at once: one is taken.
	codes := make(chan int, 50)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() { codes <- c.do("POST", "/jobs", body(100+i), nil) })
	}
	wg.Wait()
	close(codes)
	got := map[int]int{}
	for code := range codes {
		got[code]++
	}
	if got[http.StatusOK] != 1 || got[http.StatusTooManyRequests] != 49 {
		t.Fatalf("50 submissions at once at 9 of 10 jobs: %v, want one 200 and 49 429", got)
	}
	var list api.JobListReply
	if err := s.request(api.SubjectJobList, []byte(`{}`), nil, &list); err != nil || len(list.Jobs) != 10 {
		t.Fatalf("%d jobs (%v), want 10", len(list.Jobs), err)
	}
}

// submitStream returns the stream of DTR submissions and cancel commands
// once the scheduler has made it.
//
// It waits until the leader takes submissions through the consumer it
// makes anew as it begins to lead (it pulls, or has been given one), so
// that a test may then change the stream: NATS 2.15.2 reads a stream's
// configuration unlocked while it makes a consumer of the stream, and the
// race detector fails a test that updates the stream meanwhile.
func submitStream(t *testing.T, s *system) jetstream.Stream {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := s.js.Stream(t.Context(), bus.StreamSubmit)
		if err == nil {
			var cons jetstream.Consumer
			if cons, err = st.Consumer(t.Context(), bus.ConsumerSched); err == nil {
				if info := cons.CachedInfo(); info.NumWaiting == 0 && info.Delivered.Consumer == 0 {
					err = errors.New("the leader does not take submissions yet")
				}
			}
		}
		if err == nil {
			return st
		} else if time.Now().After(deadline) {
			t.Fatalf("the stream of DTR submissions: %v", err)
		}
	}
}

func TestAnFTS3CancelThatCannotBeSentIsAnswered503AndNoPriorityChangeUndoesACancel(t *testing.T) {
	base, is, s := startFTS(t, func(c *app.Config) { c.Generator.FTSMaxRequests = 64 })
	c := &ftsClient{t: t, base: base, token: mint(t, is, "rucio", []string{"/atlas"})}
	stall := pausingSource(t, time.Minute)
	storage := httpServer(t, httpstore.Handler(t.TempDir()))
	submit := func(name string) string {
		var sub struct {
			JobID string `json:"job_id"`
		}
		body := `{"files": [{"sources": ["` + stall + `/` + name + `"], "destinations": ["` + storage + `/` + name + `"]}]}`
		if code := c.do("POST", "/jobs", []byte(body), &sub); code != http.StatusOK {
			t.Fatalf("submit %s: %d", name, code)
		}
		return sub.JobID
	}
	type view struct {
		JobState string `json:"job_state"`
		Message  string `json:"message"`
	}

	// The stream that takes cancel commands refuses them: 503, and the job
	// is not shown CANCELED while its transfer goes on.
	id := submit("a")
	st := submitStream(t, s)
	cfg := st.CachedInfo().Config
	small := cfg
	small.MaxMsgSize = 64
	if _, err := s.js.UpdateStream(t.Context(), small); err != nil {
		t.Fatal(err)
	}
	var v view
	if code := c.do("DELETE", "/jobs/"+id, nil, &v); code != http.StatusServiceUnavailable || !strings.Contains(v.Message, "try again") {
		t.Fatalf("a cancel that cannot be sent: %d %+v, want 503", code, v)
	}
	if code := c.do("GET", "/jobs/"+id, nil, &v); code != http.StatusOK || v.JobState == "CANCELED" {
		t.Fatalf("after a cancel not sent the job is %d %s", code, v.JobState)
	}
	if _, err := s.js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	if code := c.do("DELETE", "/jobs/"+id, nil, &v); code != http.StatusOK || v.JobState != "CANCELED" {
		t.Fatalf("the cancel asked again: %d %+v, want 200 CANCELED", code, v)
	}

	// Priority changes at the same time as a cancel never write the job's
	// record back without it.
	id = submit("b")
	var wg sync.WaitGroup
	for p := range 20 {
		wg.Go(func() {
			c.do("POST", "/jobs/"+id, []byte(`{"params": {"priority": `+strconv.Itoa(1+p%5)+`}}`), nil)
		})
	}
	wg.Go(func() { c.do("DELETE", "/jobs/"+id, nil, nil) })
	wg.Wait()
	if code := c.do("GET", "/jobs/"+id, nil, &v); code != http.StatusOK || v.JobState != "CANCELED" {
		t.Fatalf("after a cancel among priority changes the job is %d %s, want CANCELED", code, v.JobState)
	}
}

func TestAnFTS3PollReadsAtMostItsBudgetOfLiveDTRRecordsAndNamesAtMost200Jobs(t *testing.T) {
	base, is, _ := startFTS(t)
	c := &ftsClient{t: t, base: base, token: mint(t, is, "rucio", []string{"/atlas"})}
	ids := strings.TrimSuffix(strings.Repeat("none-such,", 201), ",")
	var e struct{ Message string }
	if code := c.do("GET", "/jobs/"+ids, nil, &e); code != http.StatusBadRequest || !strings.Contains(e.Message, "at most 200") {
		t.Fatalf("a poll of 201 jobs: %d %q, want 400 naming 200", code, e.Message)
	}

	// Two jobs of 300 files that wait on a stalling source: a poll of
	// both reads the live state of the first's 300 and the second's first
	// 200 (500 in all); the second's last 100 show SUBMITTED.
	stall := pausingSource(t, time.Minute)
	storage := httpServer(t, httpstore.Handler(t.TempDir()))
	job := func(name string) string {
		var files []string
		for i := range 300 {
			f := name + strconv.Itoa(i)
			files = append(files, `{"sources": ["`+stall+`/`+f+`"], "destinations": ["`+storage+`/`+f+`"]}`)
		}
		var sub struct {
			JobID string `json:"job_id"`
		}
		if code := c.do("POST", "/jobs", []byte(`{"files": [`+strings.Join(files, ",")+`]}`), &sub); code != http.StatusOK {
			t.Fatalf("submit %s: %d", name, code)
		}
		return sub.JobID
	}
	a, b := job("a"), job("b")
	type polled []struct {
		Files []struct {
			FileState string `json:"file_state"`
		} `json:"files"`
	}
	live := func(j int, p polled, from, to int) int {
		n := 0
		for _, f := range p[j].Files[from:to] {
			if f.FileState != "SUBMITTED" {
				n++
			}
		}
		return n
	}
	// Once every file of the second job is queued (READY) when asked
	// alone, the two asked together show the budget's cut.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		var alone polled
		if code := c.do("GET", "/jobs/"+b+","+b+"?files=file_state", nil, &alone); code != http.StatusMultiStatus {
			t.Fatalf("poll: %d", code)
		}
		if live(0, alone, 0, 300) == 300 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second job's files not all queued after a minute: %d", live(0, alone, 0, 300))
		}
	}
	var both polled
	if code := c.do("GET", "/jobs/"+a+","+b+"?files=file_state", nil, &both); code != http.StatusMultiStatus || len(both) != 2 {
		t.Fatalf("poll both: %d", code)
	}
	if n := live(1, both, 200, 300); n != 0 {
		t.Errorf("%d of the second job's last 100 files were read live past the budget", n)
	}
	if n := live(1, both, 0, 200); n != 200 {
		t.Errorf("%d of the second job's first 200 files read live, want 200", n)
	}
}

func TestAnFTS3PriorityChangeOfADTRTheSchedulerHasNotTakenIsNeverTakenAsDone(t *testing.T) {
	base, is, s := startFTS(t)
	c := &ftsClient{t: t, base: base, token: mint(t, is, "rucio", []string{"/atlas"})}
	stall := pausingSource(t, time.Minute)
	storage := httpServer(t, httpstore.Handler(t.TempDir()))
	type submitted struct {
		JobID string `json:"job_id"`
	}
	var taken, lost submitted
	body := `{"files": [{"sources": ["` + stall + `/f"], "destinations": ["` + storage + `/f"]}]}`
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if code := c.do("POST", "/jobs", []byte(body), &taken); code == http.StatusOK {
			break
		} else if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("submit: %d", code)
		}
	}
	var status api.JobEvent
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var r api.DTRReply
		if err := s.request(api.SubjectJobStatus, []byte(taken.JobID), nil, &status); err == nil && len(status.Pending) == 1 &&
			s.request(api.SubjectDTR, []byte(status.Pending[0].DTR.String()), nil, &r) == nil {
			break // the scheduler has it
		}
		if time.Now().After(deadline) {
			t.Fatal("the scheduler never took the first job's DTR")
		}
	}
	// With the scheduler away, the next job's DTR is lost from the stream
	// before it is taken: the scheduler, back, does not know it.
	s.stopRole("scheduler")
	body = `{"files": [{"sources": ["` + stall + `/g"], "destinations": ["` + storage + `/g"]}]}`
	if code := c.do("POST", "/jobs", []byte(body), &lost); code != http.StatusOK {
		t.Fatalf("submit with the scheduler away: %d", code)
	}
	var e struct{ Message string }
	if code := c.do("POST", "/jobs/"+lost.JobID, []byte(`{"params": {"priority": 4}}`), &e); code != http.StatusServiceUnavailable {
		t.Fatalf("a priority change with no scheduler: %d %q, want 503", code, e.Message)
	}
	if err := submitStream(t, s).Purge(t.Context()); err != nil {
		t.Fatal(err)
	}
	s.startRole("scheduler")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code := c.do("POST", "/jobs/"+lost.JobID, []byte(`{"params": {"priority": 4}}`), &e)
		if code == http.StatusServiceUnavailable && strings.Contains(e.Message, "not yet taken by the scheduler") {
			break
		}
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("a priority change of a DTR the scheduler does not know: %d %q, want 503 saying it is not yet taken", code, e.Message)
		}
	}
	// The job the scheduler has gets its change, made before the answer.
	if code := c.do("POST", "/jobs/"+taken.JobID, []byte(`{"params": {"priority": 4}}`), &e); code != http.StatusOK {
		t.Fatalf("a priority change: %d %q", code, e.Message)
	}
	var r api.DTRReply
	if err := s.request(api.SubjectDTR, []byte(status.Pending[0].DTR.String()), nil, &r); err != nil || r.DTR.Priority != 65 {
		t.Fatalf("the DTR at the scheduler: priority %d (%v), want 65 (FTS3's 4)", r.DTR.Priority, err)
	}
}
