package scheduler

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// A grant sent with its DTR's record bytes reads back as the bus.Grant the
// worker expects, field for field.
func TestAGrantOnTheWireIsABusGrant(t *testing.T) {
	d := dtr.DTR{ID: uuid.New(), Source: "file:///a", Destination: "file:///b", State: dtr.Transferring,
		Grant: "x.3", Created: time.Date(2026, 11, 24, 1, 2, 3, 0, time.UTC), Error: &dtr.Failure{Kind: dtr.ErrTemporaryRemote, Text: "503"}}
	rec, err := json.Marshal(&d)
	if err != nil {
		t.Fatal(err)
	}
	want := bus.Grant{Grant: "x.3", Stage: dtr.StageDelivery, State: dtr.Transferring, DTR: d, LeaseSeconds: 120,
		Cleanup: true, Emergency: true, TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	b, err := grantWire{Grant: want.Grant, Stage: want.Stage, State: want.State, LeaseSeconds: 120,
		Cleanup: true, Emergency: true, TraceParent: want.TraceParent}.encode(rec)
	if err != nil {
		t.Fatal(err)
	}
	var got bus.Grant
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
	}
	if !json.Valid(b) {
		t.Fatalf("not JSON: %s", b)
	}
}
