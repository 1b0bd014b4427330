package worker

import (
	"errors"
	"slices"
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
		{"submitted with a token that was not kept", api.Grant{DTR: &dtr.DTR{ID: uuid.New(), SubmittedWithToken: true}}, start, true},
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

func TestADTRSubmittedWithATokenThatWasNotKeptGetsNoStorageTokenNotSluicesOwn(t *testing.T) {
	p := &Pool{}
	ctx := p.withStorageTokens(t.Context(), api.Grant{DTR: &dtr.DTR{ID: uuid.New(), SubmittedWithToken: true}}, time.Now())
	sub := token.SubjectOf(ctx)
	if sub == nil {
		t.Fatal("no Subject: the transfer would get Sluice's own storage tokens")
	}
	if _, err := sub(ctx); !errors.Is(err, token.ErrSubjectNotKept) {
		t.Fatalf("the subject of a DTR whose token was not kept: %v, want ErrSubjectNotKept", err)
	}
}

func TestAGrantsStorageTokensAreForTheStoragesOfItsDTRsOwnURLsOnly(t *testing.T) {
	d := &dtr.DTR{ID: uuid.New(), Source: "davs://a.example.org/data/f", Destination: "https://b.example.org:8443/out/f",
		Replicas: []string{"davs://a.example.org/data/f", "https://c.example.org/data/f", "root://x.example.org//data/f", "HTTPS://d.example.org/f", "https:///no-host"},
		TURL:     "file:///stage/f"}
	got := audiencesOf(d)
	want := []string{"https://a.example.org:443", "https://b.example.org:8443", "https://c.example.org:443", "https://d.example.org:443"}
	if !slices.Equal(got, want) {
		t.Fatalf("audiences %q, want %q", got, want)
	}
}
