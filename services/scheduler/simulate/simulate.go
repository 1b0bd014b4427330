// Package simulate replays a workload of file transfers through the real
// scheduler core on a virtual clock, under any policy, and reports what
// each group got: files, bytes, slot-time, waits, and the transfer slots it
// held over time.
package simulate

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// Arrival is one file of a workload: when it arrives, who owns it, its size
// and user priority, its direction, and its activity (FTS3's and Rucio's
// "Production Input", …; empty for none).
type Arrival struct {
	At        time.Duration
	DN        string
	FQAN      string
	Bytes     int64
	Priority  int
	Direction dtr.Direction
	Activity  string
}

// Group is who an arrival is reported under: its VO (the first part of
// its FQAN), or its DN when it has no FQAN; and, for an arrival with an
// activity, the activity after a "#", as an activity share is named:
// "atlas#Production Input".
func (a Arrival) Group() string {
	g := a.DN
	if a.FQAN != "" {
		g = core.PolicyVOMSVO.ShareName(dtr.Identity{FQANs: []string{a.FQAN}})
	}
	if a.Activity != "" {
		g += core.ActivitySeparator + a.Activity
	}
	return g
}

// groupUnder is the group a run reports an arrival under: its Group, and,
// under a share policy that names activities, the activity its share
// (named by the core) goes by: "default" for an arrival without one, and
// for one that its VO's weights table does not list.
func (a Arrival) groupUnder(p core.SharePolicy, share string) string {
	if !p.HasActivity() {
		return a.Group()
	}
	_, act, ok := p.SplitShare(share)
	if !ok {
		act = core.DefaultActivity
	}
	a.Activity = ""
	return a.Group() + core.ActivitySeparator + act
}

// ReadWorkload reads a workload in CSV with a header line naming the
// columns: at (seconds from the start), dn, fqan, bytes, priority (1–100),
// direction (download or upload) and activity; fqan, priority, direction
// and activity may be left out or empty. Arrivals need not be in order.
func ReadWorkload(r io.Reader) ([]Arrival, error) {
	cr := csv.NewReader(r)
	cr.Comment = '#'
	cr.TrimLeadingSpace = true
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("workload header: %w", err)
	}
	col := map[string]int{}
	for i, h := range header {
		col[strings.ToLower(strings.TrimSpace(h))] = i
	}
	for _, need := range []string{"at", "dn", "bytes"} {
		if _, ok := col[need]; !ok {
			return nil, fmt.Errorf("workload header %q lacks the column %q (want at, dn, fqan, bytes, priority, direction, activity)", strings.Join(header, ","), need)
		}
	}
	cr.FieldsPerRecord = len(header)
	field := func(rec []string, name string) string {
		if i, ok := col[name]; ok {
			return strings.TrimSpace(rec[i])
		}
		return ""
	}
	var out []Arrival
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("workload: %w", err)
		}
		var a Arrival
		at, err := strconv.ParseFloat(field(rec, "at"), 64)
		if err != nil || at < 0 || math.IsInf(at, 0) || math.IsNaN(at) {
			return nil, fmt.Errorf("workload line %d: at %q is not a time in seconds ≥ 0", line, field(rec, "at"))
		}
		a.At = time.Duration(at * float64(time.Second))
		if a.DN = field(rec, "dn"); a.DN == "" {
			return nil, fmt.Errorf("workload line %d: dn is empty", line)
		}
		a.FQAN = field(rec, "fqan")
		if a.Bytes, err = strconv.ParseInt(field(rec, "bytes"), 10, 64); err != nil || a.Bytes < 0 {
			return nil, fmt.Errorf("workload line %d: bytes %q is not a size ≥ 0", line, field(rec, "bytes"))
		}
		if p := field(rec, "priority"); p != "" {
			if a.Priority, err = strconv.Atoi(p); err != nil || a.Priority < 1 || a.Priority > 100 {
				return nil, fmt.Errorf("workload line %d: priority %q is not 1–100", line, p)
			}
		}
		switch d := dtr.Direction(field(rec, "direction")); d {
		case "", dtr.Download, dtr.Upload:
			a.Direction = d
		default:
			return nil, fmt.Errorf("workload line %d: direction %q is neither download nor upload", line, d)
		}
		if a.Activity = field(rec, "activity"); a.Activity != "" {
			if err := dtr.CheckActivity(a.Activity); err != nil {
				return nil, fmt.Errorf("workload line %d: %w", line, err)
			}
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, errors.New("workload has no arrivals")
	}
	return out, nil
}

// Options shape the simulated site.
type Options struct {
	// Slots is the number of transfer slots (maxdelivery).
	Slots int
	// SlotRate is how many bytes a second one transfer moves.
	SlotRate float64
	// Overhead is added to every transfer.
	Overhead time.Duration
	// Step is the virtual tick; Sample how often the slots are recorded.
	Step, Sample time.Duration
	// Limit stops a run that has not finished after this much virtual time.
	Limit time.Duration
}

func (o *Options) defaults() {
	if o.Slots <= 0 {
		o.Slots = 10
	}
	if o.SlotRate <= 0 {
		o.SlotRate = 100e6
	}
	if o.Step <= 0 {
		o.Step = 100 * time.Millisecond
	}
	if o.Sample <= 0 {
		o.Sample = 10 * time.Second
	}
	if o.Limit <= 0 {
		o.Limit = 30 * 24 * time.Hour
	}
}

// GroupResult is what one group got.
// Durations are in nanoseconds in its JSON, as time.Duration's.
type GroupResult struct {
	Group    string        `json:"group"`
	Files    int           `json:"files"`
	Bytes    int64         `json:"bytes"`
	SlotTime time.Duration `json:"slot_time_ns"`
	// MeanWait and MaxWait are from arrival to the start of the transfer.
	MeanWait time.Duration `json:"mean_wait_ns"`
	MaxWait  time.Duration `json:"max_wait_ns"`
	// Finished is when the group's last file was done.
	Finished time.Duration `json:"finished_ns"`
}

// Result is one policy's run.
type Result struct {
	Policy string `json:"policy"`
	// Duration is the virtual time until the last file was done.
	Duration time.Duration `json:"duration_ns"`
	Groups   []GroupResult `json:"groups"`
	// Utilisation is the busy part of the transfer slot-time while files
	// waited for a transfer slot.
	Utilisation float64 `json:"utilisation"`
	// Samples are the transfer slots each group held, every Sample.
	Samples []Sample `json:"samples"`
}

// Sample is the transfer slots each group held at one moment.
type Sample struct {
	At      time.Duration  `json:"at_ns"`
	Running map[string]int `json:"running"`
}

// Run replays work through a core made with cfg.
func Run(cfg core.Config, work []Arrival, opt Options) (Result, error) {
	opt.defaults()
	sh := Sharding{Shards: 1}
	if err := sh.defaults(); err != nil {
		return Result{}, err
	}
	r := newRun(cfg, work, opt, sh, false)
	if err := r.run(); err != nil {
		return Result{Policy: r.policy}, err
	}
	return r.result(), nil
}

// Table writes the per-group results as text columns, and a fairness
// line: Jain's index of the groups' slot-time (1 when every group had the
// same, 1/n when one had it all).
func (r Result) Table(w io.Writer) error {
	var slot time.Duration
	sum, sumSq := 0.0, 0.0
	for _, g := range r.Groups {
		slot += g.SlotTime
		x := g.SlotTime.Seconds()
		sum, sumSq = sum+x, sumSq+x*x
	}
	_, err := fmt.Fprintf(w, "policy %s: %s of virtual time, transfer slots %.1f%% busy while files waited\n", r.Policy, r.Duration.Round(time.Second), 100*r.Utilisation)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%-24s %8s %12s %9s %10s %9s %10s %10s %10s\n", "GROUP", "FILES", "BYTES", "MB/S", "SLOT-TIME", "SHARE", "MEAN WAIT", "MAX WAIT", "FINISHED")
	for _, g := range r.Groups {
		share, rate := 0.0, 0.0
		if slot > 0 {
			share = 100 * float64(g.SlotTime) / float64(slot)
		}
		if g.Finished > 0 {
			rate = float64(g.Bytes) / 1e6 / g.Finished.Seconds()
		}
		fmt.Fprintf(w, "%-24s %8d %12d %9.1f %10s %8.1f%% %10s %10s %10s\n", g.Group, g.Files, g.Bytes, rate,
			g.SlotTime.Round(time.Second), share, g.MeanWait.Round(time.Second), g.MaxWait.Round(time.Second), g.Finished.Round(time.Second))
	}
	if len(r.Groups) > 0 && sumSq > 0 {
		_, err = fmt.Fprintf(w, "fairness: Jain's index of slot-time over %d groups %.3f\n", len(r.Groups), sum*sum/(float64(len(r.Groups))*sumSq))
	}
	return err
}
