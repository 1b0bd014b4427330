package bus

import (
	"testing"
	"time"
)

func TestTheBackoffDoublesFrom100msTo5s(t *testing.T) {
	var b Backoff
	var got []time.Duration
	for range 9 {
		got = append(got, b.Next())
	}
	want := []time.Duration{100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("pauses %v, want %v ms", got, want)
		}
	}
	b.Reset()
	if d := b.Next(); d != MinBackoff {
		t.Fatalf("after Reset: %s", d)
	}
}
