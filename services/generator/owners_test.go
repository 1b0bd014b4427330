package generator

import (
	"errors"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
)

func TestAJobFromAnUntrustedCallerMayNotChooseASciTag(t *testing.T) {
	tagged := func() *job.Job {
		return &job.Job{Outputs: []job.File{{Source: "https://a.example.org/f", Destination: "https://b.example.org/f", SciTag: 200}}}
	}
	user := auth.Caller{Via: auth.ViaUser, Name: "alice", Identity: dtr.Identity{DN: "user:alice"}}
	if err := ownJob(user, tagged()); !errors.Is(err, auth.ErrForbidden) {
		t.Fatalf("a user's job that chooses a SciTag: %v, want forbidden", err)
	}
	for _, c := range []auth.Caller{auth.Operator, {Via: auth.ViaToken, Name: "ops@iss", Admin: true}} {
		if err := ownJob(c, tagged()); err != nil {
			t.Fatalf("%s's job that chooses a SciTag: %v", c, err)
		}
	}
}
