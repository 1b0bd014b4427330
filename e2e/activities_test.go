package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// Jobs whose files name an activity land, through the bus, in their VO's
// share for that activity; an activity limit at the source holds that
// share's transfers and the slots go to the VO's other activity; sluice
// why names the limit; the web page's overview and the metrics show the
// limit's use.
func TestJobsWithAnActivityLandInTheirActivityShareUnderItsLimit(t *testing.T) {
	dir := t.TempDir()
	base := httpServer(t, http.FileServer(http.Dir(dir)))
	endpoint := strings.TrimPrefix(base, "http://")
	if u, err := url.Parse(base); err == nil {
		endpoint = u.Host
	}
	cfg := testConfig()
	cfg.SharePolicy = "voms:vo+activity"
	cfg.ActivityShares = `{"atlas":{"Production Input":3,"default":1}}`
	cfg.ActivityLimits = fmt.Sprintf(`[{"activity":"Production Input","source":%q,"max":2}]`, endpoint)
	cfg.MaxDelivery, cfg.MaxEmergency = 6, 0
	cfg.Lease = time.Hour
	// No delivery: granted transfers stay running, and the table holds
	// still. The scheduler serves its page and metrics.
	s := start(t, cfg, "generator", "processor")
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
	web := "http://" + ln.Addr().String()

	mkjob := func(name, activity string, n int) *job.Job {
		j := &job.Job{Name: name, Owner: dtr.Identity{DN: "/CN=" + name, FQANs: []string{"/atlas/prod"}}}
		for i := range n {
			writeFile(t, filepath.Join(dir, name, fmt.Sprint(i)), 100, i)
			j.Inputs = append(j.Inputs, job.File{Source: fmt.Sprintf("%s/%s/%d", base, name, i),
				Destination: fileURL(filepath.Join(s.dir, "out", name, fmt.Sprint(i))), Activity: activity})
		}
		return j
	}
	prod := s.submit(mkjob("prod", "Production Input", 10))
	s.submit(mkjob("plain", "", 10))

	const prodShare, plainShare = "atlas#Production Input-download", "atlas#default-download"
	var r api.SharesReply
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		r = s.shares()
		got := map[string]api.ShareStats{}
		for _, st := range r.Shares {
			if st.State == dtr.Transfer {
				got[st.Share] = st
			}
		}
		// The split alone would give production 3 of each 4 slots; its
		// limit holds it at 2, and the plain share takes the other 4.
		if p, d := got[prodShare], got[plainShare]; p.Running == 2 && p.Queued == 8 && d.Running == 4 && d.Queued == 6 {
			if p.Activity != "Production Input" || d.Activity != "default" {
				t.Fatalf("activities in the share table: %q, %q", p.Activity, d.Activity)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("TRANSFER shares %+v; want %s 2 running 8 queued, %s 4 running 6 queued", got, prodShare, plainShare)
		}
	}
	if len(r.ActivityLimits) != 1 || r.ActivityLimits[0].Running[endpoint] != 2 || r.ActivityLimits[0].Max != 2 {
		t.Fatalf("activity limits in the share table: %+v, want 2 of 2 running at %s", r.ActivityLimits, endpoint)
	}

	// The overview behind the web page, and the metrics, say the same
	// (both sampled once a second).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		ov := overview(t, web)
		m := scrape(t, web+"/metrics")
		labels := fmt.Sprintf(`{activity="Production Input",endpoint=%q,side="source"}`, endpoint)
		var activity string
		for _, l := range ov.Shares {
			if l.Share == prodShare && l.State == dtr.Transfer {
				activity = l.Activity
			}
		}
		if len(ov.ActivityLimits) == 1 && ov.ActivityLimits[0].Running[endpoint] == 2 && activity == "Production Input" &&
			m["sluice_scheduler_activity_running"+labels] == 2 && m["sluice_scheduler_activity_limit"+labels] == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("overview: activity limits %+v, activity of %s %q; metrics running %v, limit %v (labels %s)", ov.ActivityLimits, prodShare, activity,
				m["sluice_scheduler_activity_running"+labels], m["sluice_scheduler_activity_limit"+labels], labels)
		}
	}

	// A production DTR still queued says which limit holds it.
	var ev api.JobEvent
	if err := s.request(api.SubjectJobStatus, []byte(prod.JobID), nil, &ev); err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, f := range ev.Pending {
		var why api.DTRReply
		if err := s.request(api.SubjectDTR, []byte(f.DTR.String()), nil, &why); err != nil {
			t.Fatal(err)
		}
		if why.DTR.State != dtr.Transfer {
			continue
		}
		if why.Why == nil || !strings.Contains(why.Why.Reason, fmt.Sprintf(`activity limit 1 (at most 2 "Production Input" transfers at source %s)`, endpoint)) {
			t.Fatalf("why of a queued production DTR: %+v", why.Why)
		}
		held++
	}
	if held != 8 {
		t.Fatalf("%d production DTRs queued in TRANSFER, want 8", held)
	}
}
