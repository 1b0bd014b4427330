package generator

// Final DTRs: counted into their job's record once each, and the job's end
// announced (with the downloads of a failed job cancelled).

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/codec"
	"github.com/sluice-dtr/sluice/pkg/bus/tracing"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// final is a final DTR taken from SLUICE_EVENTS, with whether it is
// recorded here for the first time.
type final struct {
	d     *dtr.DTR
	fresh bool
}

// finalsKey is the key under which one finals event's DTRs of one job are
// stored: "<job>.f." and a digest of their ids, so that the same event
// delivered again finds its key taken, while the same DTRs announced again
// in another grouping (after a scheduler restart) are stored again.
func finalsKey(jobID string, fs []*final) string {
	h := sha256.New()
	for _, f := range fs {
		h.Write(f.d.ID[:])
	}
	return jobID + ".f." + hex.EncodeToString(h.Sum(nil)[:16])
}

// onFinals records final DTRs in their jobs and ends each job whose last
// DTR is among them. The DTRs of one job in one finals event are stored
// together under finalsKey, one DTR's JSON per line (created once: a
// redelivered event finds its key taken), then each job's record counts
// the fresh ones in one update. A DTR stored twice, in two groupings, is
// counted twice until the job's count reaches its total; the stored final
// DTRs, each taken once, decide then.
func (s *Service) onFinals(ctx context.Context, ms []jetstream.Msg) error {
	byJob := map[string][]*final{}
	var jobs []string
	var stored [][]*final // the finals of each create, in order
	out := bus.NewBatch(ctx, s.js)
	out.Refused = func(i int, err error) error {
		var api *jetstream.APIError
		if errors.As(err, &api) && (api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			for _, f := range stored[i] {
				f.fresh = false // seen before, but the count may have missed them
			}
			return nil
		}
		return err
	}
	for _, jm := range ms {
		msg := bus.Msg(jm)
		finals, err := codec.DecodeFinals(ctx, msg)
		if err != nil {
			s.log.Error("malformed final DTR event dropped", "err", err)
			continue
		}
		inMsg := map[string][]*final{}
		data := map[string][][]byte{}
		var order []string
		for i := range finals {
			d := &finals[i].DTR
			if tracing.Installed() {
				// The last span of the DTR's trace.
				_, span := tracing.StartConsumerOf(ctx, finals[i].TraceParent, msg.Subject, d.ID.String()+".final", "process")
				tracing.SetDTR(span, d, "")
				tracing.SetResult(span, d.Bytes, finalFailure(d))
				span.End()
			}
			if d.JobID == "" {
				continue // a DTR published directly, not part of a job
			}
			ids, err := s.memberIDs(ctx, d.JobID)
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				continue // a job_id that no job submitted here has: the publisher's own grouping
			}
			if err != nil {
				return fmt.Errorf("read job %s: %w", d.JobID, err)
			}
			if _, ok := ids[d.ID]; !ok {
				s.log.Debug("final DTR with the job's id but not one of its DTRs", "job", d.JobID, "dtr", d.ID)
				continue
			}
			if _, ok := inMsg[d.JobID]; !ok {
				order = append(order, d.JobID)
			}
			f := &final{d: d, fresh: true}
			inMsg[d.JobID] = append(inMsg[d.JobID], f)
			data[d.JobID] = append(data[d.JobID], finals[i].Data) // the DTR's JSON, as the scheduler wrote it
		}
		for _, jobID := range order {
			fs := inMsg[jobID]
			m := nats.NewMsg("$KV." + bus.BucketJobs + "." + finalsKey(jobID, fs))
			m.Data = bytes.Join(data[jobID], []byte{'\n'})
			// A create: refused if the key has a value already.
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
			stored = append(stored, fs)
			if _, ok := byJob[jobID]; !ok {
				jobs = append(jobs, jobID)
			}
			byJob[jobID] = append(byJob[jobID], fs...)
			out.Add(m)
		}
	}
	if err := out.Wait(ctx); err != nil {
		return fmt.Errorf("store final DTRs: %w", err)
	}
	for _, jobID := range jobs {
		if err := s.recordFinals(ctx, jobID, byJob[jobID]); err != nil {
			return err
		}
	}
	return nil
}

// recordFinals counts a job's fresh final DTRs in its record, cancels the
// job's other downloads after its first failed one, and ends the job when
// every DTR is final.
func (s *Service) recordFinals(ctx context.Context, jobID string, fs []*final) error {
	s.mu.Lock()
	s.lastFinal[jobID] = time.Now()
	s.mu.Unlock()
	stale := false
	for _, f := range fs {
		// Seen before: the count may or may not have it. The reconcile
		// loop counts the job again from what is stored, once for any
		// number of such redeliveries.
		stale = stale || !f.fresh
	}
	if stale {
		s.suspect(jobID)
	}
	var first *dtr.DTR // the job's first failed download, if among these
	var counted []*dtr.DTR
	rec, err := s.update(ctx, jobID, func(r *Record) error {
		first, counted = nil, counted[:0]
		if r.Announced {
			return errUnchanged // ended: finals announced again change nothing
		}
		for _, f := range fs {
			if !f.fresh {
				continue
			}
			counted = append(counted, f.d)
			failed := r.DownloadFailed
			count(r, f.d)
			if !failed && r.DownloadFailed {
				first = f.d
			}
		}
		return nil
	})
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		s.log.Warn("final DTRs of an unknown job", "job", jobID, "dtrs", len(fs))
		return nil
	}
	if err != nil {
		return err
	}
	for _, d := range counted {
		s.dtrs.Add(ctx, 1, dtrEvent(d.State))
	}
	// The first failed download cancels the others. After a redelivery the
	// cancels are sent again, in case the first try died before: the
	// scheduler takes each once.
	for _, f := range fs {
		d := f.d
		failedDownload := d.State == dtr.Error && !d.Options.FailureAllowed && d.Direction == dtr.Download
		if failedDownload && (d == first || !f.fresh) {
			if err := s.cancelDownloads(ctx, jobID, d.ID); err != nil {
				return err
			}
		}
	}
	if rec.Final() >= rec.Total && !rec.Announced {
		// Counts kept by several generator replicas can run ahead of the
		// truth; the stored final DTRs decide whether the job has ended.
		// They are read once for the count and the announcement (again
		// if another replica changes the record meanwhile).
		finals, err := s.finals(ctx, jobID)
		if err != nil {
			return err
		}
		again := false
		rec, err = s.update(ctx, jobID, func(r *Record) error {
			if again {
				if finals, err = s.finals(ctx, jobID); err != nil {
					return err
				}
			}
			again = true
			recountFrom(r, finals)
			return nil
		})
		if err != nil {
			return err
		}
		if rec.Final() >= rec.Total && !rec.Announced {
			return s.announce(ctx, jobID, finals)
		}
	}
	return nil
}

// count adds one final DTR to a job record.
func count(r *Record, d *dtr.DTR) {
	switch d.State {
	case dtr.Done:
		r.Done++
	case dtr.Cancelled:
		r.Cancelled++
	default:
		r.Failed++
	}
	if d.State == dtr.Error && !d.Options.FailureAllowed {
		reason := "unknown error"
		if d.Error != nil {
			reason = d.Error.Text
		}
		if len(r.Failures) < keptFailures {
			r.Failures = append(r.Failures, failureLine(d.Source, reason))
		}
		if d.Direction == dtr.Download {
			r.DownloadFailed = true
		}
	}
}

// maxFailureLine bounds a failure line, so that a job record of
// keptFailures lines stays well within a message (32 KiB of them).
const maxFailureLine = 320

// failureLine is ARC's "Failed in data staging" line for a failed DTR, its
// source and reason shortened to fit maxFailureLine.
func failureLine(source, reason string) string {
	const prefix = "Failed in data staging: "
	room := maxFailureLine - len(prefix) - len(": ")
	// Redacted before it is shortened: a cut can split a URL's password
	// from the '@' that marks it.
	source = shorten(dtr.RedactText(source), room/2)
	return prefix + source + ": " + shorten(dtr.RedactText(reason), room-len(source))
}

// shorten cuts s to at most n bytes, on a rune boundary, marking the cut.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// recount sets a job record's counts from the final DTRs stored for it.
func (s *Service) recount(ctx context.Context, jobID string, r *Record) error {
	finals, err := s.finals(ctx, jobID)
	if err != nil {
		return err
	}
	recountFrom(r, finals)
	return nil
}

// recountFrom sets a job record's counts from its final DTRs.
func recountFrom(r *Record, finals map[uuid.UUID]*dtr.DTR) {
	ds := make([]*dtr.DTR, 0, len(finals))
	for _, d := range finals {
		ds = append(ds, d)
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].Ended.Before(ds[j].Ended) })
	r.Done, r.Failed, r.Cancelled, r.Failures, r.DownloadFailed = 0, 0, 0, nil, false
	for _, d := range ds {
		count(r, d)
	}
}

// cancelDownloads cancels every download of a job but the failed one; the
// scheduler ignores cancels for DTRs that are already final.
func (s *Service) cancelDownloads(ctx context.Context, jobID string, failed uuid.UUID) error {
	var refs []api.FileRef
	if _, err := s.get(ctx, jobID+".files", &refs); err != nil {
		return err
	}
	var ids []uuid.UUID
	for _, ref := range refs {
		if ref.Direction == dtr.Download && ref.DTR != failed {
			ids = append(ids, ref.DTR)
		}
	}
	s.log.Info("download failed: cancelling the job's other downloads", "job", jobID, "downloads", len(ids))
	return s.cancelDTRs(ctx, jobID, ids, "another download of job "+jobID+" failed")
}

// cancelDTRs asks the scheduler to cancel DTRs of a job, for reason.
func (s *Service) cancelDTRs(ctx context.Context, jobID string, ids []uuid.UUID, reason string) error {
	out := bus.NewBatch(ctx, s.js)
	for _, id := range ids {
		ev, err := codec.NewEvent(api.TypeCancel, "sluice/generator", id.String(), api.Cancel{DTR: id, Reason: reason})
		if err != nil {
			return err
		}
		m, err := codec.Encode(ctx, api.SubjectCancelCommand, "cancel."+id.String(), ev)
		if err != nil {
			return err
		}
		out.Add(m)
	}
	if err := out.Wait(ctx); err != nil {
		return fmt.Errorf("cancel DTRs of job %s: %w", jobID, err)
	}
	return nil
}

// announce publishes the job's end with per-file statistics (of finals,
// the job's final DTRs, or read if nil) and marks the job announced.
func (s *Service) announce(ctx context.Context, jobID string, finals map[uuid.UUID]*dtr.DTR) error {
	ev, err := s.status(ctx, jobID, finals)
	if err != nil {
		return err
	}
	ev.State = api.JobFinished
	for _, f := range ev.Files {
		if f.State != dtr.Done && !f.FailureAllowed {
			ev.State = api.JobFailed
		}
	}
	ev.Ended = time.Now().UTC()
	subject, typ := api.SubjectJobFinished, api.TypeJobFinished
	if ev.State == api.JobFailed {
		subject, typ = api.SubjectJobFailed, api.TypeJobFailed
	}
	ev.Announced = true
	b, err := encodeToFit(&ev, s.eventLimit())
	if err != nil {
		return err
	}
	if ev.FilesOmitted+ev.PendingOmitted+ev.FailuresOmitted > 0 {
		s.log.Warn("job event trimmed to fit in a message", "job", jobID, "files_omitted", ev.FilesOmitted,
			"failures_omitted", ev.FailuresOmitted, "max_payload", s.nc.MaxPayload())
	}
	ce, err := codec.NewEvent(typ, "sluice/generator", jobID, b)
	if err != nil {
		return err
	}
	m, err := codec.Encode(ctx, subject, "job."+jobID+".end", ce)
	if err != nil {
		return err
	}
	if _, err := s.js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("announce job %s: %w", jobID, err)
	}
	s.jobs.Add(ctx, 1, metric.WithAttributes(attribute.String("event", ev.State)))
	wasRunning, footprint := false, int64(0)
	_, err = s.update(ctx, jobID, func(r *Record) error {
		wasRunning, footprint = r.State == api.JobRunning, r.Footprint
		r.State, r.Ended, r.Announced = ev.State, ev.Ended, true
		return nil
	})
	if err == nil && wasRunning {
		s.counted(ev.Job.Owner.DN, ev.Total, footprint, -1)
	}
	s.mu.Lock()
	delete(s.lastFinal, jobID)
	delete(s.members, jobID)
	s.mu.Unlock()
	s.log.Info("job ended", "job", jobID, "state", ev.State, "done", ev.Done, "failed", ev.Failed, "cancelled", ev.Cancelled)
	return err
}

// The events of sluice_generator_dtrs_total, their attribute sets made
// once (a set made at each call costs more than the count).
var (
	dtrSubmitted = metric.WithAttributeSet(attribute.NewSet(attribute.String("event", "submitted")))
	dtrFinished  = metric.WithAttributeSet(attribute.NewSet(attribute.String("event", "finished")))
	dtrFailed    = metric.WithAttributeSet(attribute.NewSet(attribute.String("event", "failed")))
	dtrCancelled = metric.WithAttributeSet(attribute.NewSet(attribute.String("event", "cancelled")))
)

// dtrEvent is the event of sluice_generator_dtrs_total that a final DTR
// in state is counted under.
func dtrEvent(state dtr.State) metric.AddOption {
	switch state {
	case dtr.Done:
		return dtrFinished
	case dtr.Cancelled:
		return dtrCancelled
	default:
		return dtrFailed
	}
}

// finalFailure is the failure of a DTR that ended in ERROR, else nil (a
// DTR done after a retry keeps its last attempt's failure).
func finalFailure(d *dtr.DTR) *dtr.Failure {
	if d.State != dtr.Error {
		return nil
	}
	return d.Error
}
