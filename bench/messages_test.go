package bench

import (
	"context"
	"testing"
)

func TestMessagesPerDTRCountsEachKindAndEveryDTRTakesAGrantAndAResult(t *testing.T) {
	for _, slots := range []int{0, 50} {
		total, kinds, err := MessagesPerDTR(context.Background(), t.TempDir(), 200, slots)
		if err != nil {
			t.Fatal(err)
		}
		per := map[string]float64{}
		sum := 0.0
		for _, k := range kinds {
			per[k.Kind] = k.PerDTR
			sum += k.PerDTR
		}
		// Each DTR is granted (and answers) at least once, in messages
		// that carry up to 64 grants or results.
		for _, kind := range []string{"grants", "results", "journal records"} {
			if per[kind] < 1.0/64 {
				t.Errorf("%d slots: %s %.3f a DTR, want some", slots, kind, per[kind])
			}
		}
		if total < sum-0.01 || total > sum+0.01 {
			t.Errorf("%d slots: total %.2f, the kinds add up to %.2f", slots, total, sum)
		}
		t.Logf("%d slots: %s", slots, messagesValue(total, kinds))
	}
}
