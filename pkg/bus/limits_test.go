package bus

import "testing"

func TestADTRLeavesRoomInEveryMessageThatCarriesIt(t *testing.T) {
	tests := []struct {
		name       string
		maxPayload int64
		want       int
	}{
		{"NATS's default max_payload, 1MB: an eighth", 1 << 20, 128 << 10},
		{"the embedded server's and compose's 8MB: SLUICE_SUBMIT's 1 MiB", 8 << 20, MaxMessageBytes},
		{"64MB: still 1 MiB", 64 << 20, MaxMessageBytes},
		{"not connected yet: SLUICE_SUBMIT's 1 MiB", 0, MaxMessageBytes},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := MaxDTRBytes(tt.maxPayload); got != tt.want {
				t.Fatalf("MaxDTRBytes(%d) = %d, want %d", tt.maxPayload, got, tt.want)
			}
		})
	}
}
