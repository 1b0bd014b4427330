package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// natsUsers are the users of deploy/nats/sluice.conf.
var natsUsers = []string{"scheduler", "generator", "processor", "delivery", "submitter", "client"}

// serverLog keeps what a NATS server reports as errors.
type serverLog struct {
	mu     sync.Mutex
	errors []string
}

func (l *serverLog) Noticef(string, ...any) {}
func (l *serverLog) Warnf(string, ...any)   {}
func (l *serverLog) Fatalf(f string, v ...any) {
	l.Errorf(f, v...)
}
func (l *serverLog) Debugf(string, ...any) {}
func (l *serverLog) Tracef(string, ...any) {}
func (l *serverLog) Errorf(f string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errors = append(l.errors, fmt.Sprintf(f, v...))
}

// violations returns the permission violations logged so far.
func (l *serverLog) violations() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.errors {
		if strings.Contains(e, "Violation") {
			out = append(out, e)
		}
	}
	return out
}

// permissionsServer runs a NATS server from deploy/nats/sluice.conf, on a
// free port with its store in a temporary directory, with a password for
// every user and a test-only observer that may do anything.
func permissionsServer(t *testing.T) (ns *server.Server, passwords map[string]string, log *serverLog) {
	t.Helper()
	ns, passwords, log = permissionsServerWith(t, nil)
	return ns, passwords, log
}

// permissionsServerWith is permissionsServer with the options and the
// passwords that change adjusts before the server starts.
func permissionsServerWith(t *testing.T, change func(*server.Options, map[string]string)) (ns *server.Server, passwords map[string]string, log *serverLog) {
	t.Helper()
	passwords = map[string]string{}
	for _, u := range natsUsers {
		passwords[u] = "pw-" + u + "-" + uuid.NewString()
		t.Setenv("SLUICE_NATS_"+strings.ToUpper(u)+"_PASSWORD", passwords[u])
	}
	opts, err := server.ProcessConfigFile(filepath.Join("..", "deploy", "nats", "sluice.conf"))
	if err != nil {
		t.Fatal(err)
	}
	passwords["observer"] = uuid.NewString()
	opts.Users = append(opts.Users, &server.User{Username: "observer", Password: passwords["observer"]})
	if change != nil {
		change(opts, passwords)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.StoreDir = filepath.Join(t.TempDir(), "jetstream")
	opts.NoSigs = true
	ns, err = server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	log = &serverLog{}
	ns.SetLoggerV2(log, false, false, false)
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	t.Cleanup(ns.Shutdown)
	return ns, passwords, log
}

// userConn is one user's connection; what the server refuses arrives on
// errs.
type userConn struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	errs chan error
}

func connectAs(t *testing.T, ns *server.Server, user, password string) *userConn {
	t.Helper()
	c := &userConn{errs: make(chan error, 16)}
	cfg := app.Config{NATSURL: ns.ClientURL(), NATSUser: user, NATSPassword: password}
	nc, err := app.Connect(cfg.NATSURL, "test-"+user, append(cfg.Options(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { c.errs <- err }))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c.nc = nc
	c.js, _ = jetstream.New(nc)
	return c
}

// state is what a refused publish must leave as it was: every stream's
// messages, every durable consumer's progress and every DTR record.
type state struct {
	Streams   map[string][3]uint64 // messages, first and last sequence
	Consumers map[string][3]uint64 // delivered, acknowledged, pending
	DTRs      map[string]uint64    // key: revision
}

func snapshot(t *testing.T, js jetstream.JetStream) state {
	t.Helper()
	ctx := context.Background()
	s := state{Streams: map[string][3]uint64{}, Consumers: map[string][3]uint64{}, DTRs: map[string]uint64{}}
	for _, name := range []string{bus.StreamSubmit, bus.StreamGrants, bus.StreamResults, bus.StreamEvents,
		bus.StreamJournal, "KV_" + bus.BucketDTRs, "KV_" + bus.BucketJobs} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		ss := st.CachedInfo().State
		s.Streams[name] = [3]uint64{ss.Msgs, ss.FirstSeq, ss.LastSeq}
	}
	consumers := [][2]string{{bus.StreamSubmit, bus.ConsumerSched}, {bus.StreamResults, bus.ConsumerSched}, {bus.StreamEvents, bus.ConsumerGen}}
	for _, st := range dtr.Stages {
		consumers = append(consumers, [2]string{bus.StreamGrants, string(st)})
	}
	for _, c := range consumers {
		cons, err := js.Consumer(ctx, c[0], c[1])
		if err != nil {
			t.Fatalf("consumer %s on %s: %v", c[1], c[0], err)
		}
		ci := cons.CachedInfo()
		s.Consumers[c[0]+"/"+c[1]] = [3]uint64{ci.Delivered.Stream, ci.AckFloor.Stream, ci.NumPending}
	}
	kv, err := js.KeyValue(ctx, bus.BucketDTRs)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		s.DTRs[k] = e.Revision()
	}
	return s
}

// settled returns the state once it holds still for longer than the
// scheduler takes between two restart indexes (a second): the checkpoint
// after the next one purges the journal further.
func settled(t *testing.T, js jetstream.JetStream) state {
	t.Helper()
	prev := snapshot(t, js)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		time.Sleep(1500 * time.Millisecond)
		cur := snapshot(t, js)
		if reflect.DeepEqual(prev, cur) {
			return cur
		}
		prev = cur
	}
	t.Fatal("the streams never held still")
	return prev
}

// TestEachRoleWorksWithOnlyItsOwnNATSPermissions runs every role as its own
// user of deploy/nats/sluice.conf, proves with a job that ends DONE that
// those rights are enough (the server refuses nothing), then has users try
// what they must not do: each attempt is refused and changes nothing.
// rolesAs runs every role, each logged in as its own user of ns, with the
// test configuration that change adjusts. It returns what starts a role
// again, and what stops each (and waits until it has).
func rolesAs(t *testing.T, ns *server.Server, passwords map[string]string, change func(*app.Config)) (start func(role string), stops map[string]func()) {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	stops = map[string]func(){}
	errs := make(chan error, 10)
	startRole := func(role string) {
		cfg := testConfig()
		// Submitters are not trusted: their file:// URLs must lie under
		// the roots, and every test's files are in a temporary directory.
		cfg.FileRoots = []string{os.TempDir()}
		if change != nil {
			change(&cfg)
		}
		cfg.NATSURL, cfg.NATSUser, cfg.NATSPassword = ns.ClientURL(), role, passwords[role]
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		stops[role] = func() { cancel(); <-done }
		go func() {
			defer close(done)
			if err := app.Run(ctx, cfg, []string{role}, log); err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("%s: %w", role, err)
			}
		}()
	}
	t.Cleanup(func() {
		for _, stop := range stops {
			stop()
		}
		close(errs)
		for err := range errs {
			t.Errorf("role failed: %v", err)
		}
	})
	// The scheduler last: the others wait for it to set up what they use.
	for _, role := range []string{"delivery", "processor", "generator", "scheduler"} {
		startRole(role)
	}
	return startRole, stops
}

// TestWithPermissionsTheRetentionRemovesEndedJobs: the generator may purge
// the records of an ended job, and the scheduler may let its DTR records
// expire, with only their own permissions.
func TestWithPermissionsTheRetentionRemovesEndedJobs(t *testing.T) {
	ns, passwords, serverLog := permissionsServer(t)
	dir := t.TempDir()
	rolesAs(t, ns, passwords, func(c *app.Config) { c.Retention = time.Second })
	submitter := connectAs(t, ns, "submitter", passwords["submitter"])
	sub := &system{t: t, nc: submitter.nc, user: "submitter"}
	src := filepath.Join(dir, "in")
	writeFile(t, src, 100, 1)
	r := sub.submit(&job.Job{Inputs: []job.File{{Source: fileURL(src), Destination: fileURL(filepath.Join(dir, "out"))}}})
	if ev := sub.wait(r.JobID, time.Minute); ev.Done != 1 {
		t.Fatalf("job %s with %d of 1 DONE", ev.State, ev.Done)
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		err := sub.request(api.SubjectJobStatus, []byte(r.JobID), nil, new(any))
		if err != nil && strings.Contains(err.Error(), "unknown job") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job is still there 20 s after a 1 s retention: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if v := serverLog.violations(); len(v) > 0 {
		t.Fatalf("the server refused what the roles needed:\n%s", strings.Join(v, "\n"))
	}
}

func TestEachRoleWorksWithOnlyItsOwnNATSPermissions(t *testing.T) {
	ns, passwords, serverLog := permissionsServer(t)
	dir := t.TempDir()
	// The refused writes are tried against a pre-processing grant that
	// waits, its processor stopped, for the minutes the checks take: its
	// lease must not run out meanwhile (it would be granted again).
	startRole, stops := rolesAs(t, ns, passwords, func(c *app.Config) { c.Lease = 30 * time.Minute })
	submitter := connectAs(t, ns, "submitter", passwords["submitter"])
	client := connectAs(t, ns, "client", passwords["client"])
	observer := connectAs(t, ns, "observer", passwords["observer"])

	mkjob := func(name string, n int) *job.Job {
		j := &job.Job{Name: name, Owner: dtr.Identity{DN: "/CN=" + name, FQANs: []string{"/atlas"}}}
		for i := range n {
			src := filepath.Join(dir, "in", name, fmt.Sprint(i))
			writeFile(t, src, 4096, i)
			j.Inputs = append(j.Inputs, job.File{Source: fileURL(src), Destination: fileURL(filepath.Join(dir, "out", name, fmt.Sprint(i)))})
		}
		return j
	}
	// The submitter submits and follows two jobs: one ends DONE, the other
	// fails (a missing source: the generator cancels its other downloads
	// and announces the failure); a malformed DTR that it publishes is
	// rejected by the scheduler. The client reads the shares.
	sub := &system{t: t, nc: submitter.nc, user: "submitter"}
	good := sub.submit(mkjob("allowed", 3))
	failing := mkjob("failing", 2)
	failing.Inputs = append(failing.Inputs, job.File{Source: fileURL(filepath.Join(dir, "in", "missing")), Destination: fileURL(filepath.Join(dir, "out", "missing"))})
	bad := sub.submit(failing)
	if ev := sub.wait(good.JobID, time.Minute); ev.State != "finished" || ev.Done != 3 {
		t.Fatalf("job %s with %d of 3 DONE", ev.State, ev.Done)
	}
	if ev := sub.wait(bad.JobID, time.Minute); ev.State != "failed" {
		t.Fatalf("job with a missing source %s", ev.State)
	}
	// It may ask which DTRs of a job wait for a retry, as submit --wait does.
	var retrying api.RetryingReply
	if err := sub.request(api.SubjectRetrying, []byte(good.JobID), nil, &retrying); err != nil || len(retrying.DTRs) != 0 {
		t.Fatalf("the submitter asked which DTRs retry: %+v, %v", retrying, err)
	}
	// Its DTRs' histories were stored and are read back, to the end
	// (the scheduler may write and read SLUICE_HISTORY).
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var h api.HistoryReply
		err := sub.request(api.SubjectHistory, []byte(good.DTRs[0].String()), nil, &h)
		if err == nil && len(h.Events) > 1 && h.Events[0].Seq == 1 && h.Events[len(h.Events)-1].State == dtr.Done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the submitter asks for its DTR's history: %+v, %v", h, err)
		}
	}
	// It lists its jobs, and so does the client, the operator (all jobs).
	for _, asker := range []*system{sub, {t: t, nc: client.nc}} {
		var jobs api.JobListReply
		if err := asker.request(api.SubjectJobList, nil, nil, &jobs); err != nil || len(jobs.Jobs) != 2 {
			t.Fatalf("%q lists the jobs: %+v, %v", asker.user, jobs, err)
		}
	}
	rejected, err := observer.nc.SubscribeSync(api.SubjectRejected)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := submitter.js.Publish(context.Background(), api.UserSubject(api.SubjectSubmit, "submitter"), []byte(`{"id":"twelve"}`)); err != nil {
		t.Fatalf("the submitter's malformed DTR was not taken: %v", err)
	}
	if _, err := rejected.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("no rejection: %v", err)
	}
	var shares api.SharesReply
	if err := (&system{t: t, nc: client.nc}).request(api.SubjectShares, nil, nil, &shares); err != nil {
		t.Fatalf("the client asks for the shares: %v", err)
	}
	// The scheduler's login asks the generator for the job list (its web
	// page's jobs), as the operator: it sees every job.
	scheduler := connectAs(t, ns, "scheduler", passwords["scheduler"])
	var jobs api.JobListReply
	if err := (&system{t: t, nc: scheduler.nc}).request(api.SubjectJobList, []byte(`{"state":"ended"}`), nil, &jobs); err != nil || len(jobs.Jobs) != 2 {
		t.Fatalf("the scheduler asks for the ended jobs: %+v, %v", jobs, err)
	}
	// The workers send heartbeats that the scheduler hears, and answer as
	// micro services: the client sees the three pools, nats micro ls them.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var workers api.WorkersReply
		err := (&system{t: t, nc: client.nc}).request(api.SubjectWorkers, nil, nil, &workers)
		stages := map[dtr.Stage]bool{}
		for _, w := range workers.Workers {
			stages[w.Stage] = !w.Silent
		}
		if err == nil && len(workers.Workers) == 3 && stages[dtr.StagePre] && stages[dtr.StagePost] && stages[dtr.StageDelivery] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client asks for the workers: %+v, %v", workers, err)
		}
	}
	for _, service := range []string{"sluice-processor", "sluice-delivery"} {
		if _, err := observer.nc.Request("$SRV.PING."+service, nil, 2*time.Second); err != nil {
			t.Fatalf("%s does not answer as a micro service: %v", service, err)
		}
	}
	if v := serverLog.violations(); len(v) > 0 {
		t.Fatalf("the server refused what the roles needed:\n%s", strings.Join(v, "\n"))
	}

	// With no processor, a second job's first grant waits in the pre
	// consumer: the refused attempts below must leave it there.
	stops["processor"]()
	delete(stops, "processor")
	waiting := sub.submit(mkjob("waiting", 1))
	for deadline := time.Now().Add(30 * time.Second); ; {
		if cons, err := observer.js.Consumer(context.Background(), bus.StreamGrants, string(dtr.StagePre)); err == nil && cons.CachedInfo().NumPending > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no pre-processing grant waits")
		}
		time.Sleep(50 * time.Millisecond)
	}

	delivery := connectAs(t, ns, "delivery", passwords["delivery"])
	processor := connectAs(t, ns, "processor", passwords["processor"])
	generator := connectAs(t, ns, "generator", passwords["generator"])
	grant := func() *nats.Msg {
		m := nats.NewMsg(api.GrantSubject(dtr.StageDelivery))
		m.Data = fmt.Appendf(nil, `{"grant":%q,"stage":"delivery","dtr":{"id":%q}}`, uuid.NewString(), waiting.DTRs[0])
		return m
	}
	msg := func(subject, data string) *nats.Msg {
		m := nats.NewMsg(subject)
		m.Data = []byte(data)
		return m
	}
	tests := []struct {
		name      string
		as        *userConn
		msg       *nats.Msg // published, or
		subscribe string    // subscribed to
	}{
		{"a deliverer publishes a delivery grant", delivery, grant(), ""},
		{"a deliverer takes a pre-processing grant", delivery,
			msg("$JS.API.CONSUMER.MSG.NEXT."+bus.StreamGrants+".pre", `{"batch":1,"expires":1000000000}`), ""},
		{"a processor publishes a grant", processor, grant(), ""},
		{"a submitter publishes a result", submitter, msg(api.ResultSubject(dtr.StagePre), `{"dtr":"`+waiting.DTRs[0].String()+`"}`), ""},
		{"a submitter publishes a grant", submitter, grant(), ""},
		{"a submitter cancels a DTR", submitter, msg(api.SubjectCancelCommand, `{"dtr":"`+waiting.DTRs[0].String()+`"}`), ""},
		{"a submitter deletes a stream", submitter, msg("$JS.API.STREAM.DELETE."+bus.StreamSubmit, ""), ""},
		{"a client publishes a DTR", client, msg(api.SubjectSubmit, `{}`), ""},
		{"a deliverer sends a processor's heartbeat", delivery, msg(api.HeartbeatSubject(dtr.StagePre), `{}`), ""},
		{"a submitter sends a heartbeat", submitter, msg(api.HeartbeatSubject(dtr.StageDelivery), `{}`), ""},
		{"a submitter asks for the workers", submitter, msg(api.SubjectWorkers, ""), ""},
		{"a processor hears the heartbeats", processor, nil, api.SubjectHeartbeatPrefix + ">"},
		{"a deliverer reads the processor's replies", delivery, nil, "_INBOX_processor.>"},
		{"a submitter serves the job API", submitter, nil, api.SubjectJobSubmit},
		{"a scheduler asks for a job's status", scheduler, msg(api.SubjectJobStatus, bad.JobID), ""},
		{"a scheduler submits a job", scheduler, msg(api.SubjectJobSubmit, `{}`), ""},
		{"a scheduler asks for a user's jobs", scheduler, msg(api.UserSubject(api.SubjectJobList, "submitter"), `{}`), ""},
		// The generator asks for an FTS3 caller's priorities on its own
		// subject, never as the operator.
		{"a generator changes a priority as the operator", generator, msg(api.SubjectPriority, `{"dtr":"`+waiting.DTRs[0].String()+`","priority":99}`), ""},
		// Only the scheduler writes and reads the DTRs' histories; the
		// others ask sluice.api.history, which checks the owner.
		{"a processor writes a DTR's history", processor, msg(bus.HistorySubject(waiting.DTRs[0].String()), `{"events":[]}`), ""},
		{"a deliverer writes a DTR's history", delivery, msg(bus.HistorySubject(waiting.DTRs[0].String()), `{"events":[]}`), ""},
		{"a submitter writes a DTR's history", submitter, msg(bus.HistorySubject(waiting.DTRs[0].String()), `{"events":[]}`), ""},
		{"a submitter reads the history stream", submitter,
			msg("$JS.API.STREAM.MSG.GET."+bus.StreamHistory, `{"last_by_subj":"`+bus.HistorySubject(waiting.DTRs[0].String())+`"}`), ""},
		{"a client reads the history stream directly", client,
			msg("$JS.API.DIRECT.GET."+bus.StreamHistory, `{"last_by_subj":"`+bus.HistorySubject(waiting.DTRs[0].String())+`"}`), ""},
		{"a deliverer reads the history stream", delivery,
			msg("$JS.API.STREAM.MSG.GET."+bus.StreamHistory, `{"last_by_subj":"`+bus.HistorySubject(waiting.DTRs[0].String())+`"}`), ""},
		{"a client hears the history events", client, nil, bus.SubjectHistoryPrefix + "*"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := settled(t, observer.js)
			subject := tt.subscribe
			if tt.msg != nil {
				subject, tt.msg.Reply = tt.msg.Subject, tt.as.nc.NewInbox()
				if err := tt.as.nc.PublishMsg(tt.msg); err != nil {
					t.Fatal(err)
				}
			} else if _, err := tt.as.nc.Subscribe(subject, func(*nats.Msg) {}); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-tt.as.errs:
				if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), subject) {
					t.Fatalf("error %v, want a permissions violation for %s", err, subject)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the server did not refuse it")
			}
			if after := settled(t, observer.js); !reflect.DeepEqual(before, after) {
				t.Fatalf("a refused publish changed something:\nbefore %+v\nafter  %+v", before, after)
			}
		})
	}

	// What a submitter may do still works: JetStream takes its DTR, and
	// with a processor back both jobs end DONE.
	src := filepath.Join(dir, "in", "direct")
	writeFile(t, src, 1000, 7)
	id := uuid.New()
	var ack *jetstream.PubAck
	m := msg(api.UserSubject(api.SubjectSubmit, "submitter"), fmt.Sprintf(`{"id":%q,"source":%q,"destination":%q}`, id, fileURL(src), fileURL(filepath.Join(dir, "out", "direct"))))
	m.Header.Set(nats.MsgIdHdr, id.String())
	ack, err = submitter.js.PublishMsg(context.Background(), m)
	if err != nil || ack.Stream != bus.StreamSubmit {
		t.Fatalf("the submitter's DTR: ack %+v, error %v", ack, err)
	}
	// A restarted scheduler reads its restart index and fetches the DTRs
	// it names with its own rights (a batched get of the bucket).
	okv, err := observer.js.KeyValue(context.Background(), bus.BucketDTRs)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := okv.Get(context.Background(), bus.IndexKey); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the scheduler stored no restart index")
		}
	}
	stops["scheduler"]()
	startRole("scheduler")
	startRole("processor")
	if ev := sub.wait(waiting.JobID, time.Minute); ev.State != "finished" {
		t.Fatalf("job %s", ev.State)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		var r api.DTRReply
		err := (&system{t: t, nc: client.nc}).request(api.SubjectDTR, []byte(id.String()), nil, &r)
		if err == nil && r.DTR.State == dtr.Done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the submitter's DTR: %s, %v", r.DTR.State, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if v := serverLog.violations(); len(v) != len(tests) {
		t.Fatalf("%d violations logged, want the %d refused above:\n%s", len(v), len(tests), strings.Join(v, "\n"))
	}
}
