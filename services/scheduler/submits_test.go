package scheduler

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/api"
)

func TestASubmitsEventTakesEachDTROrRefusesItAlone(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	good := func(n int) string {
		return fmt.Sprintf(`{"id":"%s","source":"file:///a/%d","destination":"file:///b/%d"}`, uuid.New(), n, n)
	}
	submits := func(data string) *nats.Msg {
		m := nats.NewMsg(api.SubjectSubmit)
		m.Header.Set("ce-specversion", "1.0")
		m.Header.Set("ce-id", "1")
		m.Header.Set("ce-source", "test")
		m.Header.Set("ce-type", api.TypeSubmits)
		m.Header.Set("content-type", "application/json")
		m.Data = []byte(data)
		return m
	}
	big := fmt.Sprintf(`{"id":"%s","source":"file:///a/%s","destination":"file:///b/x"}`, uuid.New(), strings.Repeat("x", 300))
	tests := []struct {
		name    string
		data    string
		wantErr string   // the whole message refused
		want    []string // per DTR: "" taken, else part of its error
		wantTPs []string
	}{
		{"every DTR good", `{"dtrs":[{"traceparent":"` + tp + `","dtr":` + good(1) + `},{"dtr":` + good(2) + `}]}`, "",
			[]string{"", ""}, []string{tp, ""}},
		{"a bad DTR among good ones", `{"dtrs":[{"dtr":` + good(1) + `},{"dtr":{"id":"x","source":"file:///a","destination":"file:///b"}},{"dtr":` + good(3) + `}]}`, "",
			[]string{"", "dtrs[1]: DTR JSON: invalid UUID", ""}, nil},
		{"a DTR with a field the scheduler owns", `{"dtrs":[{"dtr":` + strings.TrimSuffix(good(1), "}") + `,"state":"DONE"}}]}`, "",
			[]string{`dtrs[0]: DTR JSON: json: unknown field "state"`}, nil},
		{"a DTR larger than a DTR may be", `{"dtrs":[{"dtr":` + big + `},{"dtr":` + good(2) + `}]}`, "",
			[]string{"dtrs[0]: the DTR is", ""}, nil},
		{"a traceparent that is not one is dropped", `{"dtrs":[{"traceparent":"garbage","dtr":` + good(1) + `}]}`, "",
			[]string{""}, []string{""}},
		{"no DTRs", `{"dtrs":[]}`, "without DTRs", nil, nil},
		{"not JSON", `{"dtrs":`, "org.sluice.dtr.submits.v1 data", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			subs, err := DecodeSubmits(context.Background(), submits(tt.data), 200)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(subs) != len(tt.want) {
				t.Fatalf("%d DTRs, want %d", len(subs), len(tt.want))
			}
			for i, want := range tt.want {
				switch {
				case want == "" && subs[i].Err != nil:
					t.Errorf("DTR %d refused: %v", i, subs[i].Err)
				case want != "" && (subs[i].Err == nil || !strings.Contains(subs[i].Err.Error(), want)):
					t.Errorf("DTR %d: error %v, want one saying %q", i, subs[i].Err, want)
				}
				if i < len(tt.wantTPs) && subs[i].TraceParent != tt.wantTPs[i] {
					t.Errorf("DTR %d: trace parent %q, want %q", i, subs[i].TraceParent, tt.wantTPs[i])
				}
			}
		})
	}
}

func TestASubmitsEventIsKnownWhateverTheCaseOfItsHeaders(t *testing.T) {
	one := fmt.Sprintf(`{"id":"%s","source":"file:///a/1","destination":"file:///b/1"}`, uuid.New())
	for _, typeHeader := range []string{"ce-type", "Ce-Type", "CE-TYPE"} {
		t.Run(typeHeader, func(t *testing.T) {
			m := nats.NewMsg(api.SubjectSubmit)
			m.Header[typeHeader] = []string{api.TypeSubmits}
			m.Header["Ce-Specversion"] = []string{"1.0"}
			m.Header["Ce-Id"] = []string{"1"}
			m.Header["Ce-Source"] = []string{"test"}
			m.Header["Content-Type"] = []string{"application/json"}
			m.Data = []byte(`{"dtrs":[{"dtr":` + one + `}]}`)
			subs, err := DecodeSubmits(context.Background(), m, 1<<20)
			if err != nil || len(subs) != 1 || subs[0].Err != nil {
				t.Fatalf("got %+v, %v; want the one DTR taken", subs, err)
			}
		})
	}
}
