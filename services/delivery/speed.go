package delivery

import (
	"fmt"
	"sync"
	"time"
)

// SpeedLimits are ARC's speedcontrol: a transfer that breaks one of them
// ends with a TRANSFER_SPEED error, which is retried. Zero turns a limit
// off.
type SpeedLimits struct {
	// MinSpeed is the least bytes per second over the last MinSpeedTime.
	MinSpeed float64
	// MinSpeedTime is that window; neither speed is checked before a
	// transfer has run this long.
	MinSpeedTime time.Duration
	// MinAverageSpeed is the least bytes per second since the start.
	MinAverageSpeed float64
	// MaxInactivity is the longest time with no data moved.
	MaxInactivity time.Duration
}

// speedMeter follows one transfer's progress and tells when it breaks a
// limit. It is safe for concurrent use: progress comes from the copy,
// checks from a ticker.
type speedMeter struct {
	limits SpeedLimits
	mu     sync.Mutex
	start  time.Time
	moved  time.Time // when the byte count last grew
	bytes  int64
	// samples of (time, bytes), oldest first, reaching back just past the
	// MinSpeedTime window.
	samples []sample
}

type sample struct {
	at    time.Time
	bytes int64
}

func newSpeedMeter(l SpeedLimits, now time.Time) *speedMeter {
	return &speedMeter{limits: l, start: now, moved: now, samples: []sample{{now, 0}}}
}

// Record notes that bytes in all have been moved by now.
func (m *speedMeter) Record(now time.Time, bytes int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if bytes > m.bytes {
		m.bytes, m.moved = bytes, now
	}
	m.samples = append(m.samples, sample{now, m.bytes})
	// Keep one sample at or before the window's start.
	cut := now.Add(-m.limits.MinSpeedTime)
	for len(m.samples) > 2 && !m.samples[1].at.After(cut) {
		m.samples = m.samples[1:]
	}
}

// Check returns why the transfer should stop at now, or nil.
func (m *speedMeter) Check(now time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.limits
	if l.MaxInactivity > 0 && now.Sub(m.moved) > l.MaxInactivity {
		return fmt.Errorf("no data moved for %s (max inactivity %s); %d bytes moved", now.Sub(m.moved).Round(time.Second), l.MaxInactivity, m.bytes)
	}
	ran := now.Sub(m.start)
	if l.MinSpeedTime <= 0 || ran < l.MinSpeedTime {
		return nil
	}
	if l.MinSpeed > 0 {
		// The bytes at the window's start: the last sample at or before it.
		from := m.samples[0]
		for _, s := range m.samples {
			if s.at.After(now.Add(-l.MinSpeedTime)) {
				break
			}
			from = s
		}
		window := now.Sub(from.at).Seconds()
		if speed := float64(m.bytes-from.bytes) / window; speed < l.MinSpeed {
			return fmt.Errorf("%.0f B/s over the last %s, below the minimum speed of %.0f B/s; %d bytes moved",
				speed, l.MinSpeedTime, l.MinSpeed, m.bytes)
		}
	}
	if l.MinAverageSpeed > 0 {
		if avg := float64(m.bytes) / ran.Seconds(); avg < l.MinAverageSpeed {
			return fmt.Errorf("%.0f B/s on average over %s, below the minimum average speed of %.0f B/s; %d bytes moved",
				avg, ran.Round(time.Second), l.MinAverageSpeed, m.bytes)
		}
	}
	return nil
}
