package bus

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

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
