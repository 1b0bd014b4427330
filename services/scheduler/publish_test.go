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
