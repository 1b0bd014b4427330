package bench

import (
	"math"
	"testing"
	"time"
)

func TestSlotTimeMovingCountsTheSaturatedTimeAndTheWholeRun(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	for _, tt := range []struct {
		name             string
		spans            [][2]time.Time
		slots            int
		saturated, whole float64
	}{
		{"two slots handed on at once: all of the time moves bytes",
			[][2]time.Time{{ms(0), ms(100)}, {ms(0), ms(100)}, {ms(100), ms(200)}, {ms(100), ms(200)}}, 2, 1, 1},
		{"a 10 ms turnaround on one of two slots, and a tail",
			// slot 1: 0–100, 110–210; slot 2: 0–100, 100–200, 200–300
			[][2]time.Time{{ms(0), ms(100)}, {ms(110), ms(210)}, {ms(0), ms(100)}, {ms(100), ms(200)}, {ms(200), ms(300)}}, 2,
			// saturated from 0 to the last start, 200: 390 of 400 slot-ms
			390.0 / 400, 500.0 / 600},
		{"never all busy", [][2]time.Time{{ms(0), ms(100)}, {ms(100), ms(200)}}, 2, 0, 200.0 / 400},
		{"nothing", nil, 2, 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			saturated, whole := slotTimeMoving(tt.spans, tt.slots)
			if math.Abs(saturated-tt.saturated) > 1e-9 || math.Abs(whole-tt.whole) > 1e-9 {
				t.Fatalf("saturated %.4f, whole %.4f; want %.4f, %.4f", saturated, whole, tt.saturated, tt.whole)
			}
		})
	}
}
