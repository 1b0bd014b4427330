package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/version"
)

// A worker process shows itself: it registers once as a NATS micro service
// (sluice-processor or sluice-delivery, so `nats micro ls` lists it with
// its stages, host, pid and workers), whose instance id is the process's
// worker id, and each of its pools publishes a heartbeat (api.Heartbeat)
// every Heartbeat on sluice.heartbeat.<stage> with that id and the grants
// it holds, so that the scheduler knows who holds what and sees a worker
// that has gone silent before its grants' leases run out. The last
// heartbeat, as the pool stops, says so.
//
// One micro service per connection: NATS lets a user with
// allow_responses answer a request once, and every service on a
// connection would get each $SRV request.

// DefaultHeartbeat is how often a pool sends a heartbeat unless told.
const DefaultHeartbeat = 5 * time.Second

// Role returns the service that runs a stage's grants: "delivery" for the
// transfers, "processor" for the rest.
func Role(s dtr.Stage) string {
	if s == dtr.StageDelivery {
		return "delivery"
	}
	return "processor"
}

// Presence is a worker process's micro service, shared by its pools.
type Presence struct {
	svc micro.Service
}

// Show registers the pools, all of one role and on nc, as one micro
// service, whose instance id becomes their worker id. Stop it when they
// have stopped. A pool that runs without one shows itself alone.
func Show(nc *nats.Conn, pools ...*Pool) (*Presence, error) {
	if len(pools) == 0 {
		return nil, errors.New("no pools to show")
	}
	role := Role(pools[0].Stage)
	var stages, workers []string
	for _, p := range pools {
		if Role(p.Stage) != role {
			return nil, fmt.Errorf("pools of %s and %s in one process", role, Role(p.Stage))
		}
		stages, workers = append(stages, string(p.Stage)), append(workers, strconv.Itoa(p.Workers))
	}
	host, _ := os.Hostname()
	svc, err := micro.AddService(nc, micro.Config{
		Name:        "sluice-" + role,
		Version:     version.SemVer(),
		Description: fmt.Sprintf("Sluice %s: the grants of %s", role, strings.Join(stages, " and ")),
		Metadata: map[string]string{"stage": strings.Join(stages, ","), "host": host,
			"pid": strconv.Itoa(os.Getpid()), "workers": strings.Join(workers, ",")},
	})
	if err != nil {
		return nil, fmt.Errorf("%s micro service: %w", role, err)
	}
	started := time.Now()
	for _, p := range pools {
		p.mu.Lock()
		p.id, p.host, p.started, p.shown = svc.Info().ID, host, started, true
		p.mu.Unlock()
	}
	return &Presence{svc: svc}, nil
}

// Stop removes the micro service.
func (pr *Presence) Stop() { _ = pr.svc.Stop() }

// ID returns the pool's id (its micro service's instance id) once Run has
// started; "" before.
func (p *Pool) ID() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.id
}

// heartbeat returns the pool's heartbeat now.
func (p *Pool) heartbeat(every time.Duration, stopping bool) api.Heartbeat {
	hb := api.Heartbeat{Role: Role(p.Stage), Stage: p.Stage, PID: os.Getpid(), Version: version.String(),
		Workers: p.Workers, IntervalSeconds: every.Seconds(), Grants: []api.HeldGrant{}, Stopping: stopping}
	p.mu.Lock()
	hb.Worker, hb.Host, hb.Started = p.id, p.host, p.started
	for _, h := range p.held {
		hb.Grants = append(hb.Grants, api.HeldGrant{DTR: h.g.DTR.ID, Grant: h.g.ID, State: h.g.State})
	}
	p.mu.Unlock()
	slices.SortFunc(hb.Grants, func(a, b api.HeldGrant) int { return strings.Compare(a.Grant, b.Grant) })
	return hb
}

// heartbeats sends a heartbeat at once and then every Heartbeat until ctx
// ends, and a last one that says the pool is stopping. A heartbeat is a
// core NATS message: one that cannot be sent (NATS away) is not missed
// later, the next one says all.
func (p *Pool) heartbeats(ctx context.Context) {
	every := p.Heartbeat
	if every <= 0 {
		every = DefaultHeartbeat
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		p.sendHeartbeat(p.heartbeat(every, ctx.Err() != nil))
		if ctx.Err() != nil {
			return
		}
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
}

func (p *Pool) sendHeartbeat(hb api.Heartbeat) {
	ev, err := codec.NewEvent(api.TypeHeartbeat, "sluice/"+string(p.Stage), "", hb)
	if err == nil {
		var m *nats.Msg
		if m, err = codec.Encode(context.Background(), api.HeartbeatSubject(p.Stage), "", ev); err == nil {
			err = p.nc.PublishMsg(m)
		}
	}
	if err != nil && !hb.Stopping {
		p.Log.Debug("heartbeat not sent", "err", err)
	}
}
