package generator

// Which final DTRs are a job's own: anyone may publish a DTR with a job_id
// on dtr.submit, and only the DTRs the generator made for the job count in
// it.

import (
	"context"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/api"
)

// maxMembers bounds the jobs whose DTR ids are cached.
const maxMembers = 1000

// memberIDs returns the ids of a job's DTRs, read from its file list the
// first time and kept until the job is announced or the cache
// is full. An unknown job has none (jetstream.ErrKeyNotFound).
func (s *Service) memberIDs(ctx context.Context, jobID string) (map[uuid.UUID]struct{}, error) {
	s.mu.Lock()
	ids, ok := s.members[jobID]
	s.mu.Unlock()
	if ok {
		return ids, nil
	}
	var refs []api.FileRef
	if _, err := s.get(ctx, jobID+".files", &refs); err != nil {
		return nil, err
	}
	ids = make(map[uuid.UUID]struct{}, len(refs))
	for _, r := range refs {
		ids[r.DTR] = struct{}{}
	}
	s.mu.Lock()
	if len(s.members) >= maxMembers {
		clear(s.members)
	}
	s.members[jobID] = ids
	s.mu.Unlock()
	return ids, nil
}
