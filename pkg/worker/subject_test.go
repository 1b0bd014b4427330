package worker

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/token"
)

func TestAGrantsStorageTokensMustOutliveItsExpectedEndAndAreTheSubmittersOnlyWithATokenRef(t *testing.T) {
	start := time.Date(2026, 11, 26, 7, 0, 0, 0, time.UTC)
	p := &Pool{}
	tests := []struct {
		name        string
		g           api.Grant
		wantUntil   time.Time
		wantSubject bool
	}{
		{"a transfer of 90 s submitted with a token", api.Grant{ExpectedSeconds: 90, DTR: &dtr.DTR{ID: uuid.New(), TokenRef: "tABC"}}, start.Add(90 * time.Second), true},
		{"nothing expected, no token", api.Grant{DTR: &dtr.DTR{ID: uuid.New()}}, start, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := p.withStorageTokens(t.Context(), tt.g, start)
			if got := token.NeededUntil(ctx); !got.Equal(tt.wantUntil) {
				t.Errorf("needed until %v, want %v", got, tt.wantUntil)
			}
			if got := token.SubjectOf(ctx) != nil; got != tt.wantSubject {
				t.Errorf("the submitter's token: %v, want %v", got, tt.wantSubject)
			}
		})
	}
}
