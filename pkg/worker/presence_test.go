package worker

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/version"
)

// heartbeats collects the heartbeats sent on a stage's subject.
type heartbeats struct {
	mu  sync.Mutex
	all []api.Heartbeat
}

func listen(t *testing.T, nc *nats.Conn, stage dtr.Stage) *heartbeats {
	t.Helper()
	hs := &heartbeats{}
	sub, err := nc.Subscribe(api.HeartbeatSubject(stage), func(m *nats.Msg) {
		var hb api.Heartbeat
		if _, err := codec.DecodeData(context.Background(), m, api.TypeHeartbeat, &hb); err != nil {
			t.Errorf("heartbeat: %v", err)
			return
		}
		hs.mu.Lock()
		hs.all = append(hs.all, hb)
		hs.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return hs
}

// wait returns the first heartbeat that ok takes, waiting up to 10 s.
func (hs *heartbeats) wait(t *testing.T, what string, ok func(api.Heartbeat) bool) api.Heartbeat {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		hs.mu.Lock()
		for _, hb := range hs.all {
			if ok(hb) {
				hs.mu.Unlock()
				return hb
			}
		}
		hs.mu.Unlock()
	}
	hs.mu.Lock()
	defer hs.mu.Unlock()
	t.Fatalf("no heartbeat %s within 10 s: %d heartbeats, the last %+v", what, len(hs.all), hs.all[max(0, len(hs.all)-1):])
	return api.Heartbeat{}
}

func TestAPoolIsAMicroServiceAndItsHeartbeatsNameTheGrantsItHolds(t *testing.T) {
	r := newRig(t)
	hs := listen(t, r.nc, dtr.StagePre)
	p, err := NewPool(r.nc, dtr.StagePre, 3, func(ctx context.Context, g api.Grant, _ func(int64, int64)) api.Result {
		<-ctx.Done()
		return api.Result{Error: &dtr.Failure{Kind: dtr.ErrInternalProcess, Text: "stopped"}}
	}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Heartbeat, p.Renew = 100*time.Millisecond, 300*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := p.Run(ctx); err != nil {
			t.Errorf("pool: %v", err)
		}
	}()
	defer func() { cancel(); <-done }()

	gs := r.grants(2, time.Now(), time.Minute)
	hb := hs.wait(t, "with 2 grants", func(hb api.Heartbeat) bool { return len(hb.Grants) == 2 })
	host, _ := os.Hostname()
	if hb.Worker == "" || hb.Worker != p.ID() || hb.Role != "processor" || hb.Stage != dtr.StagePre || hb.Host != host ||
		hb.PID != os.Getpid() || hb.Version != version.String() || hb.Workers != 3 || hb.Interval() != 100*time.Millisecond ||
		hb.Started.IsZero() || hb.Stopping {
		t.Errorf("heartbeat %+v", hb)
	}
	want := map[string]bool{gs[0].ID: true, gs[1].ID: true}
	for _, g := range hb.Grants {
		if !want[g.Grant] || g.State != dtr.QueryingReplica {
			t.Errorf("heartbeat holds %+v; the grants are %s and %s", g, gs[0].ID, gs[1].ID)
		}
	}

	// nats micro ls: the pool's service, its id the heartbeats' worker.
	m, err := r.nc.Request("$SRV.INFO.sluice-processor", nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(m.Data, &info); err != nil {
		t.Fatal(err)
	}
	if info.ID != hb.Worker || info.Version != version.SemVer() || info.Metadata["stage"] != "pre" ||
		info.Metadata["host"] != host || info.Metadata["pid"] != strconv.Itoa(os.Getpid()) || info.Metadata["workers"] != "3" {
		t.Errorf("micro service info %+v", info)
	}

	// The renewals name the worker too.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r.mu.Lock()
		var named bool
		for _, pr := range r.progress {
			named = named || pr.Worker == hb.Worker
		}
		r.mu.Unlock()
		if named {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no renewal names the worker")
		}
	}

	// Stopping, it gives the grants back and says so in a last heartbeat.
	cancel()
	<-done
	last := hs.wait(t, "that says it stops", func(hb api.Heartbeat) bool { return hb.Stopping })
	if len(last.Grants) != 0 {
		t.Errorf("the last heartbeat holds %v; every grant was given back", last.Grants)
	}
}
