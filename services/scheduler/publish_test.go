package scheduler

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// grants writes a grant without its DTR and appends the DTR's record
// bytes (api.AppendDTR), as encoded for the journal.
func TestAGrantOnTheWire(t *testing.T) {
	d := dtr.DTR{ID: uuid.New(), Source: "file:///a", Destination: "file:///b", State: dtr.Transferring,
		Grant: "x.3", Created: time.Date(2026, 11, 24, 1, 2, 3, 0, time.UTC), Error: &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "503"}}
	rec, err := json.Marshal(&d)
	if err != nil {
		t.Fatal(err)
	}
	want := api.Grant{ID: "x.3", Stage: dtr.StageDelivery, State: dtr.Transferring, DTR: &d, LeaseSeconds: 120,
		Cleanup: true, Emergency: true, TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	without := want
	without.DTR = nil
	b, err := codec.EncodeJSON(without)
	if err != nil {
		t.Fatal(err)
	}
	b = api.AppendDTR(b, rec)

	t.Run("reads back as the api.Grant the worker expects, field for field", func(t *testing.T) {
		var got api.Grant
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
		}
	})
	t.Run("is the bytes encoding/json writes for the whole grant", func(t *testing.T) {
		whole, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, whole) {
			t.Fatalf("appended\n%s\nencoding/json\n%s", b, whole)
		}
	})
}

// TestTheStateChangesOfStepsSettledTogetherGoInOneNoticeUpToItsSize: the
// changes of consecutive steps share a notice, in order, until the next
// step's would take it past its size; a step's own changes are never split.
func TestTheStateChangesOfStepsSettledTogetherGoInOneNoticeUpToItsSize(t *testing.T) {
	step := func(n int) *commit {
		c := &commit{}
		for range n {
			c.changes = append(c.changes, api.StateChange{DTR: uuid.New(), JobID: "job", State: dtr.Transferring, Share: "share"})
		}
		return c
	}
	one := 120 + len("job") + len("share") // a change, as stateNotices reckons it
	tests := []struct {
		name     string
		steps    []int // changes of each step
		maxBytes int
		want     []int // changes of each notice
	}{
		{"none", []int{0, 0}, 100 * one, nil},
		{"all in one", []int{1, 0, 2, 1}, 100 * one, []int{4}},
		{"split between steps at the size", []int{2, 2, 2}, 5 * one, []int{4, 2}},
		{"a step larger than a notice goes whole and alone", []int{1, 6, 1}, 3 * one, []int{1, 6, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cs []*commit
			var all []api.StateChange
			for _, n := range tt.steps {
				c := step(n)
				cs, all = append(cs, c), append(all, c.changes...)
			}
			var got []int
			var heard []api.StateChange
			for _, m := range stateNotices(t.Context(), cs, tt.maxBytes) {
				var ch api.StateChanges
				if _, err := codec.DecodeData(t.Context(), m, api.TypeDTRStates, &ch); err != nil {
					t.Fatal(err)
				}
				got, heard = append(got, len(ch.Changes)), append(heard, ch.Changes...)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("notices of %v changes, want %v", got, tt.want)
			}
			if len(heard) != len(all) || len(all) > 0 && !reflect.DeepEqual(heard, all) {
				t.Errorf("the notices hold %d changes, want the %d of the steps in order", len(heard), len(all))
			}
		})
	}
}
