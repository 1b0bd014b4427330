package scheduler

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

func TestTheSameTransferHasTheSameDestinationAndTheSourcesKept(t *testing.T) {
	earlier := &dtr.DTR{Source: "http://b/f", Destination: "file:///d/f",
		Replicas: []string{"http://b/f", "http://a/f"}, Replica: 1} // as the core keeps it: sorted, Source moved on
	tests := []struct {
		name string
		d    dtr.DTR
		same bool
	}{
		{"the same source and replicas", dtr.DTR{Source: "http://a/f", Replicas: []string{"http://b/f"}, Destination: "file:///d/f"}, true},
		{"the replicas in another order", dtr.DTR{Source: "http://b/f", Replicas: []string{"http://a/f"}, Destination: "file:///d/f"}, true},
		{"a source repeated among the replicas", dtr.DTR{Source: "http://a/f", Replicas: []string{"http://a/f", "http://b/f"}, Destination: "file:///d/f"}, true},
		{"another destination", dtr.DTR{Source: "http://a/f", Replicas: []string{"http://b/f"}, Destination: "file:///d/g"}, false},
		{"a replica missing", dtr.DTR{Source: "http://a/f", Destination: "file:///d/f"}, false},
		{"a replica more (one the preferred pattern dropped)", dtr.DTR{Source: "http://a/f", Replicas: []string{"http://b/f", "http://c/f"}, Destination: "file:///d/f"}, true},
		{"another source altogether", dtr.DTR{Source: "http://c/f", Destination: "file:///d/f"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sameTransfer(earlier, &tt.d); got != tt.same {
				t.Fatalf("sameTransfer = %v, want %v", got, tt.same)
			}
		})
	}
}

func TestAResubmissionIsTheSameTransferWhateverThePreferredPatternDropped(t *testing.T) {
	for _, pattern := range []string{"", "b.example", "!a.example", "!c.example", "!example"} {
		t.Run(pattern, func(t *testing.T) {
			cfg := core.DefaultConfig()
			cfg.PreferredPattern = pattern
			c := core.New(cfg)
			submitted := func() *dtr.DTR {
				return &dtr.DTR{ID: uuid.MustParse("6ba7b810-9dad-11d1-80b4-00c04fd430c8"), Source: "https://a.example/f",
					Replicas: []string{"https://b.example/f", "https://c.example/f"}, Destination: "file:///d/f"}
			}
			if err := c.Submit(time.Now(), submitted()); err != nil {
				t.Fatal(err)
			}
			held, ok := c.Get(submitted().ID)
			if !ok {
				t.Fatal("the core does not hold the DTR")
			}
			if !sameTransfer(&held, submitted()) {
				t.Fatalf("the DTR as held (%s, replicas %v) is not the one submitted again", held.Source, held.Replicas)
			}
		})
	}
}

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

// DecodeSubmit refuses a job_id the generator cannot use as a key (see
// pkg/dtr) and a null body as such, and carries a ce-traceparent as the
// DTR's trace parent only when it is a valid one.
func TestDecodeSubmitRefusesBadJobIDsAndDropsBadTraceParents(t *testing.T) {
	const (
		good = `{"id":"6c1d8ea0-43a5-4f4c-9a55-1b8f4a0f7e42","source":"file:///a","destination":"file:///b"`
		tp   = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	)
	binary := func(body, traceparent string) *nats.Msg {
		m := nats.NewMsg(api.SubjectSubmit)
		m.Header.Set("ce-specversion", "1.0")
		m.Header.Set("ce-id", "1")
		m.Header.Set("ce-source", "test")
		m.Header.Set("ce-type", api.TypeSubmit)
		if traceparent != "" {
			m.Header.Set("ce-traceparent", traceparent)
		}
		m.Data = []byte(body)
		return m
	}
	plain := func(body string) *nats.Msg { m := nats.NewMsg(api.SubjectSubmit); m.Data = []byte(body); return m }
	tests := []struct {
		name    string
		msg     *nats.Msg
		wantErr string
		wantTP  string
	}{
		{"a job id", plain(good + `,"job_id":"reco-42"}`), "", ""},
		{"a job id with a space", plain(good + `,"job_id":"reco 42"}`), `job_id "reco 42" is not 1–64 characters`, ""},
		{"a job id with a dot", plain(good + `,"job_id":"victim.f"}`), `job_id "victim.f"`, ""},
		{"null", plain(`null`), "DTR JSON: null is not a JSON object", ""},
		{"a valid traceparent is kept", binary(good+`}`, tp), "", tp},
		{"a traceparent of zeros is dropped", binary(good+`}`, "00-00000000000000000000000000000000-0000000000000000-00"), "", ""},
		{"a traceparent that is not one is dropped", binary(good+`}`, "garbage"), "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := DecodeSubmit(context.Background(), tt.msg)
			if tt.wantErr != "" {
				if d != nil || err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, %v, want an error saying %q", d, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.TraceParent != tt.wantTP {
				t.Fatalf("trace parent %q, want %q", d.TraceParent, tt.wantTP)
			}
		})
	}
}
