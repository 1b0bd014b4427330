package e2e

// Who is asking: the owner of work comes from the credentials of whoever
// submitted it, never from its text; only owners and administrators see and
// change it; jobs ids never collide across owners; one owner's limits hold.
// Every test runs the roles as their own NATS users of deploy/nats/sluice.conf.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/internal/app/securetest"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
	"github.com/sluice-dtr/sluice/pkg/token"
	"github.com/sluice-dtr/sluice/pkg/token/tokentest"
)

// addUserLike gives ns's options a user with the permissions of another
// user of sluice.conf, that user's name replaced with the new one in
// every subject: a new user made as sluice.conf says to.
func addUserLike(t *testing.T, opts *server.Options, like, name, password string) {
	t.Helper()
	for _, u := range opts.Users {
		if u.Username != like {
			continue
		}
		swap := func(sp *server.SubjectPermission) *server.SubjectPermission {
			if sp == nil {
				return nil
			}
			out := &server.SubjectPermission{}
			for _, s := range sp.Allow {
				out.Allow = append(out.Allow, strings.ReplaceAll(s, like, name))
			}
			for _, s := range sp.Deny {
				out.Deny = append(out.Deny, strings.ReplaceAll(s, like, name))
			}
			return out
		}
		p := &server.Permissions{Publish: swap(u.Permissions.Publish), Subscribe: swap(u.Permissions.Subscribe), Response: u.Permissions.Response}
		opts.Users = append(opts.Users, &server.User{Username: name, Password: password, Permissions: p})
		return
	}
	t.Fatalf("no user %q in sluice.conf", like)
}

// identityServer runs sluice.conf's NATS server with three more users made
// like its submitter: alice, bob and boss. The submitter is mallory.
func identityServer(t *testing.T) (*server.Server, map[string]string) {
	t.Helper()
	ns, passwords, _ := permissionsServerWith(t, func(opts *server.Options, passwords map[string]string) {
		for _, u := range []string{"alice", "bob", "boss"} {
			passwords[u] = "pw-" + u + "-" + uuid.NewString()
			addUserLike(t, opts, "submitter", u, passwords[u])
		}
	})
	return ns, passwords
}

// usersFile writes SLUICE_USERS: alice and mallory (the submitter) with
// DNs and a VO, bob with none (user:bob), boss an administrator.
func usersFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "users.json")
	b := `{"alice": {"dn": "/DC=org/CN=Alice", "fqans": ["/atlas"]},
	       "submitter": {"dn": "/DC=org/CN=Mallory", "fqans": ["/atlas"]},
	       "boss": {"dn": "/DC=org/CN=Boss", "admin": true}}`
	if err := os.WriteFile(p, []byte(b), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// as is a user's view of Sluice: requests on its own subjects.
func as(t *testing.T, ns *server.Server, user, password string) *system {
	return &system{t: t, nc: connectAs(t, ns, user, password).nc, user: user}
}

// pausingSource serves every path as 1 KiB, a GET after holding it for
// hold, so that each transfer holds its slot that long.
func pausingSource(t *testing.T, hold time.Duration) string {
	return httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1024")
		if r.Method != http.MethodGet {
			return
		}
		time.Sleep(hold)
		_, _ = w.Write(make([]byte, 1024))
	}))
}

// TestASubmitterWhoInventsOwnersGetsOneShare is the Sybil attack: with a
// share per DN and 10 transfer slots, an honest user submits 200 files;
// another then submits 100 two-file jobs, each in the name of another
// invented DN with the production role. The owners are ignored: every job
// is the attacker's, and the honest user gets half of the slots while both
// have work queued (on the old code, one share per invented DN took all).
func TestASubmitterWhoInventsOwnersGetsOneShare(t *testing.T) {
	ns, passwords := identityServer(t)
	users := usersFile(t)
	rolesAs(t, ns, passwords, func(c *app.Config) {
		c.SharePolicy, c.MaxDelivery, c.MaxEmergency = "dn", 10, 1
		c.UsersFile = users
		c.Delivery.Workers = 11
	})
	src := pausingSource(t, 150*time.Millisecond)
	out := t.TempDir()
	alice := as(t, ns, "alice", passwords["alice"])
	mallory := as(t, ns, "submitter", passwords["submitter"])
	operator := &system{t: t, nc: connectAs(t, ns, "client", passwords["client"]).nc}

	honest := &job.Job{Name: "honest"}
	for i := range 200 {
		honest.Inputs = append(honest.Inputs, job.File{Source: fmt.Sprintf("%s/alice/%d", src, i), Destination: fileURL(filepath.Join(out, "alice", fmt.Sprint(i)))})
	}
	hj := alice.submit(honest)
	var sybils []string
	for i := range 100 {
		j := &job.Job{Name: "sybil", Owner: dtr.Identity{DN: fmt.Sprintf("/CN=sybil-%d", i), FQANs: []string{"/atlas/Role=production"}}}
		for k := range 2 {
			j.Inputs = append(j.Inputs, job.File{Source: fmt.Sprintf("%s/m/%d/%d", src, i, k), Destination: fileURL(filepath.Join(out, "m", fmt.Sprint(i), fmt.Sprint(k)))})
		}
		sybils = append(sybils, mallory.submit(j).JobID)
	}
	// The slots each share holds, sampled while both have work queued.
	var samples, held int
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		running, queued := map[string]int{}, map[string]int{}
		for _, s := range operator.shares().Shares {
			if s.State == dtr.Transfer {
				running[s.Share] += s.Running
				queued[s.Share] += s.Queued
			}
		}
		for share := range running {
			if !strings.HasPrefix(share, "/DC=org/CN=Alice") && !strings.HasPrefix(share, "/DC=org/CN=Mallory") {
				t.Fatalf("a share %q that no credential names: %v", share, running)
			}
		}
		a, m := "/DC=org/CN=Alice-download", "/DC=org/CN=Mallory-download"
		if queued[a] > 0 && queued[m] > 0 {
			samples++
			held += running[a]
		} else if samples > 0 {
			break
		}
	}
	if samples < 10 {
		t.Fatalf("only %d samples with both users' work queued", samples)
	}
	mean := float64(held) / float64(samples)
	t.Logf("the honest user held %.2f of 11 transfer slots on average over %d samples", mean, samples)
	if mean < 4.5 {
		t.Fatalf("the honest user held %.2f transfer slots on average, want about half of 10 (at least 4.5)", mean)
	}
	// Every job is mallory's, whatever its text said.
	ev := mallory.wait(sybils[0], 2*time.Minute)
	if ev.Job.Owner.DN != "/DC=org/CN=Mallory" || slices.Contains(ev.Job.Owner.FQANs, "/atlas/Role=production") {
		t.Fatalf("a job naming /CN=sybil-0 is owned by %+v, want mallory's identity", ev.Job.Owner)
	}
	alice.wait(hj.JobID, 2*time.Minute)
}

// TestOnlyTheOwnerOrAnAdministratorSeesAndChangesAJob: another user can
// neither see nor change a job or its DTRs (and learns no more than of an
// unknown one), nor reconfigure shares; the owner can see and cancel their
// own job with their own credentials; an administrator can do everything.
func TestOnlyTheOwnerOrAnAdministratorSeesAndChangesAJob(t *testing.T) {
	ns, passwords := identityServer(t)
	users := usersFile(t)
	rolesAs(t, ns, passwords, func(c *app.Config) {
		c.UsersFile, c.MaxDelivery, c.MaxEmergency = users, 1, 0
	})
	in := t.TempDir()
	for i := range 3 {
		writeFile(t, filepath.Join(in, fmt.Sprint(i)), 100, i)
	}
	src, release := heldStore(t, in)
	out := t.TempDir()
	alice := as(t, ns, "alice", passwords["alice"])
	bob := as(t, ns, "bob", passwords["bob"])
	boss := as(t, ns, "boss", passwords["boss"])

	j := &job.Job{Name: "private"}
	for i := range 3 {
		j.Inputs = append(j.Inputs, job.File{Source: fmt.Sprintf("%s/%d", src, i), Destination: fileURL(filepath.Join(out, fmt.Sprint(i)))})
	}
	r := alice.submit(j)
	waiting := r.DTRs[2]
	// The DTR is known to the scheduler once alice can see it.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := alice.request(api.SubjectDTR, []byte(waiting.String()), nil, new(api.DTRReply)); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("alice cannot see her own DTR: %v", err)
		}
	}
	refused := []struct {
		name, subject, body, want string
	}{
		{"status of her job", api.SubjectJobStatus, r.JobID, "not yours"},
		{"her DTR", api.SubjectDTR, waiting.String(), "not yours"},
		{"her DTR's history", api.SubjectHistory, waiting.String(), "not yours"},
		{"cancel her job", api.SubjectCancel, fmt.Sprintf(`{"job":%q}`, r.JobID), "not yours"},
		{"cancel her DTR", api.SubjectCancel, fmt.Sprintf(`{"dtr":%q}`, waiting), "not yours"},
		{"reprioritise her DTR", api.SubjectPriority, fmt.Sprintf(`{"dtr":%q,"priority":99}`, waiting), "not yours"},
		{"reconfigure shares", api.SubjectReconfigure, `{"sharepriority":{"_default":90}}`, "only administrators"},
		// An unknown id gets the answer another owner's gets.
		{"status of a job nobody has", api.SubjectJobStatus, "no-such-job", "not yours"},
	}
	for _, tt := range refused {
		t.Run("bob may not "+tt.name, func(t *testing.T) {
			err := bob.request(tt.subject, []byte(tt.body), nil, new(json.RawMessage))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("bob's request: %v, want an error saying %q", err, tt.want)
			}
		})
	}
	var retrying api.RetryingReply
	if err := bob.request(api.SubjectRetrying, []byte(r.JobID), nil, &retrying); err != nil || len(retrying.DTRs) != 0 {
		t.Fatalf("bob asked which of alice's DTRs retry: %+v, %v", retrying, err)
	}
	// Nothing of alice's changed; she and the administrator see it.
	var d api.DTRReply
	if err := boss.request(api.SubjectDTR, []byte(waiting.String()), nil, &d); err != nil || d.DTR.State.Final() || d.DTR.Priority == 99 {
		t.Fatalf("the administrator sees alice's DTR as %+v, %v; want it unfinished, at its own priority", d.DTR, err)
	}
	for who, c := range map[string]*system{"alice": alice, "the administrator": boss} {
		var h api.HistoryReply
		if err := c.request(api.SubjectHistory, []byte(waiting.String()), nil, &h); err != nil || h.DTR != waiting {
			t.Fatalf("%s asks for alice's DTR's history: %+v, %v", who, h, err)
		}
	}
	var ev api.JobEvent
	if err := alice.request(api.SubjectJobStatus, []byte(r.JobID), nil, &ev); err != nil || ev.Job.Owner.DN != "/DC=org/CN=Alice" {
		t.Fatalf("alice's own job status: %+v, %v", ev.Job.Owner, err)
	}
	if err := boss.request(api.SubjectPriority, []byte(fmt.Sprintf(`{"dtr":%q,"priority":80}`, waiting)), nil, &d); err != nil || d.DTR.Priority != 80 {
		t.Fatalf("the administrator reprioritises: %+v, %v", d.DTR.Priority, err)
	}
	// Alice cancels her own job with her own credentials.
	var c api.CancelReply
	if err := alice.request(api.SubjectCancel, []byte(fmt.Sprintf(`{"job":%q}`, r.JobID)), nil, &c); err != nil || c.Cancelled != 3 {
		t.Fatalf("alice cancels her job: %+v, %v; want 3 cancelled", c, err)
	}
	release()
	if ev := alice.wait(r.JobID, time.Minute); ev.Cancelled != 3 {
		t.Fatalf("alice's job ended with %d of 3 cancelled", ev.Cancelled)
	}
	var shares api.SharesReply
	if err := boss.request(api.SubjectReconfigure, []byte(`{"sharepriority":{"_default":90}}`), nil, &shares); err != nil {
		t.Fatalf("the administrator reconfigures shares: %v", err)
	}
}

// TestJobIDsChosenByDifferentOwnersNeverCollide: bob cannot take the id
// that alice will use: each owner's chosen ids are their own.
func TestJobIDsChosenByDifferentOwnersNeverCollide(t *testing.T) {
	ns, passwords := identityServer(t)
	rolesAs(t, ns, passwords, nil)
	dir := t.TempDir()
	alice := as(t, ns, "alice", passwords["alice"])
	bob := as(t, ns, "bob", passwords["bob"])
	mk := func(who string) *job.Job {
		src := filepath.Join(dir, who+"-in")
		writeFile(t, src, 100, len(who))
		return &job.Job{ID: "reco-42", Inputs: []job.File{{Source: fileURL(src), Destination: fileURL(filepath.Join(dir, who+"-out"))}}}
	}
	b := bob.submit(mk("bob")) // first, to squat the id
	a := alice.submit(mk("alice"))
	if a.JobID == b.JobID {
		t.Fatalf("alice and bob both got job %s", a.JobID)
	}
	if !strings.HasSuffix(a.JobID, "-reco-42") || !strings.HasSuffix(b.JobID, "-reco-42") {
		t.Fatalf("job ids %s and %s do not keep the chosen id", a.JobID, b.JobID)
	}
	for _, u := range []struct {
		s  *system
		id string
	}{{alice, a.JobID}, {bob, b.JobID}} {
		if ev := u.s.wait(u.id, time.Minute); ev.Done != 1 {
			t.Fatalf("job %s ended with %d of 1 DONE", u.id, ev.Done)
		}
	}
	// Submitting again with the id given is the same job, not a new one.
	again := mk("alice")
	again.ID = a.JobID
	if r := alice.submit(again); r.JobID != a.JobID {
		t.Fatalf("resubmitted as %s, want %s", r.JobID, a.JobID)
	}
}

// TestOneOwnerCannotQueueMoreThanItsLimits: past its limits an owner's
// jobs and DTRs are refused with a reason that names the limit; other
// users go on.
func TestOneOwnerCannotQueueMoreThanItsLimits(t *testing.T) {
	ns, passwords := identityServer(t)
	rolesAs(t, ns, passwords, func(c *app.Config) {
		c.Generator.OwnerMaxJobs = 2
		c.OwnerMaxDTRs, c.MaxDelivery, c.MaxEmergency = 5, 1, 0
	})
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	src := httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hold:
		case <-r.Context().Done():
		}
	}))
	out := t.TempDir()
	bob := as(t, ns, "bob", passwords["bob"])
	mk := func(n int) *job.Job {
		j := &job.Job{}
		for range n {
			j.Inputs = append(j.Inputs, job.File{Source: src + "/" + uuid.NewString(), Destination: fileURL(filepath.Join(out, uuid.NewString()))})
		}
		return j
	}
	bob.submit(mk(1))
	bob.submit(mk(1))
	var reply api.SubmitReply
	err := bob.request(api.SubjectJobSubmit, jobJSON(t, mk(1)), nil, &reply)
	if err == nil || !strings.Contains(err.Error(), "owner limit reached") || !strings.Contains(err.Error(), "OWNER_MAX_JOBS") {
		t.Fatalf("bob's third running job: %v, want a refusal naming SLUICE_GENERATOR_OWNER_MAX_JOBS", err)
	}
	// DTRs published straight on bob's subject: past 5 unfinished, refused.
	rejected, err := connectAs(t, ns, "observer", passwords["observer"]).nc.SubscribeSync(api.SubjectRejected)
	if err != nil {
		t.Fatal(err)
	}
	bc := connectAs(t, ns, "bob", passwords["bob"])
	for range 4 {
		body := fmt.Sprintf(`{"id":%q,"source":"%s/%s","destination":%q}`, uuid.New(), src, uuid.NewString(), fileURL(filepath.Join(out, uuid.NewString())))
		if _, err := bc.js.Publish(context.Background(), api.UserSubject(api.SubjectSubmit, "bob"), []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	m, err := rejected.NextMsg(30 * time.Second)
	if err != nil {
		t.Fatalf("no rejection of bob's sixth unfinished DTR: %v", err)
	}
	if !strings.Contains(string(m.Data), "owner limit reached") || !strings.Contains(string(m.Data), "SLUICE_OWNER_MAX_DTRS") {
		t.Fatalf("rejection %s, want one naming SLUICE_OWNER_MAX_DTRS", m.Data)
	}
	// Alice is not held back by bob.
	alice := as(t, ns, "alice", passwords["alice"])
	alice.submit(mk(1))
}

// TestUntrustedCallersNameOnlyLocalPathsUnderTheRoots: with no file roots
// a user's file:// URL is refused (the operator's are taken); with roots,
// a path outside them (a password file, a path climbing out with "..") is
// refused, and one inside is moved.
func TestUntrustedCallersNameOnlyLocalPathsUnderTheRoots(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "in")
	writeFile(t, src, 100, 1)
	fileJob := func(from, to string) *job.Job {
		return &job.Job{Inputs: []job.File{{Source: fileURL(from), Destination: fileURL(to)}}}
	}
	t.Run("no roots", func(t *testing.T) {
		ns, passwords := identityServer(t)
		rolesAs(t, ns, passwords, func(c *app.Config) { c.FileRoots = nil })
		bob := as(t, ns, "bob", passwords["bob"])
		var reply api.SubmitReply
		err := bob.request(api.SubjectJobSubmit, jobJSON(t, fileJob(src, filepath.Join(dir, "bob-out"))), nil, &reply)
		if err == nil || !strings.Contains(err.Error(), "SLUICE_FILE_ROOTS is empty") {
			t.Fatalf("bob's file:// job with no roots: %v, want a refusal naming SLUICE_FILE_ROOTS", err)
		}
		// The operator is trusted: its local paths are taken. (The test's
		// observer, who may publish anything, stands in for a front end
		// allowed on the plain subjects.)
		operator := &system{t: t, nc: connectAs(t, ns, "observer", passwords["observer"]).nc}
		r := operator.submit(fileJob(src, filepath.Join(dir, "operator-out")))
		if ev := operator.wait(r.JobID, time.Minute); ev.Done != 1 {
			t.Fatalf("the operator's file:// job ended with %d of 1 DONE", ev.Done)
		}
	})
	t.Run("roots", func(t *testing.T) {
		ns, passwords := identityServer(t)
		rolesAs(t, ns, passwords, func(c *app.Config) { c.FileRoots = []string{dir} })
		bob := as(t, ns, "bob", passwords["bob"])
		for _, tt := range []struct{ name, from, to string }{
			{"a password file", "/etc/shadow", filepath.Join(dir, "shadow")},
			{"a path that climbs out", dir + "/../../etc/passwd", filepath.Join(dir, "passwd")},
			{"a destination outside", src, filepath.Join(os.TempDir(), "sluice-outside-"+uuid.NewString())},
		} {
			var reply api.SubmitReply
			err := bob.request(api.SubjectJobSubmit, jobJSON(t, fileJob(tt.from, tt.to)), nil, &reply)
			if err == nil || !strings.Contains(err.Error(), "file:// URL not allowed") {
				t.Fatalf("%s: %v, want file:// URL not allowed", tt.name, err)
			}
		}
		r := bob.submit(fileJob(src, filepath.Join(dir, "bob-out")))
		if ev := bob.wait(r.JobID, time.Minute); ev.Done != 1 {
			t.Fatalf("a job inside the roots ended with %d of 1 DONE", ev.Done)
		}
	})
}

// jobJSON is j as a job description.
func jobJSON(t *testing.T, j *job.Job) []byte {
	t.Helper()
	b, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAJobSubmittedWithATokenIsItsHoldersInTheShareItsGroupsName: a WLCG
// token from a real OIDC issuer names the caller: the job lands in the share
// of the token's wlcg.groups (whatever owner its text states), the holder
// sees it, and a token that is expired, for another audience, or without
// the compute.create scope is refused with the reason.
func TestAJobSubmittedWithATokenIsItsHoldersInTheShareItsGroupsName(t *testing.T) {
	is := tokentest.Start(t)
	cfg := testConfig()
	cfg.SharePolicy = "voms:vo"
	cfg.Tokens = token.Config{Issuers: []string{is.URL}, Audience: []string{"https://sluice.test"}, Leeway: time.Second}
	dir := t.TempDir()
	cfg.FileRoots = []string{dir}
	s := start(t, cfg)
	src := filepath.Join(dir, "in")
	writeFile(t, src, 100, 1)
	j := &job.Job{Owner: dtr.Identity{DN: "/CN=someone-else", FQANs: []string{"/atlas"}},
		Inputs: []job.File{{Source: fileURL(src), Destination: fileURL(filepath.Join(dir, "out"))}}}
	// The operator's subjects with a token: the token names the caller.
	bearer := func(tok string) nats.Header { return nats.Header{"Authorization": []string{"Bearer " + tok}} }
	good := is.Mint(t, tokentest.Mint{Subject: "carol", Audience: []string{"https://sluice.test"},
		Groups: []string{"/cms", "/cms/production"}, Scopes: []string{"compute.create", "compute.read"}})

	refused := []struct{ name, token, want string }{
		{"expired", is.Mint(t, tokentest.Mint{Subject: "carol", Audience: []string{"https://sluice.test"}, Scopes: []string{"compute.create"},
			Expiry: time.Now().Add(-time.Hour), IssuedAt: time.Now().Add(-2 * time.Hour)}), "expired"},
		{"another audience", is.Mint(t, tokentest.Mint{Subject: "carol", Audience: []string{"https://other.example"}, Scopes: []string{"compute.create"}}), "audience"},
		{"no compute.create", is.Mint(t, tokentest.Mint{Subject: "carol", Audience: []string{"https://sluice.test"}, Scopes: []string{"compute.read"}}), "compute.create"},
		{"not a JWT", "not-a-token", "not a JWT"},
	}
	for _, tt := range refused {
		var reply api.SubmitReply
		err := s.request(api.SubjectJobSubmit, jobJSON(t, j), bearer(tt.token), &reply)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Fatalf("a job with a token %s: %v, want a refusal saying %q", tt.name, err, tt.want)
		}
	}
	var reply api.SubmitReply
	if err := s.request(api.SubjectJobSubmit, jobJSON(t, j), bearer(good), &reply); err != nil {
		t.Fatalf("a job with a good token: %v", err)
	}
	var ev api.JobEvent
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if err := s.request(api.SubjectJobStatus, []byte(reply.JobID), bearer(good), &ev); err != nil {
			t.Fatalf("the holder asks for the job's status: %v", err)
		}
		if ev.State != api.JobRunning || time.Now().After(deadline) {
			break
		}
	}
	if ev.Job.Owner.DN != "carol@"+is.URL || !slices.Equal(ev.Job.Owner.FQANs, []string{"/cms", "/cms/production"}) {
		t.Fatalf("the job's owner is %+v, want the token's carol@%s in /cms", ev.Job.Owner, is.URL)
	}
	var d api.DTRReply
	if err := s.request(api.SubjectDTR, []byte(reply.DTRs[0].String()), bearer(good), &d); err != nil || d.DTR.Share != "cms-download" {
		t.Fatalf("the job's DTR is in share %q (%v), want cms-download", d.DTR.Share, err)
	}
	// Another holder of a token from the same issuer does not see it.
	other := is.Mint(t, tokentest.Mint{Subject: "dave", Audience: []string{"https://sluice.test"}, Groups: []string{"/cms"}, Scopes: []string{"compute.read"}})
	if err := s.request(api.SubjectJobStatus, []byte(reply.JobID), bearer(other), &ev); err == nil || !strings.Contains(err.Error(), "not yours") {
		t.Fatalf("another token holder asks for carol's job: %v, want not yours", err)
	}
}

// TestNATSPubWithAUsersCredsSubmitsAsThatUser: on a NATS server in operator
// (JWT) mode, a user's .creds let it publish only on its own subjects; a
// DTR published with `nats pub` (the NATS CLI when it is on PATH, else
// nats.go with the same credentials) is that user's, whatever owner its
// text names, and the user reads it back on its own subject. Publishing on
// the operator's subject or another user's is refused by the server.
func TestNATSPubWithAUsersCredsSubmitsAsThatUser(t *testing.T) {
	op := securetest.NewOperator(t)
	dir := t.TempDir()
	_, url := securetest.Server(t, op.Conf())
	roles, _ := op.Creds(t, dir, "sluice")
	alice, _ := op.CredsAllowed(t, dir, "alice",
		[]string{"dtr.submit.alice", "sluice.api.*.alice", "sluice.api.job.*.alice"}, []string{"_INBOX_alice.>"})
	users := filepath.Join(dir, "users.json")
	if err := os.WriteFile(users, []byte(`{"alice": {"dn": "/DC=org/CN=Alice", "fqans": ["/atlas"]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.NATSURL, cfg.NATSCreds, cfg.UsersFile, cfg.FileRoots = url, roles, users, []string{dir}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- app.Run(ctx, cfg, app.Roles, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("roles: %v", err)
		}
	})

	src := filepath.Join(dir, "in")
	writeFile(t, src, 1000, 3)
	id := uuid.New()
	body := fmt.Sprintf(`{"id":%q,"source":%q,"destination":%q,"owner":{"dn":"/CN=mallory","fqans":["/atlas/Role=production"]}}`,
		id, fileURL(src), fileURL(filepath.Join(dir, "out")))
	nc, err := nats.Connect(url, nats.UserCredentials(alice), nats.CustomInboxPrefix("_INBOX_alice"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	aliceView := &system{t: t, nc: nc, user: "alice"}
	aliceView.shares() // the scheduler answers: its streams are there to take a plain publish
	if cli, err := exec.LookPath("nats"); err == nil {
		out, err := exec.Command(cli, "--server", url, "--creds", alice, "pub", api.UserSubject(api.SubjectSubmit, "alice"), body).CombinedOutput()
		if err != nil {
			t.Fatalf("nats pub: %v\n%s", err, out)
		}
		t.Logf("published with %s", cli)
	} else {
		t.Logf("no NATS CLI on PATH: published with nats.go and the same credentials")
		if err := nc.Publish(api.UserSubject(api.SubjectSubmit, "alice"), []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	var d api.DTRReply
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		err := aliceView.request(api.SubjectDTR, []byte(id.String()), nil, &d)
		if err == nil && d.DTR.State.Final() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice's DTR: %+v, %v", d.DTR, err)
		}
	}
	if d.DTR.State != dtr.Done || d.DTR.Owner.DN != "/DC=org/CN=Alice" || !slices.Equal(d.DTR.Owner.FQANs, []string{"/atlas"}) {
		t.Fatalf("alice's DTR ended %s owned by %+v, want DONE and owned by alice", d.DTR.State, d.DTR.Owner)
	}
	// The server refuses alice on the operator's subject and on bob's.
	errs := make(chan error, 4)
	refused, err := nats.Connect(url, nats.UserCredentials(alice), nats.CustomInboxPrefix("_INBOX_alice"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer refused.Close()
	for _, subject := range []string{api.SubjectSubmit, api.UserSubject(api.SubjectSubmit, "bob")} {
		_ = refused.Publish(subject, []byte(body))
		select {
		case err := <-errs:
			if !strings.Contains(err.Error(), "Permissions Violation") {
				t.Fatalf("publish on %s: %v, want a permissions violation", subject, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("alice published on %s and the server said nothing", subject)
		}
	}
}

// TestADTRIdAnotherOwnerTookIsRefusedNotShared: a DTR id is no one's to
// squat. Bob publishes first, under an id alice will use, the very DTR she
// will submit; hers is refused as taken (it is not taken as a resubmission
// of bob's), and bob's stays bob's. A job's DTR ids are random, so no one
// can take them before the job comes: submitted again, the job keeps them.
func TestADTRIdAnotherOwnerTookIsRefusedNotShared(t *testing.T) {
	ns, passwords := identityServer(t)
	rolesAs(t, ns, passwords, nil)
	dir := t.TempDir()
	src := filepath.Join(dir, "in")
	writeFile(t, src, 100, 9)
	rejected, err := connectAs(t, ns, "observer", passwords["observer"]).nc.SubscribeSync(api.SubjectRejected)
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.New()
	body := fmt.Sprintf(`{"id":%q,"source":%q,"destination":%q}`, id, fileURL(src), fileURL(filepath.Join(dir, "out")))
	bob, alice := as(t, ns, "bob", passwords["bob"]), as(t, ns, "alice", passwords["alice"])
	bob.shares() // the scheduler is up
	if err := bob.nc.Publish(api.UserSubject(api.SubjectSubmit, "bob"), []byte(body)); err != nil {
		t.Fatal(err)
	}
	var d api.DTRReply
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := bob.request(api.SubjectDTR, []byte(id.String()), nil, &d); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("bob's DTR: %v", err)
		}
	}
	if err := alice.nc.Publish(api.UserSubject(api.SubjectSubmit, "alice"), []byte(body)); err != nil {
		t.Fatal(err)
	}
	m, err := rejected.NextMsg(30 * time.Second)
	if err != nil || !strings.Contains(string(m.Data), "this DTR id is taken by another DTR") || !strings.Contains(string(m.Data), "dtr.submit.alice") {
		t.Fatalf("alice's DTR under bob's id: %v %s; want it refused as taken", err, m.Data)
	}
	if err := alice.request(api.SubjectDTR, []byte(id.String()), nil, &d); err == nil {
		t.Fatalf("alice sees the DTR under the id bob took: %+v", d.DTR.Owner)
	}
	// A job submitted twice keeps its random DTR ids.
	j := &job.Job{ID: "twice", Inputs: []job.File{{Source: fileURL(src), Destination: fileURL(filepath.Join(dir, "job-out"))}}}
	first := alice.submit(j)
	again := alice.submit(&job.Job{ID: first.JobID, Inputs: j.Inputs})
	if first.JobID != again.JobID || !slices.Equal(first.DTRs, again.DTRs) {
		t.Fatalf("submitted again: %s %v, first %s %v", again.JobID, again.DTRs, first.JobID, first.DTRs)
	}
	if ev := alice.wait(first.JobID, time.Minute); ev.Done != 1 || ev.Total != 1 {
		t.Fatalf("the job submitted twice ended with %d of %d DONE", ev.Done, ev.Total)
	}
}

// publishDTR publishes a plain DTR on the user's own dtr.submit.<user>.
func publishDTR(t *testing.T, s *system, body string) {
	t.Helper()
	if err := s.nc.Publish(api.UserSubject(api.SubjectSubmit, s.user), []byte(body)); err != nil {
		t.Fatal(err)
	}
}

// seenDTR waits until s sees its own DTR id, and returns it.
func seenDTR(t *testing.T, s *system, id uuid.UUID) dtr.DTR {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var d api.DTRReply
		if err := s.request(api.SubjectDTR, []byte(id.String()), nil, &d); err == nil {
			return d.DTR
		} else if time.Now().After(deadline) {
			t.Fatalf("%s cannot see its DTR %s: %v", s.user, id, err)
		}
	}
}

// TestNoOneCancelsAnotherOwnersJobByPuttingDTRsUnderItsID: alice's job id
// can be guessed (her chosen id in her namespace, made from her DN). Bob
// publishes DTRs of his own with that job_id, then cancels the job: his
// DTRs are under his own namespace, the cancel reaches nothing of alice's,
// and to bob her job is unknown.
func TestNoOneCancelsAnotherOwnersJobByPuttingDTRsUnderItsID(t *testing.T) {
	ns, passwords := identityServer(t)
	users := usersFile(t)
	rolesAs(t, ns, passwords, func(c *app.Config) {
		c.UsersFile, c.MaxDelivery, c.MaxEmergency = users, 1, 0
	})
	in := t.TempDir()
	for _, name := range []string{"a0", "a1", "a2", "b0", "b1", "b2", "b3", "b4"} {
		writeFile(t, filepath.Join(in, name), 100, len(name))
	}
	src, _ := heldStore(t, in)
	out := t.TempDir()
	alice := as(t, ns, "alice", passwords["alice"])
	bob := as(t, ns, "bob", passwords["bob"])
	j := &job.Job{ID: "reco-42"}
	for i := range 3 {
		j.Inputs = append(j.Inputs, job.File{Source: fmt.Sprintf("%s/a%d", src, i), Destination: fileURL(filepath.Join(out, fmt.Sprint("a", i)))})
	}
	r := alice.submit(j)
	guessed := auth.Namespace("/DC=org/CN=Alice") + "-reco-42"
	if r.JobID != guessed {
		t.Fatalf("alice's job id %s; bob guessed %s", r.JobID, guessed)
	}
	seenDTR(t, alice, r.DTRs[2])
	var last uuid.UUID
	for i := range 5 {
		last = uuid.New()
		publishDTR(t, bob, fmt.Sprintf(`{"id":%q,"job_id":%q,"source":"%s/b%d","destination":%q}`,
			last, guessed, src, i, fileURL(filepath.Join(out, fmt.Sprint("b", i)))))
	}
	if d := seenDTR(t, bob, last); d.JobID == guessed || !strings.HasPrefix(d.JobID, auth.Namespace("user:bob")+"-") {
		t.Fatalf("bob's DTR naming alice's job is in job %q, want it in bob's namespace", d.JobID)
	}
	var c api.CancelReply
	if err := bob.request(api.SubjectCancel, []byte(fmt.Sprintf(`{"job":%q}`, guessed)), nil, &c); err == nil || !strings.Contains(err.Error(), "not yours") {
		t.Fatalf("bob cancels alice's job: %+v, %v; want unknown, or not yours", c, err)
	}
	for _, id := range r.DTRs {
		if d := seenDTR(t, alice, id); d.Cancel || d.State.Final() {
			t.Fatalf("alice's DTR %s is %s (cancel %v) after bob's cancel", id, d.State, d.Cancel)
		}
	}
}

// TestACancelledJobIDCancelsNoOtherOwnersLaterDTRs: bob cancels a job of
// his, whose DTRs he put under the id alice's next job will get; alice's
// job, submitted after, runs to the end.
func TestACancelledJobIDCancelsNoOtherOwnersLaterDTRs(t *testing.T) {
	ns, passwords := identityServer(t)
	users := usersFile(t)
	rolesAs(t, ns, passwords, func(c *app.Config) { c.UsersFile = users })
	held := t.TempDir()
	writeFile(t, filepath.Join(held, "x"), 100, 5)
	base, _ := heldStore(t, held) // bob's DTR stays unfinished
	dir := t.TempDir()
	in := filepath.Join(dir, "in")
	writeFile(t, in, 100, 3)
	alice := as(t, ns, "alice", passwords["alice"])
	bob := as(t, ns, "bob", passwords["bob"])
	squat := auth.Namespace("/DC=org/CN=Alice") + "-reco-43"
	bob.shares() // the scheduler is up
	id := uuid.New()
	publishDTR(t, bob, fmt.Sprintf(`{"id":%q,"job_id":%q,"source":"%s/x","destination":%q}`, id, squat, base, fileURL(filepath.Join(dir, "bob"))))
	d := seenDTR(t, bob, id)
	var c api.CancelReply
	if err := bob.request(api.SubjectCancel, []byte(fmt.Sprintf(`{"job":%q}`, d.JobID)), nil, &c); err != nil || c.Cancelled != 1 {
		t.Fatalf("bob cancels his own DTR's job %s: %+v, %v", d.JobID, c, err)
	}
	r := alice.submit(&job.Job{ID: "reco-43", Inputs: []job.File{{Source: fileURL(in), Destination: fileURL(filepath.Join(dir, "alice"))}}})
	if ev := alice.wait(r.JobID, time.Minute); ev.Done != 1 {
		t.Fatalf("alice's job %s after bob cancelled %s: %d DONE, %d cancelled; want DONE", r.JobID, d.JobID, ev.Done, ev.Cancelled)
	}
}

// TestAJobsReplicasAreConfinedLikeItsSources: with no file roots a user may
// name no local path, as a replica neither: the job is refused.
func TestAJobsReplicasAreConfinedLikeItsSources(t *testing.T) {
	ns, passwords := identityServer(t)
	rolesAs(t, ns, passwords, func(c *app.Config) { c.FileRoots = nil })
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("the worker's private key"), 0o600); err != nil {
		t.Fatal(err)
	}
	bob := as(t, ns, "bob", passwords["bob"])
	j := &job.Job{Outputs: []job.File{{Source: "https://data.example.org/missing", Replicas: []string{fileURL(secret)}, Destination: "https://data.example.org/loot"}}}
	var reply api.SubmitReply
	if err := bob.request(api.SubjectJobSubmit, jobJSON(t, j), nil, &reply); err == nil || !strings.Contains(err.Error(), "file:// URL not allowed") {
		t.Fatalf("bob's job naming %s as a replica: %v, want it refused", fileURL(secret), err)
	}
}

// TestJobsAreHeldToTheOwnersByteLimit: one job whose DTRs' records would
// take its owner past SLUICE_OWNER_MAX_BYTES is refused, naming the limit.
func TestJobsAreHeldToTheOwnersByteLimit(t *testing.T) {
	ns, passwords := identityServer(t)
	rolesAs(t, ns, passwords, func(c *app.Config) { c.OwnerMaxBytes = 16 << 10 })
	out := t.TempDir()
	bob := as(t, ns, "bob", passwords["bob"])
	long := strings.Repeat("p", 2000)
	j := &job.Job{}
	for i := range 100 {
		j.Inputs = append(j.Inputs, job.File{Source: fmt.Sprintf("https://data.example.org/%d?pad=%s", i, long), Destination: fileURL(filepath.Join(out, fmt.Sprint(i)))})
	}
	var reply api.SubmitReply
	if err := bob.request(api.SubjectJobSubmit, jobJSON(t, j), nil, &reply); err == nil || !strings.Contains(err.Error(), "SLUICE_OWNER_MAX_BYTES") {
		t.Fatalf("bob's job of 100 DTRs of 2.6 KB each with a 16 KiB limit: %v, want a refusal naming SLUICE_OWNER_MAX_BYTES", err)
	}
}

// TestAJobStatusSaysNothingOfAnotherOwnersJob: asking for a key of alice's
// job that is no job id is answered as any malformed id, not with what
// her records hold.
func TestAJobStatusSaysNothingOfAnotherOwnersJob(t *testing.T) {
	ns, passwords := identityServer(t)
	users := usersFile(t)
	rolesAs(t, ns, passwords, func(c *app.Config) { c.UsersFile = users })
	dir := t.TempDir()
	in := filepath.Join(dir, "in")
	writeFile(t, in, 100, 4)
	alice := as(t, ns, "alice", passwords["alice"])
	bob := as(t, ns, "bob", passwords["bob"])
	r := alice.submit(&job.Job{ID: "reco-44", Inputs: []job.File{{Source: fileURL(in), Destination: fileURL(filepath.Join(dir, "out"))}}})
	for _, id := range []string{r.JobID + ".files", r.JobID + "x.files"} {
		err := bob.request(api.SubjectJobStatus, []byte(id), nil, new(json.RawMessage))
		if err == nil || !strings.Contains(err.Error(), "is not 1–64 characters") {
			t.Fatalf("bob asks for %s: %v, want the answer of a malformed id", id, err)
		}
	}
	if err := bob.request(api.SubjectJobStatus, []byte(r.JobID), nil, new(json.RawMessage)); err == nil || !strings.Contains(err.Error(), "not yours") {
		t.Fatalf("bob asks for alice's job: %v", err)
	}
}

// TestAFloodOfRefusedMessagesDropsNoOtherOwnersFinalDTRs: while the
// generator is away, a user floods its own subject with bad messages; the
// rejections go to SLUICE_REJECTIONS, and alice's final DTR waits in
// SLUICE_EVENTS until the generator is back and ends her job.
func TestAFloodOfRefusedMessagesDropsNoOtherOwnersFinalDTRs(t *testing.T) {
	ns, passwords := identityServer(t)
	users := usersFile(t)
	start, stops := rolesAs(t, ns, passwords, func(c *app.Config) {
		c.UsersFile, c.EventsMaxBytes, c.RejectionsMaxBytes = users, 8<<20, 8<<20
	})
	dir := t.TempDir()
	in := filepath.Join(dir, "in")
	writeFile(t, in, 100, 6)
	alice := as(t, ns, "alice", passwords["alice"])
	bob := as(t, ns, "bob", passwords["bob"])
	r := alice.submit(&job.Job{ID: "reco-45", Inputs: []job.File{{Source: fileURL(in), Destination: fileURL(filepath.Join(dir, "out"))}}})
	stops["generator"]()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var d api.DTRReply
		if err := alice.request(api.SubjectDTR, []byte(r.DTRs[0].String()), nil, &d); err == nil && d.DTR.State.Final() {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("alice's DTR did not end: %+v %v", d.DTR.State, err)
		}
	}
	observer := connectAs(t, ns, "observer", passwords["observer"])
	stream := func(name string) jetstream.StreamState {
		st, err := observer.js.Stream(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return info.State
	}
	finalSeq := stream(bus.StreamEvents).LastSeq
	// 12,000 rejections of about 1.4 KB: twice what SLUICE_EVENTS holds.
	bad := []byte(`{"pad":"` + strings.Repeat("p", 900) + `"}`)
	for range 6 {
		for range 2000 {
			if err := bob.nc.Publish(api.UserSubject(api.SubjectSubmit, "bob"), bad); err != nil {
				t.Fatal(err)
			}
		}
		_ = bob.nc.Flush()
		time.Sleep(100 * time.Millisecond)
	}
	for deadline := time.Now().Add(time.Minute); stream(bus.StreamRejections).FirstSeq == 1; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("SLUICE_REJECTIONS never dropped a rejection: %+v", stream(bus.StreamRejections))
		}
	}
	if first := stream(bus.StreamEvents).FirstSeq; first > finalSeq {
		t.Fatalf("SLUICE_EVENTS dropped alice's final DTR (seq %d; first now %d)", finalSeq, first)
	}
	start("generator")
	if ev := alice.wait(r.JobID, time.Minute); ev.Done != 1 {
		t.Fatalf("alice's job after bob's flood: %d of 1 DONE", ev.Done)
	}
}
