package scheduler

import (
	"errors"
	"testing"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

func TestOnlyTrustedCallersAndAdministratorsChooseADTRsSciTag(t *testing.T) {
	s := &Service{core: newTestCore()}
	for _, tt := range []struct {
		name   string
		caller auth.Caller
		ok     bool
	}{
		{"the operator", auth.Operator, true},
		{"an administrator's token", auth.Caller{Via: auth.ViaToken, Name: "ops@iss", Admin: true, Scopes: []string{auth.ScopeCreate}}, true},
		{"a token holder", auth.Caller{Via: auth.ViaToken, Name: "carol@iss", Identity: dtr.Identity{DN: "carol@iss"}, Scopes: []string{auth.ScopeCreate}}, false},
		{"a NATS user", auth.Caller{Via: auth.ViaUser, Name: "alice", Identity: dtr.Identity{DN: "user:alice"}}, false},
	} {
		d := &dtr.DTR{ID: uuid.New(), Source: "https://a.example.org/f", Destination: "https://b.example.org/f",
			Options: dtr.Options{SciTag: 2<<6 | 3}}
		err := s.admit(tt.caller, d)
		if tt.ok && err != nil || !tt.ok && !errors.Is(err, auth.ErrForbidden) {
			t.Errorf("%s chooses a SciTag: %v", tt.name, err)
		}
	}
}
