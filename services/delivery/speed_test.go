package delivery

import (
	"strings"
	"testing"
	"time"
)

func TestSpeedMeterStopsWhatBreaksALimitAndNothingElse(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	const MB = 1e6
	tests := []struct {
		name   string
		limits SpeedLimits
		// rate gives the bytes per second moved in each second.
		rate func(sec int) float64
		at   int    // seconds to check at
		want string // part of the reason, "" for none
	}{
		{"steady and fast enough", SpeedLimits{MinSpeed: MB, MinSpeedTime: 10 * time.Second, MinAverageSpeed: MB},
			func(int) float64 { return 2 * MB }, 60, ""},
		{"too slow over the window", SpeedLimits{MinSpeed: MB, MinSpeedTime: 10 * time.Second},
			func(int) float64 { return MB / 2 }, 30, "below the minimum speed"},
		{"not judged before the window has passed", SpeedLimits{MinSpeed: MB, MinSpeedTime: 10 * time.Second},
			func(int) float64 { return MB / 2 }, 9, ""},
		{"a slow start made up for within the window", SpeedLimits{MinSpeed: MB, MinSpeedTime: 10 * time.Second},
			func(s int) float64 {
				if s < 5 {
					return 0.1 * MB
				}
				return 5 * MB
			}, 40, ""},
		{"fast then slowing down", SpeedLimits{MinSpeed: MB, MinSpeedTime: 10 * time.Second},
			func(s int) float64 {
				if s < 20 {
					return 5 * MB
				}
				return 0.2 * MB
			}, 40, "below the minimum speed"},
		{"the average falls below its minimum", SpeedLimits{MinAverageSpeed: 3 * MB, MinSpeedTime: 10 * time.Second},
			func(s int) float64 {
				if s < 20 {
					return 5 * MB
				}
				return MB
			}, 60, "below the minimum average speed"},
		{"no data for longer than max inactivity", SpeedLimits{MaxInactivity: 5 * time.Second},
			func(s int) float64 {
				if s < 10 {
					return MB
				}
				return 0
			}, 20, "max inactivity"},
		{"a pause shorter than max inactivity", SpeedLimits{MaxInactivity: 5 * time.Second},
			func(s int) float64 {
				if s >= 10 && s < 13 {
					return 0
				}
				return MB
			}, 20, ""},
		{"no limits, nothing stops", SpeedLimits{}, func(int) float64 { return 0 }, 3600, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newSpeedMeter(tt.limits, t0)
			var total float64
			var err error
			for sec := 1; sec <= tt.at && err == nil; sec++ {
				total += tt.rate(sec - 1)
				now := t0.Add(time.Duration(sec) * time.Second)
				m.Record(now, int64(total))
				err = m.Check(now)
			}
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("stopped: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("got %v, want a reason with %q", err, tt.want)
			}
		})
	}
}
