package dtr

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestTransitionsFollowTheTable(t *testing.T) {
	tests := []struct {
		name     string
		from, to State
		legal    bool
	}{
		{"a queued DTR is granted", Transfer, Transferring, true},
		{"a transfer completes", Transferring, Transferred, true},
		{"a retry starts over", CacheProcessed, New, true},
		{"a timed-out cache wait goes on without the cache", CacheProcessed, CacheChecked, true},
		{"NEW cannot jump to TRANSFERRING", New, Transferring, false},
		{"nothing leaves DONE", Done, New, false},
		{"nothing leaves ERROR", Error, Transfer, false},
		{"a cancelled transfer must still be cleaned up", TransferringCancel, Cancelled, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &DTR{ID: uuid.New(), State: tt.from}
			err := d.Transition(tt.to, time.Now())
			if tt.legal && err != nil {
				t.Fatalf("%s → %s refused: %v", tt.from, tt.to, err)
			}
			if !tt.legal {
				if !errors.Is(err, ErrIllegalTransition) {
					t.Fatalf("%s → %s: got %v, want ErrIllegalTransition", tt.from, tt.to, err)
				}
				if d.State != tt.from {
					t.Fatalf("a refused transition changed the state to %s", d.State)
				}
			}
		})
	}
}

func TestEveryQueueStateHasAnActiveAndADoneState(t *testing.T) {
	for _, q := range QueueStates {
		if !CanTransition(q, q.Active()) {
			t.Errorf("%s cannot be granted to %s", q, q.Active())
		}
		if !CanTransition(q.Active(), q.Completed()) {
			t.Errorf("%s cannot complete to %s", q.Active(), q.Completed())
		}
		if back, ok := QueueOf(q.Active()); !ok || back != q {
			t.Errorf("QueueOf(%s) = %s", q.Active(), back)
		}
	}
}

func TestStateNamesRoundTrip(t *testing.T) {
	for s := New; s < numStates; s++ {
		b, err := json.Marshal(s)
		if err != nil || string(b) != `"`+s.String()+`"` {
			t.Fatalf("%s in JSON: %s, %v", s, b, err)
		}
		var back State
		if err := json.Unmarshal(b, &back); err != nil || back != s {
			t.Fatalf("%s → %s → %s (%v)", s, b, back, err)
		}
		lower := []byte(strings.ToLower(string(b)))
		if err := json.Unmarshal(lower, &back); err != nil || back != s {
			t.Fatalf("%s → %s → %s (%v)", s, lower, back, err)
		}
	}
	var st State
	for _, bad := range []string{`"FLYING"`, `3`, `null"`} {
		if err := json.Unmarshal([]byte(bad), &st); err == nil {
			t.Errorf("state %s taken", bad)
		}
	}
	if _, err := json.Marshal(State(200)); err == nil {
		t.Error("State(200) written")
	}
	if _, err := ParseState("FLYING"); err == nil {
		t.Fatal("ParseState accepted FLYING")
	}
}

func TestValidateNamesEveryProblem(t *testing.T) {
	d := &DTR{Source: "ftp://x/y", Destination: "file://relative", UserPriority: 101}
	err := d.Validate()
	if err == nil {
		t.Fatal("invalid DTR accepted")
	}
	for _, want := range []string{"id is missing", `scheme "ftp"`, "absolute path", "outside 1–100"} {
		if !contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func TestValidateURLRefusesPasswordsWithoutQuotingThem(t *testing.T) {
	for _, u := range []string{"https://alice:hunter2@storage.example/f", "http://bob:hunter2@h/x"} {
		err := ValidateURL(u)
		if err == nil || !contains(err.Error(), "carries a password") || contains(err.Error(), "hunter2") {
			t.Errorf("%s: %v, want a refusal that does not quote the password", u, err)
		}
	}
	if err := ValidateURL("https://token-user@storage.example/f"); err != nil {
		t.Errorf("a user name alone is no secret: %v", err)
	}
}

func TestAStateWrittenAndReadAsTextIsItsARCNameInAnyCase(t *testing.T) {
	b, err := Transferring.MarshalText()
	if err != nil || string(b) != "TRANSFERRING" {
		t.Fatalf("MarshalText: %q, %v", b, err)
	}
	_ = append(b, "-changed"...) // a caller's append leaves the name alone
	if again, _ := Transferring.MarshalText(); string(again) != "TRANSFERRING" {
		t.Fatalf("after an append to the text: %q", again)
	}
	for _, in := range []string{"TRANSFERRING", "transferring", "Transferring"} {
		var s State
		if err := s.UnmarshalText([]byte(in)); err != nil || s != Transferring {
			t.Errorf("UnmarshalText(%q) = %v, %v", in, s, err)
		}
	}
	var s State
	if err := s.UnmarshalText([]byte("NOT_A_STATE")); err == nil {
		t.Error("an unknown name was read")
	}
	if _, err := State(numStates).MarshalText(); err == nil {
		t.Error("a number that is no state was written")
	}
}
