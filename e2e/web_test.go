package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
	"github.com/sluice-dtr/sluice/services/scheduler"
)

// chromium returns the headless browser to test the web page with.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("SKIPPED: no chromium on this machine (Debian: apt-get install chromium); .ci/run installs it")
	return ""
}

func TestTheWebPageShowsWhatTheAPISays(t *testing.T) {
	browser := chromium(t)
	cfg := testConfig()
	cfg.SharePolicy, cfg.SharePriority = "voms:vo", "atlas=60,cms=40"
	cfg.MaxDelivery, cfg.MaxEmergency = 5, 0
	cfg.Lease = time.Hour
	s := start(t, cfg, "generator", "processor", "delivery")

	// The scheduler serves the page.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	scfg := s.cfg
	scfg.HTTP = ln
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- app.Run(ctx, scfg, []string{"scheduler"}, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("scheduler: %v", err)
		}
	})
	base := "http://" + ln.Addr().String()

	mkjob := func(name, fqan string, n, size int) *job.Job {
		j := &job.Job{Name: name, Owner: dtr.Identity{DN: "/CN=" + name, FQANs: []string{fqan}}}
		for i := 0; i < n; i++ {
			src := filepath.Join(s.dir, "in", name, fmt.Sprint(i))
			writeFile(t, src, size, i)
			j.Inputs = append(j.Inputs, job.File{Source: fileURL(src), Destination: fileURL(filepath.Join(s.dir, "out", name, fmt.Sprint(i)))})
		}
		return j
	}
	// First some throughput for the plot and a job that fails (a missing
	// source), then, with no deliverer, two jobs whose transfers hold every
	// slot and queue behind them: a page that holds still.
	warmup := s.submit(mkjob("warmup", "/atlas", 30, 1<<20))
	failing := mkjob("failing", "/cms", 0, 0)
	failing.Inputs = append(failing.Inputs, job.File{Source: "file:///sluice-test/missing", Destination: fileURL(filepath.Join(s.dir, "out", "missing"))})
	failed := s.submit(failing)
	if ev := s.wait(warmup.JobID, time.Minute); ev.State != "finished" {
		t.Fatalf("warm-up job %s", ev.State)
	}
	if ev := s.wait(failed.JobID, time.Minute); ev.State != "failed" {
		t.Fatalf("the job with a missing source %s", ev.State)
	}
	s.stopRole("delivery")
	s.submit(mkjob("atlasjob", "/atlas", 20, 100))
	s.submit(mkjob("cmsjob", "/cms", 20, 100))
	var ov scheduler.Overview
	deadline := time.Now().Add(time.Minute)
	for {
		ov = overview(t, base)
		running, queued := 0, 0
		for _, l := range ov.Shares {
			if l.State == dtr.Transfer {
				running += l.Running
				queued += l.Queued
			}
		}
		// The longest waits are sampled once a second: a sample taken while
		// the last DTRs were still on their way to the transfer queue can
		// differ from the next, so the page holds still only once a sample
		// taken after everything queued says the same.
		if running == 5 && queued == 35 && len(ov.Longest) == 10 {
			time.Sleep(1500 * time.Millisecond)
			if again := overview(t, base); longestIDs(again) == longestIDs(ov) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("transfers: %d running, %d queued, %d longest; want 5, 35, 10", running, queued, len(ov.Longest))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The processor's two pools are heard from within a heartbeat (their
	// first may have come before the scheduler listened).
	for deadline := time.Now().Add(15 * time.Second); len(overview(t, base).Workers) != 2; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("workers in the overview: %+v", overview(t, base).Workers)
		}
	}
	dom := runChromium(t, browser, "--virtual-time-budget=5000", "--dump-dom", base+"/")
	page, err := html.Parse(strings.NewReader(dom))
	if err != nil {
		t.Fatal(err)
	}
	if rendered := attr(find(page, "body", nil)[0], "data-rendered"); rendered == "" {
		t.Fatalf("the page never rendered the overview:\n%s", dom)
	}
	ov = overview(t, base) // the same figures: nothing moves now

	// Every share row holds the API's figures.
	rows := find(page, "tr", func(n *html.Node) bool { return attr(n, "data-share") != "" && attr(n, "data-state") != "" })
	if len(rows) != len(ov.Shares) {
		t.Fatalf("%d share rows on the page, %d shares in the API", len(rows), len(ov.Shares))
	}
	for _, l := range ov.Shares {
		row := find(page, "tr", func(n *html.Node) bool {
			return attr(n, "data-share") == l.Share && attr(n, "data-state") == l.State.String()
		})
		if len(row) != 1 {
			t.Fatalf("share %s in %s: %d rows", l.Share, l.State, len(row))
		}
		for field, want := range map[string]string{
			"priority": strconv.Itoa(l.Priority), "weight": strconv.FormatInt(l.Weight, 10),
			"queued": strconv.Itoa(l.Queued), "running": strconv.Itoa(l.Running), "slots": strconv.Itoa(l.Slots),
			"configured": strconv.FormatFloat(l.Configured, 'f', 1, 64),
		} {
			if got := field1(row[0], field); got != want {
				t.Errorf("share %s in %s: %s shows %q, the API says %q", l.Share, l.State, field, got, want)
			}
		}
	}
	// The split: atlas 60 and cms 40 of 5 slots.
	for _, l := range ov.Shares {
		if l.State == dtr.Transfer && l.Running+l.Queued == 20 {
			want := map[string]float64{"atlas-download": 3, "cms-download": 2}[l.Share]
			if l.Configured != want {
				t.Errorf("share %s configured for %.1f of 5 transfer slots, want %.1f", l.Share, l.Configured, want)
			}
		}
	}
	// The longest waits, in the API's order, each with its reason.
	var shown []string
	for _, n := range find(page, "tr", func(n *html.Node) bool { return attr(n, "data-dtr") != "" }) {
		shown = append(shown, attr(n, "data-dtr"))
		if field1(n, "reason") == "" {
			t.Errorf("DTR %s is shown with no reason", attr(n, "data-dtr"))
		}
	}
	if strings.Join(shown, " ") != longestIDs(ov) {
		t.Errorf("longest waits on the page %v, in the API %v", shown, longestIDs(ov))
	}
	// Both plots hold the history.
	for _, id := range []string{"throughput", "fairness"} {
		div := find(page, "div", func(n *html.Node) bool { return attr(n, "id") == id })
		svg := find(div[0], "svg", nil)
		if len(svg) != 1 || attr(svg[0], "data-points") == "0" {
			t.Errorf("plot %s has no points", id)
		}
	}
	var moved bool
	for _, smp := range ov.History {
		moved = moved || smp.Bytes["atlas-download"] > 0
	}
	if !moved {
		t.Errorf("no throughput in the history: %+v", ov.History)
	}

	checkJobsFailuresTotalsAndZones(t, page, ov, warmup.JobID, failed.JobID, failed.DTRs[0].String())
	checkDTRDetail(t, browser, base, failed.DTRs[0].String(), ov.Longest[0].DTR.String())
	checkWorkersPanel(t, browser, base)

	shot := os.Getenv("SLUICE_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "sluice-web.png")
	}
	runChromium(t, browser, "--virtual-time-budget=5000", "--window-size=1280,2300", "--screenshot="+shot, base+"/")
	if st, err := os.Stat(shot); err != nil || st.Size() < 10000 {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	t.Logf("screenshot of the page: %s", shot)
}

// zoned is a time as the page shows it: with its zone.
var zoned = regexp.MustCompile(`^(\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2} (UTC|[+-]\d{2}:\d{2})$`)

// checkJobsFailuresTotalsAndZones checks the jobs tables (a finished and a
// failed job, asked of the generator), the failures grouped by reason,
// the totals, and that every time carries its zone.
func checkJobsFailuresTotalsAndZones(t *testing.T, page *html.Node, ov scheduler.Overview, finishedJob, failedJob, failedDTR string) {
	t.Helper()
	byID := func(id string) *html.Node {
		n := find(page, "*", func(n *html.Node) bool { return attr(n, "id") == id })
		if len(n) != 1 {
			t.Fatalf("%d elements #%s", len(n), id)
		}
		return n[0]
	}
	if st := text(byID("jobs-status")); st != "" {
		t.Errorf("the jobs say: %s", st)
	}
	row := func(table, job string) *html.Node {
		rows := find(byID(table), "tr", func(n *html.Node) bool { return attr(n, "data-job") == job })
		if len(rows) != 1 {
			t.Fatalf("job %s: %d rows in %s:\n%s", job, len(rows), table, text(byID(table)))
		}
		return rows[0]
	}
	fin := row("jobs-finished", finishedJob)
	if field1(fin, "state") != "finished" || field1(fin, "done") != "30" || field1(fin, "total") != "30" || field1(fin, "name") != "warmup" {
		t.Errorf("the finished job shows %q", text(fin))
	}
	fail := row("jobs-failed", failedJob)
	if field1(fail, "state") != "failed" || field1(fail, "failed") != "1" || field1(fail, "total") != "1" {
		t.Errorf("the failed job shows %q", text(fail))
	}
	for _, r := range []*html.Node{fin, fail} {
		for _, f := range []string{"created", "ended"} {
			if v := field1(r, f); !zoned.MatchString(v) {
				t.Errorf("job %s: %s %q", attr(r, "data-job"), f, v)
			}
		}
	}
	if rows := find(byID("jobs-running"), "tr", func(n *html.Node) bool { return attr(n, "data-job") != "" }); len(rows) != 2 {
		t.Errorf("%d running jobs shown, want 2 (atlasjob and cmsjob)", len(rows))
	}

	// The failed DTR in its group, with its reason.
	if len(ov.Failures) != 1 || ov.FailuresKept != 1 || ov.Failures[0].Latest.DTR.String() != failedDTR {
		t.Fatalf("the overview's failures: %+v", ov.Failures)
	}
	g := ov.Failures[0]
	groups := find(byID("failures"), "tr", func(n *html.Node) bool { return attr(n, "data-reason") != "" })
	if len(groups) != 1 {
		t.Fatalf("%d failure groups on the page", len(groups))
	}
	if attr(groups[0], "data-kind") != string(g.Kind) || field1(groups[0], "reason") != g.Reason || field1(groups[0], "count") != "1" ||
		!strings.Contains(field1(groups[0], "example"), g.Latest.Text) || g.Reason == "" {
		t.Errorf("the failure group shows %q; the API says %s %q", text(groups[0]), g.Kind, g.Reason)
	}
	if links := find(groups[0], "a", func(n *html.Node) bool { return attr(n, "data-dtr-link") == failedDTR }); len(links) == 0 ||
		attr(links[0], "href") != "#dtr="+failedDTR {
		t.Errorf("the failed DTR %s has no link to its detail", failedDTR)
	}

	// The totals: what the API says, the failure among them.
	tt := ov.Totals
	if tt.Done < 30 || tt.Failed != 1 || tt.Bytes < 30<<20 {
		t.Errorf("totals %+v", tt)
	}
	totals := find(byID("totals"), "tr", func(n *html.Node) bool { return len(find(n, "td", nil)) > 0 })[0]
	for f, want := range map[string]string{"done": strconv.FormatUint(tt.Done, 10), "failed": "1", "cancelled": strconv.FormatUint(tt.Cancelled, 10)} {
		if got := field1(totals, f); got != want {
			t.Errorf("totals: %s shows %q, want %q", f, got, want)
		}
	}
	if got := field1(totals, "bytes"); !strings.HasSuffix(got, "MB") {
		t.Errorf("totals: moved %q", got)
	}
	for _, span := range []string{"last_minute", "since_start"} {
		r := find(byID("rates"), "tr", func(n *html.Node) bool { return attr(n, "data-span") == span })
		if len(r) != 1 {
			t.Fatalf("no rate %s", span)
		}
		if v, err := strconv.ParseFloat(field1(r[0], "dtrs"), 64); err != nil || span == "since_start" && v <= 0 {
			t.Errorf("rate %s: %q DTRs/s", span, field1(r[0], "dtrs"))
		}
	}

	// Every time shown carries its zone, and the header names it.
	times := find(page, "time", nil)
	if len(times) < 10 {
		t.Errorf("%d times on the page", len(times))
	}
	for _, n := range times {
		if v := text(n); !zoned.MatchString(v) || attr(n, "datetime") == "" {
			t.Errorf("a time shows %q (datetime %q)", v, attr(n, "datetime"))
		}
	}
	if z := text(byID("zone")); z == "" || z == "…" {
		t.Errorf("the page's zone is %q", z)
	}
	// The workers: the processor's two pools (the deliverer stopped and
	// was forgotten), both heard from.
	panel := byID("workers-panel")
	rows := find(panel, "tr", func(n *html.Node) bool { return attr(n, "data-worker") != "" })
	if strings.Contains(attr(panel, "class"), "hidden") || len(ov.Workers) < 2 || len(rows) != len(ov.Workers) {
		t.Errorf("%d workers in the overview, %d shown (panel %q)", len(ov.Workers), len(rows), attr(panel, "class"))
	}
	for i, w := range ov.Workers {
		if i < len(rows) && (attr(rows[i], "data-worker") != w.ID || field1(rows[i], "status") != "alive" || field1(rows[i], "role") != w.Role+" ("+string(w.Stage)+")") {
			t.Errorf("worker %s (%s) shows %q", w.ID, w.Stage, text(rows[i]))
		}
	}
}

// checkDTRDetail opens the detail of a failed DTR (its link, #dtr=<id>) and
// of a waiting one, in a browser in another time zone.
func checkDTRDetail(t *testing.T, browser, base, failedDTR, waitingDTR string) {
	t.Helper()
	for _, tt := range []struct {
		id, from, why, state string
	}{
		{failedDTR, "", "DTR " + failedDTR + " is ERROR: it waits for nothing", "ERROR"},
		{waitingDTR, "scheduler", "DTR " + waitingDTR + " is TRANSFER in share ", "TRANSFER"},
	} {
		dom := runChromiumTZ(t, browser, "Asia/Kolkata", "--virtual-time-budget=5000", "--dump-dom", base+"/#dtr="+tt.id)
		page, err := html.Parse(strings.NewReader(dom))
		if err != nil {
			t.Fatal(err)
		}
		panel := find(page, "div", func(n *html.Node) bool { return attr(n, "id") == "dtr-detail" })
		if len(panel) != 1 || attr(panel[0], "data-dtr") != tt.id || attr(panel[0], "data-loaded") == "" || attr(panel[0], "data-loaded") == "error" {
			t.Fatalf("DTR %s: the detail did not open:\n%s", tt.id, dom)
		}
		if tt.from != "" && attr(panel[0], "data-loaded") != tt.from {
			t.Errorf("DTR %s found in %q, want %q", tt.id, attr(panel[0], "data-loaded"), tt.from)
		}
		why := find(panel[0], "pre", nil)
		if len(why) != 1 || !strings.HasPrefix(text(why[0]), tt.why) {
			t.Errorf("DTR %s: why %q, want it to start %q", tt.id, text(why[0]), tt.why)
		}
		// Its history: a timeline from its submission on.
		rows := find(panel[0], "tr", func(n *html.Node) bool { return attr(n, "data-seq") != "" })
		if len(rows) < 2 || attr(rows[0], "data-state") != "NEW" || attr(rows[len(rows)-1], "data-state") != tt.state {
			t.Errorf("DTR %s: its history has %d rows, want its submission in NEW first and %s last:\n%s", tt.id, len(rows), tt.state, text(panel[0]))
		}
		state := find(panel[0], "dd", func(n *html.Node) bool { return attr(n, "data-field") == "state" })
		if len(state) != 1 || text(state[0]) != tt.state {
			t.Errorf("DTR %s: the record's state is not %s:\n%s", tt.id, tt.state, text(panel[0]))
		}
		// Its trace id, where the DTR has a trace (with tracing set up).
		var api scheduler.WebDTR
		if resp, err := http.Get(base + "/api/dtr/" + tt.id); err != nil {
			t.Fatal(err)
		} else {
			err = json.NewDecoder(resp.Body).Decode(&api)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
		shown := ""
		if tr := find(panel[0], "dd", func(n *html.Node) bool { return attr(n, "data-field") == "trace_id" }); len(tr) == 1 {
			shown = text(tr[0])
		}
		if shown != api.TraceID {
			t.Errorf("DTR %s: trace id %q in its detail, %q in the API", tt.id, shown, api.TraceID)
		}
		if tt.state == "ERROR" {
			if e := find(panel[0], "dd", func(n *html.Node) bool { return attr(n, "data-field") == "error" }); len(e) != 1 || !strings.Contains(text(e[0]), "PERMANENT") && !strings.Contains(text(e[0]), "missing") {
				t.Errorf("DTR %s: the record's error: %s", tt.id, text(panel[0]))
			}
		}
		// In India's zone, times say +05:30.
		for _, n := range find(page, "time", nil) {
			if v := text(n); !strings.HasSuffix(v, " +05:30") {
				t.Errorf("a time in Asia/Kolkata shows %q", v)
			}
		}
		if z := find(page, "b", func(n *html.Node) bool { return attr(n, "id") == "zone" }); len(z) != 1 || !strings.HasSuffix(text(z[0]), "(UTC+05:30)") {
			t.Errorf("the zone in Asia/Kolkata is said %q", text(z[0]))
		}
	}
	// A DTR the scheduler never saw: the detail says so.
	unknown := "00000000-0000-4000-8000-000000000000"
	dom := runChromium(t, browser, "--virtual-time-budget=5000", "--dump-dom", base+"/#dtr="+unknown)
	if !strings.Contains(dom, "is not known to the scheduler") {
		t.Errorf("an unknown DTR's detail does not say it is unknown")
	}
}

// checkWorkersPanel shows the page an overview that has workers (as the
// worker heartbeats will give it): the panel lists them, a silent one
// marked.
func checkWorkersPanel(t *testing.T, browser, base string) {
	t.Helper()
	page, err := http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	index, _ := io.ReadAll(page.Body)
	page.Body.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(index) })
	mux.HandleFunc("GET /api/overview", func(w http.ResponseWriter, _ *http.Request) {
		var ov map[string]any
		resp, err := http.Get(base + "/api/overview")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&ov)
			resp.Body.Close()
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		now := time.Now().UTC()
		ov["workers"] = []map[string]any{
			{"id": "w1", "role": "delivery", "host": "node1", "pid": 41, "version": "v1", "grants": 3, "last_heartbeat": now, "silent": false},
			{"id": "w2", "role": "processor", "host": "node2", "pid": 42, "version": "v1", "grants": 1,
				"last_heartbeat": now.Add(-time.Minute), "silent": true, "lease_ends": now.Add(time.Minute)},
		}
		ov["silent"] = []map[string]any{{"dtr": "6ba7b810-9dad-11d1-80b4-00c04fd430c8", "grant": "g1", "share": "atlas-download", "state": "TRANSFERRING",
			"holder":     map[string]any{"worker": "w2", "role": "processor", "host": "node2", "pid": 42, "last_heartbeat": now.Add(-time.Minute), "silent": true},
			"lease_ends": now.Add(time.Minute)}}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(ov)
	})
	mux.HandleFunc("GET /api/", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":"not here"}`, http.StatusServiceUnavailable)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	dom, err := html.Parse(strings.NewReader(runChromium(t, browser, "--virtual-time-budget=3000", "--dump-dom", srv.URL+"/")))
	if err != nil {
		t.Fatal(err)
	}
	panel := find(dom, "div", func(n *html.Node) bool { return attr(n, "id") == "workers-panel" })
	if len(panel) != 1 || strings.Contains(attr(panel[0], "class"), "hidden") {
		t.Fatal("the workers panel is hidden with workers in the overview")
	}
	rows := find(panel[0], "tr", func(n *html.Node) bool { return attr(n, "data-worker") != "" })
	if len(rows) != 2 {
		t.Fatalf("%d worker rows, want 2", len(rows))
	}
	if field1(rows[0], "host") != "node1" || field1(rows[0], "grants") != "3" || field1(rows[0], "status") != "alive" ||
		!zoned.MatchString(field1(rows[0], "last_heartbeat")) {
		t.Errorf("worker w1 shows %q", text(rows[0]))
	}
	if attr(rows[1], "class") != "silent" || field1(rows[1], "status") != "silent" || !zoned.MatchString(field1(rows[1], "lease_ends")) {
		t.Errorf("the silent worker w2 shows %q", text(rows[1]))
	}
	// Its grant, with a link to the DTR's detail and when it was last heard.
	silent := find(dom, "tr", func(n *html.Node) bool { return attr(n, "data-silent-dtr") != "" })
	if len(silent) != 1 || len(find(silent[0], "a", func(n *html.Node) bool { return attr(n, "href") == "#dtr=6ba7b810-9dad-11d1-80b4-00c04fd430c8" })) != 1 ||
		len(find(silent[0], "time", nil)) != 1 {
		t.Errorf("the silent worker's grant: %d rows", len(silent))
	}
}

// text is the text under n.
func text(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return strings.TrimSpace(b.String())
}

// longestIDs is the overview's longest-waiting DTRs, in order.
func longestIDs(ov scheduler.Overview) string {
	var ids []string
	for _, w := range ov.Longest {
		ids = append(ids, w.DTR.String())
	}
	return strings.Join(ids, " ")
}

func overview(t *testing.T, base string) scheduler.Overview {
	t.Helper()
	resp, err := http.Get(base + "/api/overview")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ov scheduler.Overview
	if err := json.NewDecoder(resp.Body).Decode(&ov); err != nil {
		t.Fatal(err)
	}
	return ov
}

func runChromium(t *testing.T, browser string, args ...string) string {
	t.Helper()
	return runChromiumTZ(t, browser, "", args...)
}

// runChromiumTZ runs the browser in time zone tz (empty: the machine's).
func runChromiumTZ(t *testing.T, browser, tz string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	home := t.TempDir() // chromium writes its profile and crash reports here
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--user-data-dir=" + filepath.Join(home, "profile")}, args...)
	cmd := exec.CommandContext(ctx, browser, all...)
	cmd.Env = append(os.Environ(), "HOME="+home)
	if tz != "" {
		cmd.Env = append(cmd.Env, "TZ="+tz)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, errb.String())
	}
	return out.String()
}

// find returns the elements named tag (any if "*") under n that match ok
// (all if nil).
func find(n *html.Node, tag string, ok func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && (n.Data == tag || tag == "*") && (ok == nil || ok(n)) {
			out = append(out, n)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return out
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

// field1 returns the text of the cell of a row with data-field=field.
func field1(row *html.Node, field string) string {
	cells := find(row, "td", func(n *html.Node) bool { return attr(n, "data-field") == field })
	if len(cells) != 1 {
		return ""
	}
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(cells[0])
	return strings.TrimSpace(b.String())
}
