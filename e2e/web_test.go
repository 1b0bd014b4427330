package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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
	// First some throughput for the plot, then, with no deliverer, two jobs
	// whose transfers hold every slot and queue behind them: a page that
	// holds still.
	if ev := s.wait(s.submit(mkjob("warmup", "/atlas", 30, 1<<20)).JobID, time.Minute); ev.State != "finished" {
		t.Fatalf("warm-up job %s", ev.State)
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

	shot := os.Getenv("SLUICE_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "sluice-web.png")
	}
	runChromium(t, browser, "--virtual-time-budget=5000", "--window-size=1280,1400", "--screenshot="+shot, base+"/")
	if st, err := os.Stat(shot); err != nil || st.Size() < 10000 {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	t.Logf("screenshot of the page: %s", shot)
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	home := t.TempDir() // chromium writes its profile and crash reports here
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--user-data-dir=" + filepath.Join(home, "profile")}, args...)
	cmd := exec.CommandContext(ctx, browser, all...)
	cmd.Env = append(os.Environ(), "HOME="+home)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, errb.String())
	}
	return out.String()
}

// find returns the elements named tag under n that match ok (all if nil).
func find(n *html.Node, tag string, ok func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == tag && (ok == nil || ok(n)) {
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
