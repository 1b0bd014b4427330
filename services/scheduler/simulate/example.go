package simulate

import (
	"encoding/csv"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// Example is a workload of one hour of arrivals that shows how the
// policies differ, on 10 slots of 100 MB/s:
//
//   - atlas production (/CN=atlas-prod, /atlas/Role=production): a 1 GB
//     file every second, all hour (more than the site can move alone);
//   - cms: bob sends a 2 GB file every 10 s; alice floods 3,000 files of
//     20 MB within a minute at 10 minutes;
//   - lhcb data taking (/CN=daq, /lhcb): a burst of 100 files of 500 MB at
//     30 minutes, at user priority 90.
func Example() []Arrival {
	var out []Arrival
	for t := time.Duration(0); t < time.Hour; t += time.Second {
		out = append(out, Arrival{At: t, DN: "/CN=atlas-prod", FQAN: "/atlas/Role=production", Bytes: 1e9, Priority: 50})
	}
	for t := time.Duration(0); t < time.Hour; t += 10 * time.Second {
		out = append(out, Arrival{At: t, DN: "/CN=bob", FQAN: "/cms", Bytes: 2e9, Priority: 50})
	}
	for i := 0; i < 3000; i++ {
		out = append(out, Arrival{At: 10*time.Minute + time.Duration(i)*20*time.Millisecond, DN: "/CN=alice", FQAN: "/cms", Bytes: 20e6, Priority: 50})
	}
	for i := 0; i < 100; i++ {
		out = append(out, Arrival{At: 30*time.Minute + time.Duration(i)*100*time.Millisecond, DN: "/CN=daq", FQAN: "/lhcb", Bytes: 500e6, Priority: 90})
	}
	return out
}

// ExampleSettings are the policy settings the comparison in docs/scheduling.md (Policies) uses
// with Example, as SLUICE_* variables.
var ExampleSettings = map[string]string{
	"SLUICE_SHAREPOLICY":   "voms:vo",
	"SLUICE_SHAREPRIORITY": "atlas=50,cms=30,lhcb=20",
	"SLUICE_DIRAC_GROUPS":  "atlas=50:sharing,cms=30,lhcb=20:sharing",
	"SLUICE_DIRAC_SLICES":  "1h:1:3",
	"SLUICE_SAM_GROUPS":    "lhcb=priority,atlas=0.5,cms=0.3",
	"SLUICE_SAM_UNIT":      "bytes",
	"SLUICE_ENSTORE_ADMIN": `[{"user":"/CN=daq"}]`,
	"SLUICE_ENSTORE_OWNED": "cms=3",
}

// WriteWorkload writes arrivals in the format ReadWorkload reads.
func WriteWorkload(w io.Writer, work []Arrival) error {
	cw := csv.NewWriter(w)
	header := []string{"at", "dn", "fqan", "bytes", "priority", "direction"}
	// The activity column only when some arrival has one: a workload
	// without activities reads as it always did.
	activities := slices.ContainsFunc(work, func(a Arrival) bool { return a.Activity != "" })
	if activities {
		header = append(header, "activity")
	}
	if err := cw.Write(header); err != nil {
		return err
	}
	for _, a := range work {
		prio := ""
		if a.Priority > 0 {
			prio = strconv.Itoa(a.Priority)
		}
		rec := []string{strconv.FormatFloat(a.At.Seconds(), 'f', -1, 64), a.DN, a.FQAN,
			strconv.FormatInt(a.Bytes, 10), prio, string(a.Direction)}
		if activities {
			rec = append(rec, a.Activity)
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// scaleSlots is the transfer slots of ScaleExample's site.
const scaleSlots = 200

// scaleVOs are the shares of ScaleExample and their configured priorities.
var scaleVOs = []struct {
	vo       string
	priority int
}{
	{"atlas", 90}, {"cms", 80}, {"lhcb", 60}, {"alice", 55}, {"belle", 45}, {"dune", 40},
	{"icecube", 35}, {"ligo", 30}, {"km3net", 25}, {"cta", 20}, {"lofar", 18}, {"skao", 15},
}

// ScaleExample is the workload of docs/scale.md: twelve VOs of configured
// priorities 90 down to 15 (ScaleSettings) on 200 transfer slots of
// 100 MB/s, each sending 1 GB files for 30 minutes at 1.25 times the rate
// its part of the slots moves (1 s of overhead a file), so that every VO
// has files waiting from its first arrival to near the end: 40,915 files.
func ScaleExample() []Arrival { return scaleWorkload(scaleSlots, 30*time.Minute) }

// scaleWorkload is ScaleExample's VOs sending for span at 1.25 times what
// their part of slots transfer slots moves.
func scaleWorkload(slots int, span time.Duration) []Arrival {
	const perFile, overload = 11.0, 1.25 // perFile: seconds a 1 GB file holds a slot
	sum := 0
	for _, v := range scaleVOs {
		sum += v.priority
	}
	var out []Arrival
	for _, v := range scaleVOs {
		rate := overload * float64(slots) / perFile * float64(v.priority) / float64(sum) // files a second
		every := time.Duration(float64(time.Second) / rate)
		for t := time.Duration(0); t < span; t += every {
			out = append(out, Arrival{At: t, DN: "/CN=" + v.vo + "-production", FQAN: "/" + v.vo + "/Role=production", Bytes: 1e9, Priority: 50})
		}
	}
	return out
}

// ScaleSettings are the settings docs/scale.md uses with ScaleExample, as
// SLUICE_* variables.
var ScaleSettings = func() map[string]string {
	prios := ""
	for i, v := range scaleVOs {
		if i > 0 {
			prios += ","
		}
		prios += v.vo + "=" + strconv.Itoa(v.priority)
	}
	return map[string]string{
		"SLUICE_SHAREPOLICY":   "voms:vo",
		"SLUICE_SHAREPRIORITY": prios,
		"SLUICE_MAXDELIVERY":   strconv.Itoa(scaleSlots),
	}
}()

// ScaleConfig is the core's configuration and the site's options that
// docs/scale.md uses with ScaleExample (ScaleSettings, ARC's policy).
func ScaleConfig() (core.Config, Options, error) {
	cfg := core.DefaultConfig()
	var err error
	if cfg.SharePolicy, err = core.ParseSharePolicy(ScaleSettings["SLUICE_SHAREPOLICY"]); err != nil {
		return cfg, Options{}, fmt.Errorf("scale settings: %w", err)
	}
	cfg.SharePriority = map[string]int{}
	for _, v := range scaleVOs {
		cfg.SharePriority[v.vo] = v.priority
	}
	return cfg, Options{Slots: scaleSlots, Overhead: time.Second}, nil
}
