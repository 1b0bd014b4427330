package simulate

import (
	"encoding/csv"
	"io"
	"strconv"
	"time"
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
	if err := cw.Write([]string{"at", "dn", "fqan", "bytes", "priority", "direction"}); err != nil {
		return err
	}
	for _, a := range work {
		prio := ""
		if a.Priority > 0 {
			prio = strconv.Itoa(a.Priority)
		}
		if err := cw.Write([]string{strconv.FormatFloat(a.At.Seconds(), 'f', -1, 64), a.DN, a.FQAN,
			strconv.FormatInt(a.Bytes, 10), prio, string(a.Direction)}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
