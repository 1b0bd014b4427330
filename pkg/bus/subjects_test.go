package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestEnsureCreatesEverythingAndLeavesItAloneTheSecondTime(t *testing.T) {
	js := embeddedJS(t)
	nc := js.Conn()
	ctx := context.Background()
	if err := Ensure(ctx, js, Setup{}); err != nil {
		t.Fatal(err)
	}
	created := map[string]int64{}
	for _, name := range []string{StreamSubmit, StreamGrants, StreamResults, StreamEvents} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		created[name] = st.CachedInfo().Created.UnixNano()
	}
	for _, c := range [][2]string{{StreamSubmit, ConsumerSched}, {StreamResults, ConsumerSched}, {StreamEvents, ConsumerGen},
		{StreamGrants, "pre"}, {StreamGrants, "delivery"}, {StreamGrants, "post"}} {
		if _, err := js.Consumer(ctx, c[0], c[1]); err != nil {
			t.Fatalf("consumer %s on %s: %v", c[1], c[0], err)
		}
	}
	// A second Ensure changes nothing: JetStream announces no update and no
	// creation.
	advisories, err := nc.SubscribeSync("$JS.EVENT.ADVISORY.>")
	if err != nil {
		t.Fatal(err)
	}
	second := time.Now()
	if err := Ensure(ctx, js, Setup{}); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	for {
		m, err := advisories.NextMsg(200 * time.Millisecond)
		if err != nil {
			break
		}
		// The server sends advisories on its own time: one of the first
		// Ensure's may come only now. Its timestamp tells.
		var a struct {
			Timestamp time.Time `json:"timestamp"`
		}
		if json.Unmarshal(m.Data, &a) == nil && a.Timestamp.Before(second) {
			continue
		}
		if strings.Contains(m.Subject, "UPDATED") || strings.Contains(m.Subject, "CREATED") {
			t.Fatalf("the second Ensure changed something: %s", m.Subject)
		}
	}
	for name, at := range created {
		st, _ := js.Stream(ctx, name)
		if st.CachedInfo().Created.UnixNano() != at {
			t.Fatalf("stream %s was made again", name)
		}
	}
}

// embeddedJS returns JetStream on an embedded server that lives as long as
// the test.
func embeddedJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	ns, err := Embedded(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func TestADTRLeavesRoomInEveryMessageThatCarriesIt(t *testing.T) {
	tests := []struct {
		name       string
		maxPayload int64
		want       int
	}{
		{"NATS's default max_payload, 1MB: an eighth", 1 << 20, 128 << 10},
		{"the embedded server's and compose's 8MB: SLUICE_SUBMIT's 1 MiB", 8 << 20, MaxMessageBytes},
		{"64MB: still 1 MiB", 64 << 20, MaxMessageBytes},
		{"not connected yet: SLUICE_SUBMIT's 1 MiB", 0, MaxMessageBytes},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := MaxDTRBytes(tt.maxPayload); got != tt.want {
				t.Fatalf("MaxDTRBytes(%d) = %d, want %d", tt.maxPayload, got, tt.want)
			}
		})
	}
}

func freeTCPPort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestEnsureGivesEveryStreamAndBucketMoreCopiesOnAMoveToACluster: a
// deployment moved from one NATS server to a 3-node cluster sets
// SLUICE_STREAM_REPLICAS to 3; the buckets of DTR and job records get
// their copies too, or losing the one server that holds them loses them.
// While the streams are being given copies a consumer may be refused for
// a while (10126): the scheduler's set-up waits it out, as here.
func TestEnsureGivesEveryStreamAndBucketMoreCopiesOnAMoveToACluster(t *testing.T) {
	ports := []int{freeTCPPort(t), freeTCPPort(t), freeTCPPort(t)}
	var servers []*server.Server
	for i := range 3 {
		var routes []*url.URL
		for j, p := range ports {
			if j != i {
				u, _ := url.Parse(fmt.Sprintf("nats://127.0.0.1:%d", p))
				routes = append(routes, u)
			}
		}
		opts := &server.Options{ServerName: fmt.Sprintf("n%d", i), Host: "127.0.0.1", Port: -1, JetStream: true,
			StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
			Cluster: server.ClusterOpts{Name: "c", Host: "127.0.0.1", Port: ports[i]}, Routes: routes}
		ns, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go ns.Start()
		t.Cleanup(ns.Shutdown)
		servers = append(servers, ns)
	}
	for _, ns := range servers {
		if !ns.ReadyForConnections(10 * time.Second) {
			t.Fatal("not ready")
		}
	}
	nc, err := nats.Connect(servers[0].ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		err = Ensure(actx, js, Setup{Replicas: 1})
		acancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
		t.Log(err)
		time.Sleep(2 * time.Second)
	}
	for try := 1; ; try++ {
		err := Ensure(ctx, js, Setup{Replicas: 3})
		if err == nil {
			break
		}
		t.Logf("second Ensure, try %d: %v", try, err)
		if st, err := js.Stream(ctx, StreamSubmit); err == nil {
			ci := st.CachedInfo()
			t.Logf("SLUICE_SUBMIT replicas %d cluster %+v", ci.Config.Replicas, ci.Cluster)
		}
		if try == 60 {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
	}
	for _, name := range []string{StreamSubmit, "KV_" + BucketDTRs, "KV_" + BucketJobs} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if r := st.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("stream %s has %d replicas after Ensure with 3", name, r)
		}
	}
}

// TestASubmittersTokenOpensOnlyWithItsReference: an entry of the bucket
// of submitters' tokens, got by any key (as a wildcard direct get from
// the real server gets one), holds neither the token nor its reference,
// and opens only with that reference.
func TestASubmittersTokenOpensOnlyWithItsReference(t *testing.T) {
	js := embeddedJS(t)
	if err := Ensure(t.Context(), js, Setup{}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), BucketSubjectTokens)
	if err != nil {
		t.Fatal(err)
	}
	const ref, tok = "tREFERENCEOFALICESDTR", "eyJhbGciOi.alices-token.signature"
	sealed, err := SealSubjectToken(ref, []byte(tok))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), SubjectTokenKey(ref), sealed); err != nil {
		t.Fatal(err)
	}
	r, err := js.Conn().Request("$JS.API.DIRECT.GET.KV_"+BucketSubjectTokens+".$KV."+BucketSubjectTokens+".*", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Data) == 0 {
		t.Fatalf("the server answered a wildcard direct get with nothing (%v): this test no longer shows what a reader can get", r.Header)
	}
	for _, secret := range []string{tok, "alices-token", ref} {
		if strings.Contains(string(r.Data), secret) || strings.Contains(r.Header.Get("Nats-Subject"), secret) {
			t.Fatalf("the entry shows %q", secret)
		}
	}
	if got, err := OpenSubjectToken(ref, r.Data); err != nil || string(got) != tok {
		t.Fatalf("opened with its reference: %q, %v", got, err)
	}
	if _, err := OpenSubjectToken("tANOTHERREFERENCE", r.Data); err == nil {
		t.Fatal("the entry opened with another reference")
	}
}
