package scheduler

import (
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestARecentlyFinishedIdIsRememberedForOneToTwoSpans(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	a, b := uuid.New(), uuid.New()
	tests := []struct {
		name  string
		later time.Duration // after a was added at t0 (b at t0 + 90 s)
		wantA bool
	}{
		{"at once", 0, true},
		{"within the span", 59 * time.Second, true},
		{"after one span", 90 * time.Second, true},
		{"after two spans, with another id added meanwhile", 150 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRecentIDs(time.Minute)
			r.Add(a, t0)
			if tt.later >= 90*time.Second {
				r.Add(b, t0.Add(90*time.Second))
			}
			if got := r.Has(a, t0.Add(tt.later)); got != tt.wantA {
				t.Fatalf("Has after %s = %v, want %v", tt.later, got, tt.wantA)
			}
		})
	}
	t.Run("a quiet time forgets everything", func(t *testing.T) {
		r := newRecentIDs(time.Minute)
		r.Add(a, t0)
		if r.Has(a, t0.Add(2*time.Hour)) {
			t.Fatal("an id finished two hours ago is still remembered")
		}
	})
	t.Run("a new id is not remembered", func(t *testing.T) {
		r := newRecentIDs(time.Minute)
		r.Add(a, t0)
		if r.Has(b, t0) {
			t.Fatal("an id never added is remembered")
		}
	})
}
