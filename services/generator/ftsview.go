package generator

// A job and its files as the FTS3 API shows them: FTS3's states and field
// names.

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// FTS3's job states.
const (
	ftsSubmitted     = "SUBMITTED"
	ftsReady         = "READY"
	ftsActive        = "ACTIVE"
	ftsFinished      = "FINISHED"
	ftsFinishedDirty = "FINISHEDDIRTY"
	ftsFailed        = "FAILED"
	ftsCanceled      = "CANCELED"
	ftsNotUsed       = "NOT_USED"
)

// ftsFileStates maps a DTR's state to its file's FTS3 state: every state
// before the transfer's queue is SUBMITTED (FTS3 has not scheduled it),
// the transfer's queue READY, the transfer and what follows it until the
// end ACTIVE, and the three ends FTS3's. Each row holds from its state to
// the next row's.
var ftsFileStates = []struct {
	from dtr.State
	fts  string
}{
	{dtr.New, ftsSubmitted},
	{dtr.Transfer, ftsReady},
	{dtr.Transferring, ftsActive},
	{dtr.Done, ftsFinished},
	{dtr.Cancelled, ftsCanceled},
	{dtr.Error, ftsFailed},
}

// ftsFileState is the FTS3 state of a DTR in state st.
func ftsFileState(st dtr.State) string {
	out := ftsSubmitted
	for _, row := range ftsFileStates {
		if st >= row.from {
			out = row.fts
		}
	}
	return out
}

// ftsJobStates gives a job's FTS3 state once every file has ended, by
// whether some file finished and whether some did not (failed or was
// cancelled).
var ftsJobStates = map[[2]bool]string{
	{true, false}:  ftsFinished,
	{true, true}:   ftsFinishedDirty,
	{false, true}:  ftsFailed,
	{false, false}: ftsFailed, // no files: cannot be submitted
}

// ftsTime is FTS3's time format, UTC without a zone, as Rucio parses it.
const ftsTime = "2006-01-02T15:04:05"

// ftsTimeOf returns t in FTS3's format, nil (JSON null) if zero.
func ftsTimeOf(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format(ftsTime)
}

// fileState is the FTS3 state of file i of the job and the DTR that says
// it (nil while nothing is known beyond its submission).
func (j *ftsJob) fileState(i int) (string, *dtr.DTR) {
	if i >= len(j.refs) {
		return ftsSubmitted, nil
	}
	id := j.refs[i].DTR
	if d, ok := j.finals[id]; ok {
		return ftsFileState(d.State), d
	}
	if !j.fts.Cancelled.IsZero() {
		return ftsCanceled, j.live[id] // as FTS3 shows a job cancelled
	}
	if d, ok := j.live[id]; ok {
		return ftsFileState(d.State), d
	}
	return ftsSubmitted, nil
}

// state is the job's FTS3 state and, for a job that did not finish
// cleanly, the reason.
func (j *ftsJob) state() (string, string) {
	finished, unfinished, ended, started := false, false, 0, false
	var reason string
	for i := range j.fts.Files {
		st, d := j.fileState(i)
		switch st {
		case ftsFinished:
			finished, ended = true, ended+1
		case ftsFailed, ftsCanceled:
			unfinished = true
			if _, final := j.finals[j.refs[i].DTR]; final {
				ended++
			}
			if reason == "" && d != nil && d.Error != nil {
				reason = d.Error.Text
			}
		case ftsReady, ftsActive:
			started = true
		}
	}
	switch {
	case !j.fts.Cancelled.IsZero():
		return ftsCanceled, "cancelled by its owner"
	case ended == len(j.fts.Files):
		st := ftsJobStates[[2]bool{finished, unfinished}]
		if st == ftsFinished {
			reason = ""
		}
		return st, reason
	case started || ended > 0:
		return ftsActive, ""
	}
	return ftsSubmitted, ""
}

// jobType is FTS3's job_type: "R" when a file has several sources
// (replicas), else "N".
func (j *ftsJob) jobType() string {
	for _, f := range j.fts.Files {
		if len(f.Sources) > 1 {
			return "R"
		}
	}
	return "N"
}

// view is the job as GET /jobs/<id> shows it.
func (j *ftsJob) view() map[string]any {
	st, reason := j.state()
	var finished time.Time
	if st != ftsSubmitted && st != ftsActive {
		// The job's end, once announced; before, its last file's end (a
		// final DTR's, or a live record's that is final before the
		// generator has heard of it), or the cancel.
		finished = j.rec.Ended
		if finished.IsZero() {
			for _, ds := range []map[uuid.UUID]*dtr.DTR{j.finals, j.live} {
				for _, d := range ds {
					if d.State.Final() && d.Updated.After(finished) {
						finished = d.Updated
					}
				}
			}
		}
		if finished.IsZero() {
			finished = j.fts.Cancelled
		}
	}
	meta := json.RawMessage("{}")
	if len(j.fts.JobMetadata) > 0 {
		meta = j.fts.JobMetadata
	}
	vo := ""
	if len(j.rec.Job.Owner.FQANs) > 0 {
		vo, _, _ = strings.Cut(strings.TrimPrefix(j.rec.Job.Owner.FQANs[0], "/"), "/")
	}
	return map[string]any{
		"job_id": j.rec.Job.ID, "job_state": st, "job_type": j.jobType(), "reason": nullIfEmpty(reason),
		"user_dn": j.rec.Job.Owner.DN, "vo_name": vo, "cred_id": "",
		"submit_time": ftsTimeOf(j.fts.Submitted), "job_finished": ftsTimeOf(finished),
		"priority": j.fts.Priority, "verify_checksum": j.fts.VerifyChecksum, "overwrite_flag": j.fts.Overwrite,
		"retry": j.fts.Retry, "job_metadata": meta,
	}
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// ftsFileFieldNames are the fields of a file in FTS3's answers, the ones
// a ?files= query may pick.
var ftsFileFieldNames = []string{"file_id", "file_index", "job_id", "file_state", "source_surl", "dest_surl",
	"filesize", "user_filesize", "checksum", "reason", "file_metadata", "activity", "start_time", "finish_time",
	"staging_start", "staging_finished", "tx_duration", "throughput", "retry"}

// fileViews are the job's files as FTS3 shows them: one row per source
// of each file, as FTS3 shows a file with several sources. The source in
// use, or used last, has the file's state; the others are NOT_USED.
func (j *ftsJob) fileViews() []map[string]any {
	out := []map[string]any{}
	for i, f := range j.fts.Files {
		st, d := j.fileState(i)
		used := f.Sources[0]
		if d != nil && d.Source != "" {
			used = d.Source
		}
		for _, src := range f.Sources {
			row := map[string]any{
				"file_id": len(out) + 1, "file_index": i, "job_id": j.rec.Job.ID, "file_state": ftsNotUsed,
				"source_surl": src, "dest_surl": f.Destination, "filesize": f.Filesize, "user_filesize": f.Filesize,
				"checksum": nullIfEmpty(f.Checksum), "reason": nil, "file_metadata": rawOrNull(f.Metadata),
				"activity": f.Activity, "start_time": nil, "finish_time": nil, "staging_start": nil, "staging_finished": nil,
				"tx_duration": nil, "throughput": nil, "retry": 0,
			}
			if f.Activity == "" {
				row["activity"] = "default"
			}
			if src == used {
				row["file_state"] = st
				if d != nil {
					fillFromDTR(row, d)
				}
			}
			out = append(out, row)
		}
	}
	return out
}

// fillFromDTR sets what a DTR knows of its file in a file row.
func fillFromDTR(row map[string]any, d *dtr.DTR) {
	if d.Size > 0 {
		row["filesize"] = d.Size
	}
	if d.Checksum != "" {
		typ, val, _ := strings.Cut(d.Checksum, ":")
		row["checksum"] = strings.ToUpper(typ) + ":" + val
	}
	if d.Error != nil && d.State.Final() && d.State != dtr.Done {
		row["reason"] = d.Error.Text
	}
	row["start_time"], row["finish_time"] = ftsTimeOf(d.Started), ftsTimeOf(d.Ended)
	if !d.Started.IsZero() && d.Ended.After(d.Started) {
		secs := d.Ended.Sub(d.Started).Seconds()
		row["tx_duration"] = secs
		row["throughput"] = float64(d.Size) / secs / (1 << 20) // MiB/s
	}
	if d.Attempts > 1 {
		row["retry"] = d.Attempts - 1
	}
}

func rawOrNull(m json.RawMessage) any {
	if len(m) == 0 {
		return nil
	}
	return m
}
