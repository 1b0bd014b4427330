package core

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestPackedDTRReadsBackTheSame(t *testing.T) {
	when := time.Date(2026, 11, 22, 5, 6, 7, 890, time.UTC)
	full := dtr.DTR{
		ID: uuid.MustParse("6f1c1c1e-8f8e-4d8e-9b1a-7c1d2e3f4a5b"), JobID: "job-1",
		Source: "https://storage.example.org/data/f ü.root", Destination: "file:///scratch/f.root",
		Owner:     dtr.Identity{DN: "/DC=org/CN=Alice", FQANs: []string{"/atlas/Role=production", "/atlas"}},
		Direction: dtr.Upload, UserPriority: 77,
		Options: dtr.Options{Checksum: "adler32:0a0b0c0d", Overwrite: true, FailureAllowed: true, Stage: true, NoCache: true, Activity: "Production Input", TPC: dtr.TPCOnly, SciTag: 2<<6 | 3},
		Share:   "atlas-upload", Priority: 38, State: dtr.RegisterReplica, Attempts: 3, MaxAttempts: 10,
		Error:  &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "503 from storage", State: dtr.Transferring, Location: dtr.LocationSource},
		Cancel: true, Size: 1 << 40, Bytes: -1, Checksum: "md5:0123",
		Created: when, Updated: when.Add(time.Second), Started: when.Add(2 * time.Second),
		Ended: when.Add(3 * time.Second), NextProcess: when.Add(time.Hour),
		TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", TransferGrant: "x.2",
		Cleanup: true, Grant: "x.3", TURL: "file:///stage/6f1c1c1e-8f8e-4d8e-9b1a-7c1d2e3f4a5b",
		Replicas: []string{"https://a.example/f", "https://storage.example.org/data/f ü.root"}, Replica: 1,
		Cache: dtr.CacheDownload, CacheFile: "file:///cache/data/ab/cdef", ChecksumMismatch: "adler32:ffff0000",
		TransferMethod: dtr.TransferPull, ChecksumUnverified: "the destination storage gives no adler32 checksum and the job expects none",
		TokenRef:           "t5d3c0b8a4e6f21907f1c2d3e4a5b6c7d",
		ChecksumSource:     dtr.ChecksumFromStorage,
		SubmittedWithToken: true,
		Chained:            true,
		StateEntered:       when.Add(4 * time.Second),
	}
	// A field added to DTR must be set here, so that packing is seen to
	// keep it: a queued DTR's record is stored again from its packed form.
	for i, v := 0, reflect.ValueOf(full); i < v.NumField(); i++ {
		if v.Field(i).IsZero() {
			t.Fatalf("the DTR with every field set leaves %s unset", v.Type().Field(i).Name)
		}
	}
	tests := []struct {
		name string
		d    dtr.DTR
	}{
		{"every field set", full},
		{"only what a submission has", dtr.DTR{ID: uuid.New(), Source: "file:///a", Destination: "file:///b", State: dtr.Transfer}},
		{"zero DTR", dtr.DTR{}},
		{"what packs short kept as it is when it does not fit", dtr.DTR{ID: uuid.New(),
			Source:      "https://" + strings.Repeat("long-host.", 20) + "example.org/f",
			Destination: "relative/path", Replicas: []string{"gsiftp://se.example.org", "srm://"},
			TraceParent: "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
			Updated:     when, Started: when.Add(-time.Hour)}},
		{"a traceparent of another version", dtr.DTR{ID: uuid.New(), TraceParent: "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
			Created: when, Updated: when.Add(-time.Minute), StateEntered: when}},
		{"a traceparent that is not hex", dtr.DTR{ID: uuid.New(), TraceParent: "00-0af7651916cd43dd8448eb211c80319x-b7ad6b7169203331-01"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(DefaultConfig())
			got := c.unpackDTR(c.packDTR(&tt.d))
			want := tt.d
			// Times keep their instant, not their location.
			for _, p := range [][2]*time.Time{{&got.Created, &want.Created}, {&got.Updated, &want.Updated},
				{&got.Started, &want.Started}, {&got.Ended, &want.Ended}, {&got.NextProcess, &want.NextProcess}, {&got.StateEntered, &want.StateEntered}} {
				if !p[0].Equal(*p[1]) {
					t.Errorf("time %v, want %v", *p[0], *p[1])
				}
				*p[0], *p[1] = time.Time{}, time.Time{}
			}
			if !reflect.DeepEqual(*got, want) {
				t.Errorf("unpacked\n%+v\nwant\n%+v", *got, want)
			}
			if tt.d.JobID != "" && c.jobOf(&entry{packed: c.packDTR(&tt.d)}) != tt.d.JobID {
				t.Error("jobOf reads the wrong job")
			}
			if c.shareOf(&entry{packed: c.packDTR(&tt.d)}) != tt.d.Share {
				t.Error("shareOf reads the wrong share")
			}
		})
	}
}

// A submitter's free text is not interned: the table of names is never
// pruned, so every distinct activity would stay for the process's life.
func TestActivitiesAreNotKeptInTheTableOfNames(t *testing.T) {
	c := New(DefaultConfig())
	d := dtr.DTR{ID: uuid.New(), Source: "file:///a", Destination: "file:///b", Owner: dtr.Identity{DN: "/CN=a"}, Share: "s"}
	c.packDTR(&d)
	names := len(c.names)
	for i := range 1000 {
		d.Options.Activity = fmt.Sprintf("activity %d", i)
		if got := c.unpackDTR(c.packDTR(&d)).Options.Activity; got != d.Options.Activity {
			t.Fatalf("activity %q read back as %q", d.Options.Activity, got)
		}
	}
	if len(c.names) != names {
		t.Fatalf("the table of names grew from %d to %d with 1000 activities", names, len(c.names))
	}
}

func TestQueuedDTRsArePackedAndChangesReachThem(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxProcessor, cfg.MaxDelivery = 1, 1
	h := newHarness(t, cfg)
	for i := 0; i < 4; i++ {
		h.submit(newDTR(i, "x", ""))
	}
	h.tick(time.Second) // one checks its source; the others wait, packed
	packed := 0
	for _, e := range h.c.dtrs {
		if e.d == nil {
			packed++
			if e.packed == "" {
				t.Fatal("an entry has neither its DTR nor its packed form")
			}
		}
	}
	if packed != 3 {
		t.Fatalf("%d entries packed, want the 3 queued ones", packed)
	}
	id := newDTR(3, "x", "").ID
	if err := h.c.SetPriority(h.now, id, 99); err != nil {
		t.Fatal(err)
	}
	out := h.collect()
	if len(out.Changed) != 1 || out.Changed[0].Priority != 99 {
		t.Fatalf("changed %v, want the DTR with priority 99", out.Changed)
	}
	if d, _ := h.c.Get(id); d.Priority != 99 || d.Source != newDTR(3, "x", "").Source {
		t.Fatalf("after packing again: priority %d source %q", d.Priority, d.Source)
	}
}

func TestQueueCountsByPriorityStayExactThroughChanges(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SharePolicy = PolicyDN
	cfg.MaxProcessor, cfg.MaxDelivery = 3, 2
	cfg.AgeAfter, cfg.AgeEvery = time.Second, time.Second
	h := newHarness(t, cfg)
	for i := 0; i < 60; i++ {
		d := newDTR(i, []string{"a", "b", "c"}[i%3], "")
		d.UserPriority = 1 + (i*37)%100
		h.submit(d)
	}
	for step := 0; step < 40; step++ {
		for _, g := range h.tick(time.Second) {
			if step%3 == 0 {
				h.answer(g, nil)
			}
		}
		id := newDTR(step, []string{"a", "b", "c"}[step%3], "").ID
		_ = h.c.SetPriority(h.now, id, 1+(step*13)%100)
		if step%7 == 0 {
			_ = h.c.Cancel(h.now, newDTR(step+20, []string{"a", "b", "c"}[(step+20)%3], "").ID)
		}
		if step == 20 {
			if err := h.c.SetSharePriorities(h.now, map[string]int{"a": 90}); err != nil {
				t.Fatal(err)
			}
		}
		h.collect()
		for _, st := range h.c.states {
			for _, ss := range st.order {
				var want [101]int32
				for _, e := range ss.q.items {
					want[e.prio]++
				}
				if want != ss.q.hist {
					t.Fatalf("step %d, %s share %s: counts by priority %v, want %v", step, st.state, ss.name, nonzero(ss.q.hist), nonzero(want))
				}
			}
		}
	}
}

func nonzero(h [101]int32) map[int]int32 {
	m := map[int]int32{}
	for p, n := range h {
		if n != 0 {
			m[p] = n
		}
	}
	return m
}
