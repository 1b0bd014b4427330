package scheduler

// A DTR's history for its owner (sluice.api.history) and the web page
// (GET /api/history/{id}).

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/services/scheduler/core"
)

// handleHistory answers sluice.api.history: a DTR's history, to its owner
// or an administrator; for anyone else, as for a DTR never seen or whose
// record has expired, the DTR is unknown.
func (s *Service) handleHistory(r micro.Request) {
	c, ok := s.requester(r, api.SubjectHistory, auth.ScopeRead)
	if !ok {
		return
	}
	id, err := uuid.Parse(strings.TrimSpace(string(r.Data())))
	if err != nil {
		_ = r.Error("400", fmt.Sprintf("DTR id %q is not a UUID", r.Data()), nil)
		return
	}
	reply, code, err := s.historyOf(context.Background(), id, c.Owns)
	if code == 404 {
		unknown(r, c, "DTR "+id.String()+" (never submitted, or its record has expired)")
		return
	}
	if err != nil {
		_ = r.Error(strconv.Itoa(code), err.Error(), nil)
		return
	}
	_ = r.RespondJSON(reply)
}

// historyOf reads the history of a DTR that owns says is the caller's
// (nil: anyone's); 404 if it is unknown or not the caller's, 503 if the
// store could not be read.
func (s *Service) historyOf(ctx context.Context, id uuid.UUID, owns func(dtr.Identity) bool) (api.HistoryReply, int, error) {
	d, _, _, from := s.lookupDTR(ctx, id)
	if from == "" || owns != nil && !owns(d.Owner) {
		return api.HistoryReply{}, 404, fmt.Errorf("%w: %s", core.ErrUnknownDTR, id)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	events, dropped, err := readHistory(ctx, s.js, id)
	if err != nil {
		return api.HistoryReply{}, 503, err
	}
	reply := api.HistoryReply{DTR: id, State: d.State, Events: events, Dropped: dropped}
	if len(events) == 0 {
		reply.Events = []api.HistoryEvent{}
		reply.Missing = s.historyMissing(time.Now(), d)
	}
	return reply, 200, nil
}

// historyMissing says why a DTR whose record is kept has no history.
func (s *Service) historyMissing(now time.Time, d dtr.DTR) string {
	switch {
	case s.cfg.HistoryOff:
		return "history not recorded: SLUICE_HISTORY_OFF is true"
	case now.Sub(d.Created) < historyNotYet:
		return "no events stored yet: the scheduler stores a DTR's events within a few seconds"
	case s.cfg.HistoryMaxBytes > 0:
		return fmt.Sprintf("history no longer kept: the history store holds the newest %d MiB of events (SLUICE_HISTORY_MAX_BYTES), and this DTR's were dropped to make room (or never stored: sluice_scheduler_history_dropped_total counts both)",
			s.cfg.HistoryMaxBytes>>20)
	}
	return "history no longer kept: dropped, or never stored (sluice_scheduler_history_dropped_total counts both)"
}

// historyNotYet is how long after its submission a DTR's history may not
// be stored yet.
const historyNotYet = time.Minute

// serveHistory answers GET /api/history/{id}: the DTR's history for the
// web page, its error texts redacted; 404 for an unknown DTR.
func (s *Service) serveHistory(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, webError{fmt.Sprintf("DTR id %q is not a UUID", r.PathValue("id"))})
		return
	}
	if !s.ready.Load() {
		writeJSON(w, http.StatusServiceUnavailable, webError{"the scheduler is not running now (starting, recovering or stopping); try again"})
		return
	}
	type answer struct {
		reply api.HistoryReply
		code  int
		err   error
	}
	ch := make(chan answer, 1)
	go func() { // the loop answers between two steps; a stuck loop must not hold the page
		var a answer
		a.reply, a.code, a.err = s.historyOf(context.WithoutCancel(r.Context()), id, nil)
		ch <- a
	}()
	var a answer
	select {
	case a = <-ch:
	case <-time.After(dtrLookupTimeout):
		writeJSON(w, http.StatusServiceUnavailable, webError{fmt.Sprintf("the scheduler did not look DTR %s up within %s (its loop is busy or stuck); try again", id, dtrLookupTimeout)})
		return
	}
	switch {
	case a.code == http.StatusNotFound:
		writeJSON(w, http.StatusNotFound, webError{fmt.Sprintf("DTR %s is not known to the scheduler: never submitted, or it ended and its record and history are gone (both are kept for SLUICE_RETENTION)", id)})
		return
	case a.err != nil:
		writeJSON(w, a.code, webError{a.err.Error()})
		return
	}
	for i := range a.reply.Events {
		if e := a.reply.Events[i].Error; e != nil {
			redacted := *e
			redacted.Text = dtr.RedactText(e.Text)
			a.reply.Events[i].Error = &redacted
		}
	}
	writeJSON(w, http.StatusOK, a.reply)
}
