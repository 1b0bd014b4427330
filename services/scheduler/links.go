package scheduler

// The per-link optimizer's settings and the sluice.api.links endpoint.

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/micro"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// optimizerSwitch reads SLUICE_OPTIMIZER; "" (a Config made in code) is
// off.
var optimizerSwitch = map[string]bool{"on": true, "off": false, "": false}

// optimizerConfig turns the SLUICE_OPTIMIZER* settings into the core's;
// a bound left 0 takes its default.
func (c Config) optimizerConfig() (core.OptimizerConfig, error) {
	o := core.DefaultOptimizerConfig()
	on, ok := optimizerSwitch[strings.ToLower(strings.TrimSpace(c.Optimizer))]
	if !ok {
		return o, fmt.Errorf("SLUICE_OPTIMIZER: optimizer %q is neither on nor off", c.Optimizer)
	}
	o.Enabled = on
	for _, v := range []struct {
		to   *int
		from int
	}{{&o.Min, c.OptimizerMin}, {&o.Max, c.OptimizerMax}, {&o.Start, c.OptimizerStart}} {
		if v.from != 0 {
			*v.to = v.from
		}
	}
	if c.OptimizerInterval != 0 {
		o.Interval = c.OptimizerInterval
	}
	if err := o.Validate(); err != nil {
		return o, fmt.Errorf("SLUICE_OPTIMIZER_*: %w", err)
	}
	return o, nil
}

func (s *Service) handleLinks(r micro.Request) {
	c, ok := s.requester(r, api.SubjectLinks, auth.ScopeRead)
	if !ok {
		return
	}
	if !c.Admin {
		// The links name the storage endpoints of every user's transfers.
		_ = r.Error("403", fmt.Sprintf("%s: only operators and administrators may list the links (%s is not one; see SLUICE_ADMINS)", auth.ErrForbidden, c), nil)
		return
	}
	var req api.LinksRequest
	if len(r.Data()) > 0 {
		if err := json.Unmarshal(r.Data(), &req); err != nil {
			_ = r.Error("400", fmt.Sprintf("links request: %v", err), nil)
			return
		}
	}
	_ = r.RespondJSON(s.links(req.History))
}

// links is every link's state and the optimizer's settings.
func (s *Service) links(history bool) api.LinksReply {
	reply := api.LinksReply{MaxPerHost: s.cfg.MaxPerHost, Links: []api.LinkStatus{}}
	s.query(func() {
		o := s.core.Config().Optimizer
		reply.Enabled, reply.Min, reply.Max, reply.Start = o.Enabled, o.Min, o.Max, o.Start
		if l := s.core.Links(history); l != nil {
			reply.Links = l
		}
	})
	return reply
}
