package transfer

import (
	"fmt"
	"net/url"
	"testing"
	"time"
)

func TestTheHostsThatRefuseWantDigestAreForgottenInTimeAndBounded(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	m := newHostMemory(time.Hour, 3)
	m.now = func() time.Time { return now }
	host := func(i int) *url.URL { u, _ := url.Parse(fmt.Sprintf("https://storage%d.example/f", i)); return u }
	for i := range 3 {
		m.add(host(i))
		now = now.Add(time.Minute)
	}
	// Another port is another host; the default port is written out.
	if other, _ := url.Parse("https://storage0.example:8443/f"); m.has(other) {
		t.Fatal("another port of a remembered host counts as remembered")
	}
	if same, _ := url.Parse("https://storage0.example:443/g"); !m.has(same) {
		t.Fatal("the default port written out is not the same host")
	}
	// A fourth makes room by forgetting the one remembered longest ago.
	m.add(host(3))
	if m.has(host(0)) || !m.has(host(1)) || !m.has(host(3)) || m.len() != 3 {
		t.Fatalf("after a fourth host: %v, want storage1..3", m.hosts)
	}
	// An hour after it was remembered, a host is asked again.
	now = now.Add(time.Hour - 2*time.Minute)
	if m.has(host(1)) || !m.has(host(2)) {
		t.Fatalf("an hour on: %v, want storage1 forgotten, storage2 not yet", m.hosts)
	}
}
