package e2e

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/httpstore"
	"github.com/sluice-dtr/sluice/pkg/job"
)

func TestJobOfManyFilesAcrossTwoSharesEndsDoneByteExact(t *testing.T) {
	cfg := testConfig()
	cfg.SharePolicy, cfg.SharePriority = "voms:vo", "atlas=60,cms=40"
	cfg.MaxDelivery = 4
	s := start(t, cfg)
	remote := filepath.Join(s.dir, "remote")
	base := httpServer(t, httpstore.Handler(remote))

	atlas := &job.Job{Name: "atlas", Owner: dtr.Identity{DN: "/CN=alice", FQANs: []string{"/atlas/Role=production"}}, Priority: 80}
	cms := &job.Job{Name: "cms", Owner: dtr.Identity{DN: "/CN=bob", FQANs: []string{"/cms"}}}
	srcOf := map[string]string{}
	sumOf := map[string]string{}
	for i := 0; i < 120; i++ { // HTTP downloads with an expected adler32
		src := filepath.Join(remote, "in", fmt.Sprintf("a%03d", i))
		writeFile(t, src, 1000+i*397, i)
		sum, _ := checksum.File(src, "adler32")
		dst := fileURL(filepath.Join(s.dir, "session", "atlas", fmt.Sprintf("a%03d", i)))
		atlas.Inputs = append(atlas.Inputs, job.File{Source: fmt.Sprintf("%s/in/a%03d", base, i), Destination: dst, Checksum: sum})
		srcOf[dst], sumOf[dst] = src, sum
	}
	for i := 0; i < 20; i++ { // HTTP uploads
		src := filepath.Join(s.dir, "session", "atlas-out", fmt.Sprintf("o%03d", i))
		writeFile(t, src, 5000+i, 1000+i)
		dst := fmt.Sprintf("%s/out/o%03d", base, i)
		atlas.Outputs = append(atlas.Outputs, job.File{Source: fileURL(src), Destination: dst})
		srcOf[dst] = src
	}
	for i := 0; i < 100; i++ { // local copies, with md5, sha256 and crc32c expected
		src := filepath.Join(s.dir, "local", fmt.Sprintf("c%03d", i))
		writeFile(t, src, 20000+i*13, 2000+i)
		typ := []string{"md5", "sha256", "crc32c"}[i%3]
		sum, _ := checksum.File(src, typ)
		dst := fileURL(filepath.Join(s.dir, "session", "cms", fmt.Sprintf("c%03d", i)))
		cms.Inputs = append(cms.Inputs, job.File{Source: fileURL(src), Destination: dst, Checksum: sum})
		srcOf[dst], sumOf[dst] = src, sum
	}
	ra, rc := s.submit(atlas), s.submit(cms)

	// Watch the share table while the jobs run: both VOs must transfer at
	// the same time at least once.
	var both atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			running := map[string]int{}
			for _, sh := range s.shares().Shares {
				if sh.State == dtr.Transfer {
					running[strings.SplitN(sh.Share, "-", 2)[0]] += sh.Running
				}
			}
			if running["atlas"] > 0 && running["cms"] > 0 {
				both.Store(true)
			}
		}
	}()
	evs := []api.JobEvent{s.wait(ra.JobID, 2*time.Minute), s.wait(rc.JobID, 2*time.Minute)}
	close(stop)
	wg.Wait()

	n := 0
	for _, ev := range evs {
		if ev.State != api.JobFinished {
			t.Fatalf("job %s %s: %v", ev.Job.Name, ev.State, ev.Failures)
		}
		for _, f := range ev.Files {
			n++
			if f.State != dtr.Done {
				t.Fatalf("%s → %s ended %s: %+v", f.Source, f.Destination, f.State, f.Error)
			}
			want, _ := os.ReadFile(srcOf[f.Destination])
			gotPath := strings.TrimPrefix(f.Destination, "file://")
			if strings.HasPrefix(f.Destination, base) {
				gotPath = filepath.Join(remote, strings.TrimPrefix(f.Destination, base))
			}
			got, err := os.ReadFile(gotPath)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s is not a byte-exact copy of %s (%v)", f.Destination, srcOf[f.Destination], err)
			}
			if sum := sumOf[f.Destination]; sum != "" && !checksum.Equal(sum, f.Checksum) {
				t.Fatalf("%s: recorded checksum %s, expected %s", f.Destination, f.Checksum, sum)
			}
			if f.Size != int64(len(want)) || f.Started.IsZero() || f.Ended.Before(f.Started) {
				t.Fatalf("%s: statistics size=%d start=%s end=%s", f.Destination, f.Size, f.Started, f.Ended)
			}
		}
	}
	if n != 240 {
		t.Fatalf("%d files in the job statistics, want 240", n)
	}
	if !both.Load() {
		t.Fatal("the two shares never transferred at the same time")
	}
	// No temporary names are left behind.
	leftovers, _ := filepath.Glob(filepath.Join(s.dir, "session", "*", ".*.part"))
	if len(leftovers) > 0 {
		t.Fatalf("temporary files left: %v", leftovers)
	}
	if sh := s.shares().Shares; len(sh) != 0 {
		t.Fatalf("slots still held after every job ended: %+v", sh)
	}
}

func TestMissingSourceEndsInErrorWithAClearReasonAndNoRetry(t *testing.T) {
	s := start(t, testConfig())
	base := httpServer(t, httpstore.Handler(filepath.Join(s.dir, "remote")))
	tests := []struct {
		name   string
		source string
		kind   dtr.ErrorKind
	}{
		{"local file", fileURL(filepath.Join(s.dir, "no-such-file")), dtr.ErrLocalFile},
		{"HTTP 404", base + "/no-such-object", dtr.ErrPermanentRemote},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := &job.Job{Inputs: []job.File{{Source: tt.source, Destination: fileURL(filepath.Join(s.dir, "out", tt.name))}}}
			ev := s.wait(s.submit(j).JobID, time.Minute)
			if ev.State != api.JobFailed || len(ev.Files) != 1 {
				t.Fatalf("job %s with %d files, want failed with 1", ev.State, len(ev.Files))
			}
			f := ev.Files[0]
			if f.State != dtr.Error || f.Attempts != 1 {
				t.Fatalf("DTR %s after %d attempts, want ERROR after 1", f.State, f.Attempts)
			}
			if f.Error == nil || f.Error.Kind != tt.kind || f.Error.State != dtr.QueryingReplica {
				t.Fatalf("error %+v, want %s raised in QUERYING_REPLICA", f.Error, tt.kind)
			}
			mustContain(t, "error", f.Error.Text, "does not exist")
			mustContain(t, "job failure", strings.Join(ev.Failures, "\n"), "Failed in data staging", tt.source)
		})
	}
}

func TestHTTP503ThatClearsSucceedsOnRetry(t *testing.T) {
	s := start(t, testConfig())
	remote := filepath.Join(s.dir, "remote")
	writeFile(t, filepath.Join(remote, "busy"), 300000, 1)
	var gets atomic.Int32
	store := httpstore.Handler(remote)
	base := httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && gets.Add(1) <= 2 {
			http.Error(w, "busy, come back later", http.StatusServiceUnavailable)
			return
		}
		store.ServeHTTP(w, r)
	}))
	dst := filepath.Join(s.dir, "out", "busy")
	ev := s.wait(s.submit(&job.Job{Inputs: []job.File{{Source: base + "/busy", Destination: fileURL(dst)}}}).JobID, time.Minute)
	if ev.State != api.JobFinished {
		t.Fatalf("job %s: %v", ev.State, ev.Failures)
	}
	if f := ev.Files[0]; f.State != dtr.Done || f.Attempts != 3 {
		t.Fatalf("DTR %s after %d attempts, want DONE after 3 (two 503s)", f.State, f.Attempts)
	}
	want, _ := os.ReadFile(filepath.Join(remote, "busy"))
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, want) {
		t.Fatal("the file that arrived after the retries differs from the source")
	}
}

func TestMalformedMessagesAreRejectedAndServicesKeepRunning(t *testing.T) {
	s := start(t, testConfig())
	rejections := make(chan api.Rejection, 100)
	sub, err := s.nc.Subscribe(api.SubjectRejected, func(m *nats.Msg) {
		var r api.Rejection
		if _, err := codec.DecodeData(context.Background(), m, api.TypeRejected, &r); err == nil {
			rejections <- r
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	src := filepath.Join(s.dir, "src")
	writeFile(t, src, 1234, 1)
	id := uuid.NewString()
	good := func(id string) string {
		return fmt.Sprintf(`{"id":%q,"source":%q,"destination":%q}`, id, fileURL(src), fileURL(filepath.Join(s.dir, "dst", id)))
	}
	ce := func(typ, data string) *nats.Msg {
		m := nats.NewMsg(api.SubjectSubmit)
		m.Header.Set("ce-specversion", "1.0")
		m.Header.Set("ce-id", uuid.NewString())
		m.Header.Set("ce-source", "test")
		m.Header.Set("ce-type", typ)
		m.Header.Set("content-type", "application/json")
		m.Data = []byte(data)
		return m
	}
	plain := func(data string) *nats.Msg { m := nats.NewMsg(api.SubjectSubmit); m.Data = []byte(data); return m }
	tests := []struct {
		name string
		msg  *nats.Msg
		want string
	}{
		{"not JSON", plain("this is not { json"), "DTR JSON"},
		{"empty body", plain(""), "empty DTR"},
		{"trailing data", plain(good(uuid.NewString()) + `{"more":1}`), "trailing data"},
		{"unknown scheme", plain(fmt.Sprintf(`{"id":%q,"source":"gopher://x/y","destination":"file:///tmp/y"}`, uuid.NewString())), `scheme "gopher"`},
		{"id not a UUID", plain(`{"id":"twelve","source":"file:///a","destination":"file:///b"}`), "invalid UUID"},
		{"unknown field", plain(fmt.Sprintf(`{"id":%q,"sauce":"file:///a","destination":"file:///b"}`, uuid.NewString())), `unknown field "sauce"`},
		{"missing destination", plain(fmt.Sprintf(`{"id":%q,"source":"file:///a"}`, uuid.NewString())), "destination: URL is empty"},
		{"scheduler-only field", plain(fmt.Sprintf(`{"id":%q,"source":"file:///a","destination":"file:///b","state":"DONE"}`, uuid.NewString())), `unknown field "state"`},
		{"CloudEvent of the wrong type", ce("com.example.other", good(uuid.NewString())), "want \"org.sluice.dtr.submit.v1\""},
		{"CloudEvent without a source", func() *nats.Msg { m := ce(api.TypeSubmit, good(uuid.NewString())); m.Header.Del("ce-source"); return m }(), "source"},
		{"structured CloudEvent that is not JSON", func() *nats.Msg {
			m := plain("{{{")
			m.Header.Set("content-type", "application/cloudevents+json")
			return m
		}(), "CloudEvent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.msg.Header.Set(nats.MsgIdHdr, uuid.NewString())
			if _, err := s.js.PublishMsg(context.Background(), tt.msg); err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-rejections:
				mustContain(t, "rejection", r.Reason, tt.want)
				if r.Subject != api.SubjectSubmit {
					t.Fatalf("rejection names subject %q", r.Subject)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no rejection event")
			}
		})
	}

	// The services still work: a plain JSON DTR and a binary CloudEvent from
	// any publisher both arrive.
	finals := make(chan dtr.DTR, 10)
	fsub, _ := s.nc.Subscribe(api.SubjectDTRFinal, func(m *nats.Msg) {
		fs, _ := codec.DecodeFinals(context.Background(), m)
		for _, f := range fs {
			finals <- f.DTR
		}
	})
	defer fsub.Unsubscribe()
	id2 := uuid.NewString()
	for _, m := range []*nats.Msg{plain(good(id)), ce(api.TypeSubmit, good(id2))} {
		if _, err := s.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]dtr.State{}
	for len(seen) < 2 {
		select {
		case d := <-finals:
			seen[d.ID.String()] = d.State
		case <-time.After(30 * time.Second):
			t.Fatalf("valid DTRs did not finish after the bad ones: %v", seen)
		}
	}
	if seen[id] != dtr.Done || seen[id2] != dtr.Done {
		t.Fatalf("valid DTRs ended %v", seen)
	}

	// A bad job description gets an error reply naming the problem.
	var reply api.SubmitReply
	err = s.request(api.SubjectJobSubmit, []byte(`{"inputs":[{"source":"ftp://x/y","destination":"file:///z"}]}`), nil, &reply)
	if err == nil {
		t.Fatal("a job with an ftp source was accepted")
	}
	mustContain(t, "job error", err.Error(), "ftp")
}

func TestDownloadFailureCancelsOtherDownloadsWhileUploadsGoOn(t *testing.T) {
	cfg := testConfig()
	cfg.MaxDelivery = 2
	s := start(t, cfg)
	remote := filepath.Join(s.dir, "remote")
	store := httpstore.Handler(remote)
	base := httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/slow/") {
			time.Sleep(100 * time.Millisecond)
		}
		store.ServeHTTP(w, r)
	}))
	j := &job.Job{Name: "mixed"}
	j.Inputs = append(j.Inputs, job.File{Source: base + "/missing", Destination: fileURL(filepath.Join(s.dir, "session", "missing"))})
	for i := 0; i < 30; i++ {
		writeFile(t, filepath.Join(remote, "slow", fmt.Sprint(i)), 4096, i)
		j.Inputs = append(j.Inputs, job.File{Source: fmt.Sprintf("%s/slow/%d", base, i), Destination: fileURL(filepath.Join(s.dir, "session", fmt.Sprint(i)))})
	}
	for i := 0; i < 3; i++ {
		src := filepath.Join(s.dir, "results", fmt.Sprint(i))
		writeFile(t, src, 2048, 100+i)
		j.Outputs = append(j.Outputs, job.File{Source: fileURL(src), Destination: fmt.Sprintf("%s/out/%d", base, i)})
	}
	ev := s.wait(s.submit(j).JobID, time.Minute)
	if ev.State != api.JobFailed || !ev.DownloadFailed {
		t.Fatalf("job %s (download failed %v), want failed", ev.State, ev.DownloadFailed)
	}
	count := map[string]int{}
	for _, f := range ev.Files {
		count[string(f.Direction)+" "+f.State.String()]++
	}
	if count["download ERROR"] != 1 || count["download CANCELLED"] == 0 || count["upload DONE"] != 3 {
		t.Fatalf("outcomes %v: want 1 failed download, some cancelled downloads, 3 uploads done", count)
	}
	// A cancelled download leaves nothing behind.
	for _, f := range ev.Files {
		if f.State == dtr.Cancelled {
			if _, err := os.Stat(strings.TrimPrefix(f.Destination, "file://")); err == nil {
				t.Fatalf("cancelled download %s left its destination", f.Destination)
			}
		}
	}
	if leftovers, _ := filepath.Glob(filepath.Join(s.dir, "session", ".*.part")); len(leftovers) > 0 {
		t.Fatalf("temporary files left: %v", leftovers)
	}
}

func TestEachDTRHasOneTraceAcrossEveryService(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	old := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	defer otel.SetTracerProvider(old)

	s := start(t, testConfig())
	var files []job.File
	for i := 0; i < 3; i++ {
		src := filepath.Join(s.dir, "in", fmt.Sprint(i))
		writeFile(t, src, 100, i)
		files = append(files, job.File{Source: fileURL(src), Destination: fileURL(filepath.Join(s.dir, "out", fmt.Sprint(i)))})
	}
	ev := s.wait(s.submit(&job.Job{Inputs: files}).JobID, time.Minute)
	if ev.State != api.JobFinished {
		t.Fatalf("job %s", ev.State)
	}
	time.Sleep(200 * time.Millisecond) // the last spans end after the result is stored
	byTrace := map[string]map[string]bool{}
	for _, sp := range rec.Ended() {
		id := sp.SpanContext().TraceID().String()
		if byTrace[id] == nil {
			byTrace[id] = map[string]bool{}
		}
		byTrace[id][sp.Name()] = true
	}
	want := []string{"send dtr.submit", "schedule dtr.submit", "send sluice.grant.pre", "process sluice.grant.pre",
		"process sluice.grant.delivery", "process sluice.grant.post", "send sluice.result.delivery", "result sluice.result.post"}
	complete := 0
	for _, names := range byTrace {
		ok := true
		for _, w := range want {
			ok = ok && names[w]
		}
		if ok {
			complete++
		}
	}
	if complete != 3 {
		var got []string
		for id, names := range byTrace {
			got = append(got, fmt.Sprintf("%s: %v", id[:8], names))
		}
		t.Fatalf("%d traces hold every stage, want one per DTR (3):\n%s", complete, strings.Join(got, "\n"))
	}
}

func TestRestartedSchedulerFinishesEveryDTR(t *testing.T) {
	cfg := testConfig()
	cfg.MaxDelivery = 3
	// A grant the stopped scheduler stored but never sent is given up when
	// its lease runs out; a short lease keeps the test short.
	cfg.Lease = 3 * time.Second
	s := start(t, cfg)
	remote := filepath.Join(s.dir, "remote")
	store := httpstore.Handler(remote)
	base := httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			time.Sleep(20 * time.Millisecond)
		}
		store.ServeHTTP(w, r)
	}))
	j := &job.Job{}
	for i := 0; i < 80; i++ {
		writeFile(t, filepath.Join(remote, fmt.Sprint(i)), 3000+i, i)
		j.Inputs = append(j.Inputs, job.File{Source: fmt.Sprintf("%s/%d", base, i), Destination: fileURL(filepath.Join(s.dir, "out", fmt.Sprint(i)))})
	}
	r := s.submit(j)
	for i := 0; i < 3; i++ {
		time.Sleep(300 * time.Millisecond)
		s.stopRole("scheduler")
		time.Sleep(100 * time.Millisecond)
		s.startRole("scheduler")
	}
	ev := s.wait(r.JobID, 2*time.Minute)
	if ev.State != api.JobFinished || ev.Done != 80 || len(ev.Files) != 80 {
		t.Fatalf("job %s with %d done of %d: %v", ev.State, ev.Done, len(ev.Files), ev.Failures)
	}
	for _, f := range ev.Files {
		want, _ := os.ReadFile(filepath.Join(remote, strings.TrimPrefix(f.Source, base+"/")))
		got, _ := os.ReadFile(strings.TrimPrefix(f.Destination, "file://"))
		if !bytes.Equal(got, want) {
			t.Fatalf("%s differs from its source", f.Destination)
		}
	}
	// A DTR announced final just before a restart, whose record was not yet
	// stored as final, is held until its result is redelivered (AckWait,
	// 30 s); then no slot may stay held.
	deadline := time.Now().Add(45 * time.Second)
	for sh := s.shares().Shares; len(sh) != 0; sh = s.shares().Shares {
		if time.Now().After(deadline) {
			t.Fatalf("slots still held after the job ended: %+v", sh)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestProcessorChecksTheDestinationAndTheChecksum(t *testing.T) {
	cfg := testConfig()
	cfg.MaxTransferTries = 2
	s := start(t, cfg)
	src := filepath.Join(s.dir, "src")
	writeFile(t, src, 70000, 7)
	want, _ := os.ReadFile(src)
	old := []byte("an older file that must stay unless overwrite is set")
	tests := []struct {
		name      string
		existing  bool
		file      job.File
		state     dtr.State
		kind      dtr.ErrorKind
		text      string
		attempts  int
		wantBytes []byte // nil: the destination must not exist
	}{
		{name: "a wrong expected checksum is copied again once, then fails permanently, leaving nothing",
			file:  job.File{Checksum: "adler32:00000001"},
			state: dtr.Error, kind: dtr.ErrPermanentRemote, text: "checksum mismatch: expected adler32:00000001, got adler32:", attempts: 2},
		{name: "an existing destination without overwrite is refused and left alone", existing: true,
			state: dtr.Error, kind: dtr.ErrPermanentRemote, text: "destination exists", attempts: 1, wantBytes: old},
		{name: "an existing destination with overwrite is replaced", existing: true,
			file: job.File{Overwrite: true}, state: dtr.Done, attempts: 1, wantBytes: want},
		{name: "a right expected checksum passes",
			file: job.File{Checksum: mustSum(t, src, "sha256")}, state: dtr.Done, attempts: 1, wantBytes: want},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := filepath.Join(s.dir, "dst", fmt.Sprint(i), "file")
			if tt.existing {
				os.MkdirAll(filepath.Dir(dst), 0o755)
				os.WriteFile(dst, old, 0o644)
			}
			f := tt.file
			f.Source, f.Destination = fileURL(src), fileURL(dst)
			ev := s.wait(s.submit(&job.Job{Inputs: []job.File{f}}).JobID, time.Minute)
			got := ev.Files[0]
			if got.State != tt.state || got.Attempts != tt.attempts {
				t.Fatalf("ended %s after %d attempts (%+v), want %s after %d", got.State, got.Attempts, got.Error, tt.state, tt.attempts)
			}
			if tt.kind != "" && (got.Error == nil || got.Error.Kind != tt.kind || !strings.Contains(got.Error.Text, tt.text)) {
				t.Fatalf("error %+v, want %s mentioning %q", got.Error, tt.kind, tt.text)
			}
			b, err := os.ReadFile(dst)
			if tt.wantBytes == nil && err == nil {
				t.Fatal("the destination exists")
			}
			if tt.wantBytes != nil && !bytes.Equal(b, tt.wantBytes) {
				t.Fatalf("the destination holds %d bytes, not the expected %d", len(b), len(tt.wantBytes))
			}
			if parts, _ := filepath.Glob(filepath.Join(filepath.Dir(dst), ".*.part")); len(parts) > 0 {
				t.Fatalf("temporary files left: %v", parts)
			}
		})
	}
}

func mustSum(t *testing.T, path, typ string) string {
	t.Helper()
	sum, err := checksum.File(path, typ)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

func TestStateFileIsWrittenAndItsPrioFileChangesPriorities(t *testing.T) {
	cfg := testConfig()
	cfg.MaxDelivery = 1
	state := filepath.Join(t.TempDir(), "dtr.state")
	cfg.StateFile = state
	s := start(t, cfg)
	remote := filepath.Join(s.dir, "remote")
	base, release := heldStore(t, remote) // every transfer waits until the test has looked
	j := &job.Job{}
	for i := 0; i < 5; i++ {
		writeFile(t, filepath.Join(remote, fmt.Sprint(i)), 100, i)
		j.Inputs = append(j.Inputs, job.File{Source: fmt.Sprintf("%s/%d", base, i), Destination: fileURL(filepath.Join(s.dir, "out", fmt.Sprint(i)))})
	}
	r := s.submit(j)
	last := r.DTRs[4]
	// Wait until the state file shows one DTR transferring and the rest queued.
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(state)
		if strings.Count(string(b), " TRANSFERRING ") == 1 && strings.Count(string(b), " TRANSFER ") >= 3 {
			if !strings.Contains(string(b), last.String()) {
				t.Fatalf("state file lacks %s:\n%s", last, b)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("state file never showed the queue:\n%s", b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := os.WriteFile(state+".prio", []byte(last.String()+" 99\nnot-a-line\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for {
		var got struct{ DTR dtr.DTR }
		if err := s.request(api.SubjectDTR, []byte(last.String()), nil, &got); err != nil {
			t.Fatal(err)
		}
		if got.DTR.Priority == 99 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("priority is %d, want 99 from the .prio file", got.DTR.Priority)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := os.Stat(state + ".prio.read"); err != nil {
		t.Fatal("the .prio file was not renamed to .prio.read")
	}
	release()
	if ev := s.wait(r.JobID, time.Minute); ev.State != api.JobFinished {
		t.Fatalf("job %s", ev.State)
	}
}

func TestNamesWithSpacesAndAccentsArriveIntact(t *testing.T) {
	s := start(t, testConfig())
	src := filepath.Join(s.dir, "in", "my input é.root")
	writeFile(t, src, 5000, 3)
	dst := filepath.Join(s.dir, "out dir", "données finales #1.root")
	u := (&url.URL{Scheme: "file", Path: dst}).String() // percent-encoded
	ev := s.wait(s.submit(&job.Job{Inputs: []job.File{{Source: fileURL(src), Destination: u}}}).JobID, time.Minute)
	if f := ev.Files[0]; f.State != dtr.Done {
		t.Fatalf("ended %s: %+v", f.State, f.Error)
	}
	want, _ := os.ReadFile(src)
	if got, err := os.ReadFile(dst); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%s did not arrive intact: %v", dst, err)
	}
}

func TestResubmittingAFinishedJobRunsNothingAgain(t *testing.T) {
	s := start(t, testConfig())
	src := filepath.Join(s.dir, "in")
	writeFile(t, src, 1000, 1)
	dst := filepath.Join(s.dir, "out")
	j := &job.Job{ID: "resubmitted-job", Inputs: []job.File{{Source: fileURL(src), Destination: fileURL(dst)}}}
	first := s.submit(j)
	if ev := s.wait(first.JobID, time.Minute); ev.State != api.JobFinished {
		t.Fatalf("job %s", ev.State)
	}
	before, _ := os.Stat(dst)
	var ended struct{ DTR dtr.DTR }
	if err := s.request(api.SubjectDTR, []byte(first.DTRs[0].String()), nil, &ended); err != nil {
		t.Fatal(err)
	}
	finals := make(chan dtr.DTR, 10)
	sub, _ := s.nc.Subscribe(api.SubjectDTRFinal, func(m *nats.Msg) {
		fs, _ := codec.DecodeFinals(context.Background(), m)
		for _, f := range fs {
			finals <- f.DTR
		}
	})
	defer sub.Unsubscribe()
	time.Sleep(10 * time.Millisecond)
	again := s.submit(j)
	if again.JobID != first.JobID || again.DTRs[0] != first.DTRs[0] {
		t.Fatalf("resubmission gave %v, want the same job and DTR ids %v", again, first)
	}
	// The same DTR again from another publisher, with a message id that
	// JetStream has not seen, to a scheduler that has restarted since: the
	// scheduler must find it in its store.
	s.stopRole("scheduler")
	s.startRole("scheduler")
	m := nats.NewMsg(api.SubjectSubmit)
	m.Header.Set(nats.MsgIdHdr, uuid.NewString())
	m.Data = fmt.Appendf(nil, `{"id":%q,"source":%q,"destination":%q}`, first.DTRs[0], fileURL(src), fileURL(dst))
	if _, err := s.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	// Time for it to run again if it were to. The restarted scheduler may
	// announce its end again (finals are announced at least once: those
	// the journal still holds after a restart); a run would announce
	// another.
	deadline := time.After(1500 * time.Millisecond)
	for waiting := true; waiting; {
		select {
		case d := <-finals:
			if d.ID == first.DTRs[0] && (d.State != dtr.Done || d.Attempts != 1 || !d.Updated.Equal(ended.DTR.Updated)) {
				t.Fatalf("the finished DTR ran again: %s after %d attempts, changed %s (it ended %s)", d.State, d.Attempts, d.Updated, ended.DTR.Updated)
			}
		case <-deadline:
			waiting = false
		}
	}
	var got struct{ DTR dtr.DTR }
	if err := s.request(api.SubjectDTR, []byte(first.DTRs[0].String()), nil, &got); err != nil {
		t.Fatal(err)
	}
	if got.DTR.State != dtr.Done || got.DTR.Attempts != 1 {
		t.Fatalf("the DTR is %s after %d attempts, want still DONE after 1", got.DTR.State, got.DTR.Attempts)
	}
	after, _ := os.Stat(dst)
	if !after.ModTime().Equal(before.ModTime()) {
		t.Fatal("the destination was written again")
	}
}

func TestJobEndsEvenIfAnEarlierTryRecordedItsLastFileButNotTheCount(t *testing.T) {
	s := start(t, testConfig())
	remote := filepath.Join(s.dir, "remote")
	writeFile(t, filepath.Join(remote, "f"), 1000, 1)
	base, release := heldStore(t, remote)
	j := &job.Job{ID: "crashed-generator", Inputs: []job.File{{Source: base + "/f", Destination: fileURL(filepath.Join(s.dir, "out"))}}}
	r := s.submit(j)
	// A generator that died after storing the final DTR but before counting
	// it left this key behind.
	kv, err := s.js.KeyValue(context.Background(), bus.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	done := dtr.DTR{ID: r.DTRs[0], JobID: j.ID, State: dtr.Done, Direction: dtr.Download}
	b, _ := json.Marshal(done)
	if _, err := kv.Create(context.Background(), j.ID+".f."+r.DTRs[0].String(), b); err != nil {
		t.Fatal(err)
	}
	release()
	if ev := s.wait(r.JobID, 30*time.Second); ev.State != api.JobFinished || ev.Done != 1 {
		t.Fatalf("job %s with %d done", ev.State, ev.Done)
	}
}

func TestFinalDTRsAnnouncedAgainInOtherGroupingsAreCountedOnce(t *testing.T) {
	s := start(t, testConfig())
	remote := filepath.Join(s.dir, "remote")
	for _, n := range []string{"a", "b", "c"} {
		writeFile(t, filepath.Join(remote, n), 1000, 1)
	}
	store := httpstore.Handler(remote)
	release := make(chan struct{})
	base := httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/c" {
			<-release
		}
		store.ServeHTTP(w, r)
	}))
	j := &job.Job{ID: "announced-again"}
	for _, n := range []string{"a", "b", "c"} {
		j.Inputs = append(j.Inputs, job.File{Source: base + "/" + n, Destination: fileURL(filepath.Join(s.dir, "out", n))})
	}
	r := s.submit(j)
	final := func(id uuid.UUID) json.RawMessage {
		d := s.awaitDTR(id, 30*time.Second, func(d dtr.DTR) bool { return d.State == dtr.Done })
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b := final(r.DTRs[0]), final(r.DTRs[1])
	// A restarted scheduler announces final DTRs again, grouped as its
	// steps happen to fall: a, b, and both together. Counted again, a and
	// b would make three of the job's three files final.
	for i, group := range [][]json.RawMessage{{a}, {b}, {b, a}} {
		var fs api.Finals
		for _, d := range group {
			fs.DTRs = append(fs.DTRs, api.FinalEntry{DTR: d})
		}
		ev, err := codec.NewEvent(api.TypeDTRFinals, "sluice/scheduler", "again", fs)
		if err != nil {
			t.Fatal(err)
		}
		m, err := codec.Encode(context.Background(), api.SubjectDTRFinal, fmt.Sprintf("again.%d", i), ev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		var ev api.JobEvent
		if err := s.request(api.SubjectJobStatus, []byte(r.JobID), nil, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Announced {
			t.Fatalf("the job ended %s with %d done while its third file was held", ev.State, ev.Done)
		}
	}
	close(release)
	ev := s.wait(r.JobID, 30*time.Second)
	if ev.State != api.JobFinished || ev.Done != 3 || len(ev.Files) != 3 || len(ev.Pending) != 0 {
		t.Fatalf("job %s with %d done, %d files, %d pending; want finished with 3 done", ev.State, ev.Done, len(ev.Files), len(ev.Pending))
	}
}

func TestAStalledTransferFailsAsTooSlowAndFreesItsSlot(t *testing.T) {
	cfg := testConfig()
	cfg.MaxTransferTries = 2
	cfg.MaxDelivery = 1
	cfg.Delivery.MaxInactivity = 300 * time.Millisecond
	s := start(t, cfg)
	remote := filepath.Join(s.dir, "remote")
	writeFile(t, filepath.Join(remote, "ok"), 2000, 1)
	store := httpstore.Handler(remote)
	base := httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stall" {
			w.Header().Set("Content-Length", "100000")
			if r.Method == http.MethodGet {
				w.Write(make([]byte, 1000))
				w.(http.Flusher).Flush()
				<-r.Context().Done() // the connection stays open; no more data comes
			}
			return
		}
		store.ServeHTTP(w, r)
	}))
	j := &job.Job{Inputs: []job.File{{Source: base + "/stall", Destination: fileURL(filepath.Join(s.dir, "out", "stall"))}}}
	k := &job.Job{Inputs: []job.File{{Source: fileURL(filepath.Join(remote, "ok")), Destination: fileURL(filepath.Join(s.dir, "out", "ok"))}}}
	rj, rk := s.submit(j), s.submit(k)
	ev := s.wait(rj.JobID, 30*time.Second)
	f := ev.Files[0]
	if f.State != dtr.Error || f.Attempts != 2 || f.Error == nil || f.Error.Kind != dtr.ErrTransferSpeed {
		t.Fatalf("stalled transfer ended %s after %d attempts: %+v; want ERROR (TRANSFER_SPEED) after 2", f.State, f.Attempts, f.Error)
	}
	mustContain(t, "error", f.Error.Text, "no data moved", "max inactivity")
	// The single slot was freed: the other job got through.
	if ev := s.wait(rk.JobID, 30*time.Second); ev.State != api.JobFinished {
		t.Fatalf("the job behind the stalled transfer %s", ev.State)
	}
}

func TestControlRequestsChangeWhatTheySayAndRefuseBadInput(t *testing.T) {
	cfg := testConfig()
	cfg.MaxDelivery, cfg.MaxEmergency = 1, 0
	s := start(t, cfg)
	remote := filepath.Join(s.dir, "remote")
	base, release := heldStore(t, remote)
	j := &job.Job{ID: "controlled"}
	for i := 0; i < 6; i++ {
		writeFile(t, filepath.Join(remote, fmt.Sprint(i)), 500, i)
		j.Inputs = append(j.Inputs, job.File{Source: fmt.Sprintf("%s/%d", base, i), Destination: fileURL(filepath.Join(s.dir, "out", fmt.Sprint(i)))})
	}
	r := s.submit(j)
	// Wait until one transfers and the others queue behind it.
	var why struct {
		DTR dtr.DTR
		Why *struct {
			Position, Queued, Slots int
			Reason                  string
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	var waiting uuid.UUID // a DTR queued behind the one transfer
find:
	for {
		for _, id := range r.DTRs {
			if err := s.request(api.SubjectDTR, []byte(id.String()), nil, &why); err != nil {
				continue // not yet taken from the submit stream
			}
			if why.DTR.State == dtr.Transfer && why.Why != nil && why.Why.Queued == 5 {
				waiting = id
				break find
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no DTR queued for transfer behind the first: %+v", why)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if why.Why.Position >= why.Why.Queued || why.Why.Slots != 1 || !strings.Contains(why.Why.Reason, "uses all its 1 of 1 slots") {
		t.Fatalf("why: %+v", *why.Why)
	}

	bad := []struct {
		name, subject, body, want string
	}{
		{"priority above 100", api.SubjectPriority, fmt.Sprintf(`{"dtr":%q,"priority":101}`, waiting), "outside 1–100"},
		{"priority of an unknown DTR", api.SubjectPriority, fmt.Sprintf(`{"dtr":%q,"priority":50}`, uuid.New()), "unknown DTR"},
		{"malformed priority request", api.SubjectPriority, `{"dtr":`, "malformed request"},
		{"unknown field", api.SubjectPriority, fmt.Sprintf(`{"dtr":%q,"prio":5}`, waiting), `unknown field "prio"`},
		{"cancel naming nothing", api.SubjectCancel, `{}`, "either a dtr or a job"},
		{"cancel of an empty job id", api.SubjectCancel, `{"job":""}`, "either a dtr or a job"},
		{"share priority out of range", api.SubjectReconfigure, `{"sharepriority":{"_default":200}}`, "outside 1–100"},
		{"reconfigure without priorities", api.SubjectReconfigure, `{}`, "sharepriority is missing"},
	}
	for _, tt := range bad {
		var out any
		err := s.request(tt.subject, []byte(tt.body), nil, &out)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Fatalf("%s: got %v, want an error mentioning %q", tt.name, err, tt.want)
		}
	}
	// None of that changed anything.
	if err := s.request(api.SubjectDTR, []byte(waiting.String()), nil, &why); err != nil || why.DTR.Priority != 25 {
		t.Fatalf("after bad requests the DTR has priority %d (%v), want 25", why.DTR.Priority, err)
	}

	var pr struct{ DTR dtr.DTR }
	if err := s.request(api.SubjectPriority, []byte(fmt.Sprintf(`{"dtr":%q,"priority":99}`, waiting)), nil, &pr); err != nil || pr.DTR.Priority != 99 {
		t.Fatalf("priority change: %v, priority %d", err, pr.DTR.Priority)
	}
	if err := s.request(api.SubjectDTR, []byte(waiting.String()), nil, &why); err != nil || why.Why.Position != 0 {
		t.Fatalf("after the change the DTR is at position %d, want 0 (%v)", why.Why.Position, err)
	}
	var shares struct{ Shares []struct{ Share string } }
	if err := s.request(api.SubjectReconfigure, []byte(`{"sharepriority":{"_default":70}}`), nil, &shares); err != nil {
		t.Fatal(err)
	}
	var c struct{ Cancelled int }
	if err := s.request(api.SubjectCancel, []byte(fmt.Sprintf(`{"dtr":%q}`, r.DTRs[4])), nil, &c); err != nil || c.Cancelled != 1 {
		t.Fatalf("cancel DTR: %v, %d", err, c.Cancelled)
	}
	if err := s.request(api.SubjectCancel, []byte(`{"job":"controlled"}`), nil, &c); err != nil || c.Cancelled < 1 {
		t.Fatalf("cancel job: %v, %d", err, c.Cancelled)
	}
	release()
	ev := s.wait(r.JobID, 30*time.Second)
	counts := map[dtr.State]int{}
	for _, f := range ev.Files {
		counts[f.State]++
		if f.State == dtr.Cancelled {
			if _, err := os.Stat(strings.TrimPrefix(f.Destination, "file://")); err == nil {
				t.Fatalf("cancelled %s left its destination", f.Destination)
			}
		}
	}
	if counts[dtr.Cancelled] < 5 || counts[dtr.Cancelled]+counts[dtr.Done] != 6 {
		t.Fatalf("final states %v, want at least 5 cancelled", counts)
	}
	if sh := s.shares().Shares; len(sh) != 0 {
		t.Fatalf("slots still held: %+v", sh)
	}
}

func TestStagedSourcesAreCopiedPinnedWithinMaxPreparedAndReleased(t *testing.T) {
	cfg := testConfig()
	cfg.MaxPrepared = 2
	cfg.MaxDelivery = 1
	stage := t.TempDir()
	cfg.Processor.StageDir = stage
	s := start(t, cfg)
	remote := filepath.Join(s.dir, "remote")
	base, gets := countingStore(t, remote)
	const n = 12
	j := &job.Job{}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("tape-%02d", i)
		writeFile(t, filepath.Join(remote, name), 200000+i, i)
		j.Inputs = append(j.Inputs, job.File{Source: base + "/" + name,
			Destination: fileURL(filepath.Join(s.dir, "out", name)), Stage: true})
	}
	// Watch the staging area: it never holds more than maxprepared copies.
	done := make(chan struct{})
	most := 0
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if es, err := os.ReadDir(stage); err == nil && len(es) > most {
				most = len(es)
			}
		}
	}()
	ev := s.wait(s.submit(j).JobID, 2*time.Minute)
	close(done)
	if ev.State != api.JobFinished {
		t.Fatalf("job %s: %v", ev.State, ev.Failures)
	}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("tape-%02d", i)
		want, _ := os.ReadFile(filepath.Join(remote, name))
		if got, _ := os.ReadFile(filepath.Join(s.dir, "out", name)); !bytes.Equal(got, want) {
			t.Fatalf("%s differs from its source", name)
		}
		if n := gets("/" + name); n != 1 {
			t.Errorf("%s was read %d times from its source, want once (by staging; delivery reads the staged copy)", name, n)
		}
	}
	if most > cfg.MaxPrepared {
		t.Errorf("the staging area held %d copies at once, want at most maxprepared = %d", most, cfg.MaxPrepared)
	}
	if most == 0 {
		t.Error("nothing was ever staged")
	}
	if es, _ := os.ReadDir(stage); len(es) != 0 {
		t.Errorf("%d staged copies left after the job, want every one released", len(es))
	}
}

func TestDIRACPolicyGivesEachUserOfAGroupAShareAndFinishesTheJobs(t *testing.T) {
	cfg := testConfig()
	cfg.Policy, cfg.SharePolicy = "dirac", "voms:vo"
	cfg.DIRACGroups, cfg.DIRACSlices = "prod=100:sharing,user=50", "1h:1:5"
	cfg.MaxDelivery = 2
	s := start(t, cfg)
	remote := filepath.Join(s.dir, "remote")
	store := httpstore.Handler(remote)
	base := httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			time.Sleep(50 * time.Millisecond) // slow enough for queues to form
		}
		store.ServeHTTP(w, r)
	}))
	var ids []string
	for _, user := range []string{"alice", "bob"} {
		j := &job.Job{Owner: dtr.Identity{DN: "/CN=" + user, FQANs: []string{"/user"}}}
		for i := 0; i < 15; i++ {
			name := fmt.Sprintf("%s-%02d", user, i)
			writeFile(t, filepath.Join(remote, name), 5000+i, i)
			j.Inputs = append(j.Inputs, job.File{Source: base + "/" + name, Destination: fileURL(filepath.Join(s.dir, "out", name))})
		}
		ids = append(ids, s.submit(j).JobID)
	}
	seen := map[string]int64{}
	deadline := time.Now().Add(10 * time.Second)
	for len(seen) < 2 && time.Now().Before(deadline) {
		for _, sh := range s.shares().Shares {
			if sh.State == dtr.Transfer {
				seen[sh.Share] = sh.Weight
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, id := range ids {
		if ev := s.wait(id, time.Minute); ev.State != api.JobFinished {
			t.Fatalf("job %s: %s %v", id, ev.State, ev.Failures)
		}
	}
	a, b := "user|/CN=alice-download", "user|/CN=bob-download"
	if _, ok := seen[a]; !ok {
		t.Fatalf("transfer shares seen %v, want one per user of the group: %s and %s", seen, a, b)
	}
	if _, ok := seen[b]; !ok {
		t.Fatalf("transfer shares seen %v, want one per user of the group: %s and %s", seen, a, b)
	}
}

func TestFileRootsConfineLocalFilesAndSayWhy(t *testing.T) {
	cfg := testConfig()
	root := t.TempDir()
	cfg.FileRoots = []string{root}
	s := start(t, cfg)
	outside := t.TempDir()
	writeFile(t, filepath.Join(root, "in"), 5000, 1)
	writeFile(t, filepath.Join(outside, "secret"), 100, 2)
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	// A path outside the roots is refused when the job is submitted.
	for _, f := range []job.File{
		{Source: fileURL(filepath.Join(outside, "secret")), Destination: fileURL(filepath.Join(root, "out", "secret"))},
		{Source: fileURL(filepath.Join(root, "in")), Destination: fileURL(filepath.Join(outside, "planted"))},
	} {
		b, _ := json.Marshal(&job.Job{Inputs: []job.File{f}})
		var reply api.SubmitReply
		err := s.request(api.SubjectJobSubmit, b, nil, &reply)
		if err == nil || !strings.Contains(err.Error(), "is not under SLUICE_FILE_ROOTS") {
			t.Fatalf("a job copying %s to %s: %v, want a refusal naming SLUICE_FILE_ROOTS", f.Source, f.Destination, err)
		}
	}
	// A symbolic link inside a root that leads out of it is refused by the
	// worker that opens it.
	j := &job.Job{Inputs: []job.File{
		{Source: fileURL(filepath.Join(root, "in")), Destination: fileURL(filepath.Join(root, "out", "in"))},
		{Source: fileURL(filepath.Join(root, "link")), Destination: fileURL(filepath.Join(root, "out", "link")), FailureAllowed: true},
	}}
	ev := s.wait(s.submit(j).JobID, time.Minute)
	byDst := map[string]api.FileStat{}
	for _, f := range ev.Files {
		byDst[f.Destination] = f
	}
	if f := byDst[fileURL(filepath.Join(root, "out", "in"))]; f.State != dtr.Done {
		t.Fatalf("the file within the root: %s %+v", f.State, f.Error)
	}
	f := byDst[fileURL(filepath.Join(root, "out", "link"))]
	if f.State != dtr.Error || f.Error == nil || f.Error.Kind != dtr.ErrLocalFile || f.Attempts != 1 {
		t.Fatalf("the link out of the root: %s after %d attempts, %+v; want ERROR, LOCAL_FILE, no retry", f.State, f.Attempts, f.Error)
	}
	mustContain(t, "error", f.Error.Text, "outside the allowed file roots")
	if _, err := os.Stat(filepath.Join(outside, "planted")); err == nil {
		t.Fatal("a file was written outside the roots")
	}
}

func TestATransferBelowTheMinimumSpeedFailsAndIsRetried(t *testing.T) {
	cfg := testConfig()
	cfg.MaxTransferTries = 2
	cfg.Delivery.MinSpeed, cfg.Delivery.MinSpeedTime = 200000, 2*time.Second
	s := start(t, cfg)
	var gets atomic.Int32
	base := httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "10000000")
		if r.Method != http.MethodGet {
			return
		}
		gets.Add(1)
		for { // 20 KB/s: data keeps coming, too slowly
			if _, err := w.Write(make([]byte, 1000)); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}))
	j := &job.Job{Inputs: []job.File{{Source: base + "/slow", Destination: fileURL(filepath.Join(s.dir, "out", "slow"))}}}
	ev := s.wait(s.submit(j).JobID, time.Minute)
	f := ev.Files[0]
	if f.State != dtr.Error || f.Attempts != 2 || f.Error == nil || f.Error.Kind != dtr.ErrTransferSpeed {
		t.Fatalf("slow transfer ended %s after %d attempts: %+v; want ERROR (TRANSFER_SPEED) after 2", f.State, f.Attempts, f.Error)
	}
	mustContain(t, "error", f.Error.Text, "below the minimum speed of 200000 B/s")
	if gets.Load() != 2 {
		t.Fatalf("%d GETs, want one per attempt", gets.Load())
	}
	if _, err := os.Stat(filepath.Join(s.dir, "out", "slow")); err == nil {
		t.Fatal("the partial file was left at the destination")
	}
}

func TestCancelStopsARunningTransferDeletesThePartialFileAndFreesTheSlot(t *testing.T) {
	s := start(t, testConfig())
	started, stopped := make(chan struct{}), make(chan time.Time, 1)
	var once sync.Once
	base := httpServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100000000")
		if r.Method != http.MethodGet {
			return
		}
		once.Do(func() { close(started) })
		for { // an endless slow stream
			if _, err := w.Write(make([]byte, 4096)); err != nil {
				break
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-time.After(20 * time.Millisecond):
				continue
			}
			break
		}
		stopped <- time.Now()
	}))
	out := filepath.Join(s.dir, "out")
	r := s.submit(&job.Job{Inputs: []job.File{{Source: base + "/big", Destination: fileURL(filepath.Join(out, "big"))}}})
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the transfer did not start")
	}
	time.Sleep(300 * time.Millisecond) // some bytes are on disk
	asked := time.Now()
	var c struct{ Cancelled int }
	if err := s.request(api.SubjectCancel, []byte(fmt.Sprintf(`{"dtr":%q}`, r.DTRs[0])), nil, &c); err != nil || c.Cancelled != 1 {
		t.Fatalf("cancel: %v, %d", err, c.Cancelled)
	}
	select {
	case at := <-stopped:
		// Measured, not asserted to the millisecond (the machine is shared):
		// docs/bad-input.md quotes it.
		t.Logf("the transfer stopped %s after the cancel request", at.Sub(asked).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("the transfer was still running 10 s after the cancel")
	}
	ev := s.wait(r.JobID, 30*time.Second)
	if f := ev.Files[0]; f.State != dtr.Cancelled {
		t.Fatalf("DTR ended %s, want CANCELLED", f.State)
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Fatalf("left in the destination directory: %v", entries)
	}
	if sh := s.shares().Shares; len(sh) != 0 {
		t.Fatalf("slots still held: %+v", sh)
	}
}

func TestJobMovesFilesToAndFromS3(t *testing.T) {
	backend := s3mem.New()
	if err := backend.CreateBucket("results"); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(srv.Close)
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("sluice sluice-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	cfg := testConfig()
	cfg.S3Credentials = host + "=" + keys
	s := start(t, cfg)
	var up job.Job
	for i := 0; i < 20; i++ {
		src := filepath.Join(s.dir, "session", fmt.Sprintf("out-%02d", i))
		writeFile(t, src, 10000+i*997, i)
		up.Outputs = append(up.Outputs, job.File{Source: fileURL(src), Destination: fmt.Sprintf("s3://%s/results/run-1/out-%02d", host, i)})
	}
	if ev := s.wait(s.submit(&up).JobID, time.Minute); ev.State != api.JobFinished {
		t.Fatalf("upload job %s: %v", ev.State, ev.Failures)
	}
	var down job.Job
	for i := 0; i < 20; i++ {
		sum, _ := checksum.File(filepath.Join(s.dir, "session", fmt.Sprintf("out-%02d", i)), "sha256")
		down.Inputs = append(down.Inputs, job.File{Source: fmt.Sprintf("s3://%s/results/run-1/out-%02d", host, i),
			Destination: fileURL(filepath.Join(s.dir, "back", fmt.Sprintf("out-%02d", i))), Checksum: sum})
	}
	down.Inputs = append(down.Inputs, job.File{Source: "s3://" + host + "/results/no-such-object",
		Destination: fileURL(filepath.Join(s.dir, "back", "missing")), FailureAllowed: true})
	ev := s.wait(s.submit(&down).JobID, time.Minute)
	if ev.State != api.JobFinished || ev.Done != 20 {
		t.Fatalf("download job %s with %d done: %v", ev.State, ev.Done, ev.Failures)
	}
	for _, f := range ev.Files {
		if strings.HasSuffix(f.Source, "no-such-object") {
			if f.State != dtr.Error || f.Error == nil || f.Error.Kind != dtr.ErrPermanentRemote || f.Attempts != 1 {
				t.Fatalf("a missing object ended %s after %d attempts: %+v", f.State, f.Attempts, f.Error)
			}
			continue
		}
		want, _ := os.ReadFile(filepath.Join(s.dir, "session", filepath.Base(f.Destination)))
		if got, _ := os.ReadFile(strings.TrimPrefix(f.Destination, "file://")); !bytes.Equal(got, want) {
			t.Fatalf("%s came back different", f.Destination)
		}
	}
}

func TestAFileWithReplicasComesFromTheFirstThatWorksInOneAttempt(t *testing.T) {
	cfg := testConfig()
	cfg.PreferredPattern = "127.0.0.1"
	s := start(t, cfg)
	remote := filepath.Join(s.dir, "remote")
	writeFile(t, filepath.Join(remote, "data"), 70000, 3)
	store := httpstore.Handler(remote)
	var mu sync.Mutex
	hits := map[string]int{}
	handler := func(name string, status int) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			hits[name]++
			mu.Unlock()
			if status != 0 {
				http.Error(w, "no", status)
				return
			}
			store.ServeHTTP(w, r)
		})
	}
	gone := httpServer(t, handler("gone", http.StatusNotFound))
	down := httpServer(t, handler("down", http.StatusServiceUnavailable))
	good := httpServer(t, handler("good", 0))
	// The listed order is gone, down, good; "localhost" URLs sort after
	// the preferred 127.0.0.1 ones.
	goneURL := strings.Replace(gone, "127.0.0.1", "localhost", 1) + "/data"
	j := &job.Job{Inputs: []job.File{{Source: goneURL, Replicas: []string{down + "/data", good + "/data"},
		Destination: fileURL(filepath.Join(s.dir, "out", "data"))}}}
	ev := s.wait(s.submit(j).JobID, time.Minute)
	f := ev.Files[0]
	if f.State != dtr.Done || f.Attempts != 1 {
		t.Fatalf("ended %s after %d attempts (%+v); want DONE after 1", f.State, f.Attempts, f.Error)
	}
	want, _ := os.ReadFile(filepath.Join(remote, "data"))
	if got, _ := os.ReadFile(filepath.Join(s.dir, "out", "data")); !bytes.Equal(got, want) {
		t.Fatal("the file differs from the source")
	}
	mu.Lock()
	defer mu.Unlock()
	if hits["down"] == 0 || hits["good"] == 0 || hits["gone"] != 0 {
		t.Fatalf("requests per replica %v: want the preferred ones tried first, down then good, and gone never", hits)
	}
}

func TestTheCacheServesAFileWantedAgainWithoutTransferringIt(t *testing.T) {
	cfg := testConfig()
	cache := t.TempDir()
	cfg.CacheDir = cache
	cfg.Processor.CacheMaxBytes, cfg.Processor.CacheCleanEvery, cfg.Processor.CacheMinAge = 1, 50*time.Millisecond, 3*time.Second
	s := start(t, cfg)
	remote := filepath.Join(s.dir, "remote")
	base, gets := countingStore(t, remote)
	for i := 0; i < 5; i++ {
		writeFile(t, filepath.Join(remote, fmt.Sprintf("f%d", i)), 30000+i*1000, i)
	}
	job1 := &job.Job{}
	job2 := &job.Job{}
	for i := 0; i < 5; i++ {
		src := fmt.Sprintf("%s/f%d", base, i)
		job1.Inputs = append(job1.Inputs,
			job.File{Source: src, Destination: fileURL(filepath.Join(s.dir, "job1", fmt.Sprintf("f%d", i)))},
			job.File{Source: src, Destination: fileURL(filepath.Join(s.dir, "job1", fmt.Sprintf("again%d", i)))})
		job2.Inputs = append(job2.Inputs, job.File{Source: src, Destination: fileURL(filepath.Join(s.dir, "job2", fmt.Sprintf("f%d", i)))})
	}
	// A lock left on f3 by a downloader that died an hour ago is broken.
	sum := sha1.Sum([]byte(base + "/f3"))
	h := hex.EncodeToString(sum[:])
	stale := filepath.Join(cache, "data", h[:2], h[2:]+".lock")
	if err := os.MkdirAll(filepath.Dir(stale), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stale, []byte("a grant long gone\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hourAgo := time.Now().Add(-time.Hour)
	if err := os.Chtimes(stale, hourAgo, hourAgo); err != nil {
		t.Fatal(err)
	}
	if ev := s.wait(s.submit(job1).JobID, time.Minute); ev.State != api.JobFinished {
		for _, f := range ev.Files {
			t.Logf("%s: %s attempts %d error %+v", f.Destination, f.State, f.Attempts, f.Error)
		}
		t.Fatalf("job 1 %s: %v", ev.State, ev.Failures)
	}
	if ev := s.wait(s.submit(job2).JobID, time.Minute); ev.State != api.JobFinished {
		t.Fatalf("job 2 %s: %v", ev.State, ev.Failures)
	}
	for i := 0; i < 5; i++ {
		if n := gets(fmt.Sprintf("/f%d", i)); n != 1 {
			t.Errorf("f%d was fetched %d times for three DTRs, want once", i, n)
		}
	}
	for i := 0; i < 5; i++ {
		want, _ := os.ReadFile(filepath.Join(remote, fmt.Sprintf("f%d", i)))
		for _, p := range []string{"job1/f%d", "job1/again%d", "job2/f%d"} {
			if got, _ := os.ReadFile(filepath.Join(s.dir, fmt.Sprintf(p, i))); !bytes.Equal(got, want) {
				t.Fatalf("%s differs from its source", fmt.Sprintf(p, i))
			}
		}
	}
	// Served from one cache entry: the files are hard links of each other.
	a, _ := os.Stat(filepath.Join(s.dir, "job1", "f0"))
	b, _ := os.Stat(filepath.Join(s.dir, "job2", "f0"))
	if a == nil || b == nil || !os.SameFile(a, b) {
		t.Error("job1/f0 and job2/f0 are not links of one cache entry")
	}
	// The cache holds more than its 1-byte limit: it is cleaned, and the
	// jobs' files, hard links, stay.
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := 0
		_ = filepath.WalkDir(filepath.Join(cache, "data"), func(p string, de os.DirEntry, err error) error {
			if err == nil && !de.IsDir() && filepath.Ext(p) != ".lock" {
				n++
			}
			return nil
		})
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d cache entries left, want the cache cleaned to its limit", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(s.dir, "job2", "f0")); err != nil {
		t.Fatalf("cleaning the cache removed a job's file: %v", err)
	}
}
