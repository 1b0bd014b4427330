package codec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// FuzzDecodeDataRefusesWithAReasonOrGivesAValidEventOfItsType decodes any
// message, with any body and any values of the headers that matter, as
// the workers decode grants and the scheduler results. It checks that
// Decode and DecodeData do not panic; that Decode gives an event or an
// error, never neither, and ErrNotCloudEvent exactly for a message with
// neither ce-specversion nor a structured content type; that every error
// has a message; and that a decoded event is valid, of the type asked for,
// and its data, encoded again as Sluice encodes it, decodes to the same.
func FuzzDecodeDataRefusesWithAReasonOrGivesAValidEventOfItsType(f *testing.F) {
	grant := `{"grant":"g.1","stage":"delivery","state":"TRANSFERRING","dtr":{"id":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","source":"file:///a","destination":"file:///b","state":"TRANSFER","created":"2024-03-17T10:00:00Z","updated":"2024-03-17T10:00:01.5+02:00"},"lease_seconds":120,"emergency":true}`
	result := `{"dtr":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","grant":"g.1","state":"transferred","error":{"kind":"TEMPORARY_REMOTE","text":"HTTP 503","state":"TRANSFERRING","location":"source"},"size":10,"bytes":10,"checksum":"adler32:0a1b2c3d","started":"2024-03-17T10:00:00Z"}`
	structured := func(typ, data string) string {
		return `{"specversion":"1.0","id":"1","source":"sluice/scheduler","type":"` + typ + `","time":"2024-03-17T10:00:00Z","datacontenttype":"application/json","data":` + data + `}`
	}
	for _, s := range []struct{ body, ct, typ, spec, id, source, time string }{
		{grant, "application/json", api.TypeGrant, "1.0", "1", "sluice/scheduler", "2024-03-17T10:00:00Z"},
		{result, "application/json", api.TypeResult, "1.0", "2", "sluice/delivery", ""},
		{grant, "application/json", api.TypeResult, "1.0", "3", "s", ""},
		{`{"lease_seconds":1e400}`, "application/json", api.TypeGrant, "1.0", "4", "s", ""},
		{`{"state":"NOT_A_STATE"}`, "application/json", api.TypeGrant, "1.0", "4", "s", ""},
		{`{"dtr":{"created":"10000-01-01T00:00:00Z"}}`, "application/json", api.TypeGrant, "1.0", "4", "s", ""},
		{`{"grant":"g","unknown":1}`, "", api.TypeGrant, "1.0", "5", "s", "yesterday"},
		{grant, "", api.TypeGrant, "0.3", "6", "s", ""},
		{grant, "", api.TypeGrant, "9.9", "7", "s", ""},
		{grant, "", api.TypeGrant, "1.0", "", "s", ""},
		{"", "", api.TypeGrant, "1.0", "8", "s", ""},
		{structured(api.TypeGrant, grant), "application/cloudevents+json", "", "", "", "", ""},
		{structured(api.TypeResult, result), "application/cloudevents+json; charset=utf-8", "", "", "", "", ""},
		{`{"specversion":"1.0","id":"1","source":"s","type":"` + api.TypeGrant + `","data_base64":"e30="}`, "application/cloudevents+json", "", "", "", "", ""},
		{`{{`, "application/cloudevents+json", "", "", "", "", ""},
		{grant, "", "", "", "", "", ""},
		{`{"grants":[` + grant + `,` + grant + `]}`, "application/json", api.TypeGrants, "1.0", "9", "sluice/scheduler", ""},
		{`{"results":[` + result + `]}`, "application/json", api.TypeResults, "1.0", "10", "sluice/pre", ""},
		{`{"results":null}`, "application/json", api.TypeResults, "1.0", "11", "s", ""},
		{`{"grants":[{}, 1]}`, "application/json", api.TypeGrants, "1.0", "12", "s", ""},
		{structured(api.TypeGrants, `{"grants":[`+grant+`]}`), "application/cloudevents+json", "", "", "", "", ""},
		{`{"dtrs":[{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","dtr":{"id":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","state":"DONE"}},{"dtr":{}}]}`, "application/json", api.TypeDTRFinals, "1.0", "13", "sluice/scheduler", ""},
		{`{"id":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","state":"DONE"}`, "application/json", api.TypeDTRFinal, "1.0", "14", "sluice/scheduler", ""},
		{`{"dtrs":[{"dtr":1}]}`, "application/json", api.TypeDTRFinals, "1.0", "15", "s", ""},
	} {
		f.Add([]byte(s.body), s.ct, s.typ, s.spec, s.id, s.source, s.time)
	}
	f.Fuzz(func(t *testing.T, body []byte, contentType, ceType, specVersion, ceID, ceSource, ceTime string) {
		m := nats.NewMsg("sluice.grant.delivery")
		for k, v := range map[string]string{"content-type": contentType, "ce-type": ceType, "ce-specversion": specVersion,
			"ce-id": ceID, "ce-source": ceSource, "ce-time": ceTime} {
			if v != "" {
				m.Header[k] = []string{v}
			}
		}
		m.Data = body
		ctx := context.Background()
		ev, err := Decode(ctx, m)
		if (ev == nil) == (err == nil) {
			t.Fatalf("Decode gave event %v and error %v: want exactly one", ev, err)
		}
		notCE := specVersion == "" && !strings.HasPrefix(contentType, "application/cloudevents+json")
		if errors.Is(err, ErrNotCloudEvent) != notCE {
			t.Fatalf("Decode's error %v for specversion %q and content type %q", err, specVersion, contentType)
		}
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("Decode refused without a reason")
			}
		} else if verr := ev.Validate(); verr != nil {
			t.Fatalf("Decode gave an invalid event: %v", verr)
		}
		var g api.Grant
		checkDecodeData(t, m, api.TypeGrant, &g, func() any { return new(api.Grant) })
		var r api.Result
		checkDecodeData(t, m, api.TypeResult, &r, func() any { return new(api.Result) })
		var gs api.Grants
		checkDecodeData(t, m, api.TypeGrants, &gs, func() any { return new(api.Grants) })
		var rs api.Results
		checkDecodeData(t, m, api.TypeResults, &rs, func() any { return new(api.Results) })
		// The hot paths read grants, results and final DTRs with
		// DecodeJSON (goccy/go-json): it takes and refuses what
		// encoding/json does, and reads the same.
		if ev != nil {
			for _, v := range []func() any{func() any { return new(api.Grants) }, func() any { return new(api.Results) },
				func() any { return new(api.Finals) }, func() any { return new(dtr.DTR) }} {
				std, fast := v(), v()
				errStd, errFast := json.Unmarshal(ev.Data(), std), DecodeJSON(ev.Data(), fast)
				if (errStd == nil) != (errFast == nil) {
					t.Fatalf("%T: encoding/json says %v, DecodeJSON %v", std, errStd, errFast)
				}
				if errStd == nil && !reflect.DeepEqual(std, fast) {
					t.Fatalf("%T read differently:\nencoding/json %+v\nDecodeJSON    %+v", std, std, fast)
				}
				// And written again, EncodeJSON writes what encoding/json does.
				if errStd == nil {
					want, errW := json.Marshal(std)
					got, errG := EncodeJSON(std)
					if (errW == nil) != (errG == nil) || string(got) != string(want) {
						t.Fatalf("%T written differently:\nencoding/json %s (%v)\nEncodeJSON    %s (%v)", std, want, errW, got, errG)
					}
				}
			}
		}
		// Final DTRs: refused with a reason, or each with the JSON it
		// was read from.
		fs, err := DecodeFinals(ctx, m)
		if err != nil && strings.TrimSpace(err.Error()) == "" {
			t.Fatal("DecodeFinals refused without a reason")
		}
		for _, f := range fs {
			var d dtr.DTR
			if err := json.Unmarshal(f.Data, &d); err != nil || d.ID != f.DTR.ID || d.State != f.DTR.State {
				t.Fatalf("a final DTR %+v that its data %q does not give: %v", f.DTR, f.Data, err)
			}
		}
	})
}

// checkDecodeData decodes m into v as typ and, if it is taken, encodes v
// again and checks that it decodes to the same.
func checkDecodeData(t *testing.T, m *nats.Msg, typ string, v any, fresh func() any) {
	t.Helper()
	ctx := context.Background()
	ev, err := DecodeData(ctx, m, typ, v)
	if err != nil {
		if strings.TrimSpace(err.Error()) == "" {
			t.Fatalf("DecodeData(%s) refused without a reason", typ)
		}
		return
	}
	if ev == nil || ev.Type() != typ || ev.Validate() != nil {
		t.Fatalf("DecodeData(%s) gave event %v", typ, ev)
	}
	want, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%s data taken that does not encode again: %v", typ, err)
	}
	again, err := NewEvent(typ, "sluice/test", "", v)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := Encode(ctx, "x", "", again)
	if err != nil {
		t.Fatal(err)
	}
	v2 := fresh()
	if _, err := DecodeData(ctx, m2, typ, v2); err != nil {
		t.Fatalf("%s data taken, encoded again, refused: %v\n%s", typ, err, want)
	}
	got, _ := json.Marshal(v2)
	if !bytes.Equal(got, want) {
		t.Fatalf("%s data changed on the way round:\n%s\n%s", typ, want, got)
	}
}

// FuzzDecodeJSONStrictAgreesWithEncodingJSON checks the strict decoder of
// submitted DTRs against a json.Decoder with DisallowUnknownFields and one
// value only: both take the same inputs, to the same DTR, and refuse the
// same ones.
func FuzzDecodeJSONStrictAgreesWithEncodingJSON(f *testing.F) {
	for _, s := range []string{
		`{"source":"file:///a","destination":"file:///b","owner":{"dn":"/CN=x","fqans":["/atlas"]},"priority":70}`,
		`{"id":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","source":"http://h/f","destination":"file:///b","replicas":["http://r/f"],"options":{"checksum":"adler32:0a1b2c3d","overwrite":true}}`,
		`{"source":"a","sauce":"b"}`, `{"SOURCE":"a"}`, `{"source":"a"} {}`, `{"source":"a"} x`, `{"source":"a"}   `,
		`{"source":"a","source":"b"}`, `{"priority":1e3}`, `{"priority":"7"}`, `{"owner":null}`, `null`, `[]`, ``,
		`{"source":"\ud800"}`, "{\"source\":\"\xff\"}", `{"id":"x"}`, `{"options":{"stage":true,"cache":false}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var fast, slow dtr.Submission
		errFast := DecodeJSONStrict(data, &fast)
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		errSlow := dec.Decode(&slow)
		if errSlow == nil {
			if _, err := dec.Token(); err == nil || !errors.Is(err, io.EOF) {
				errSlow = errors.New("trailing data")
			}
		}
		if (errFast == nil) != (errSlow == nil) {
			t.Fatalf("%q: strict decoder says %v, encoding/json %v", data, errFast, errSlow)
		}
		if errFast == nil && !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%q: strict decoder gives %+v, encoding/json %+v", data, fast, slow)
		}
	})
}
