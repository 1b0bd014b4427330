package transfer

import (
	"hash"
	"slices"
	"strings"

	"github.com/sluice-dtr/sluice/pkg/checksum"
)

// hashSet is the checksums computed during one copy. Each hash runs in a
// goroutine of its own, so that a chunk is hashed while it is being
// written, and several hashes run in parallel: the data is still read
// once, but a copy with md5 or sha256 is not slowed to the speed of a
// single core hashing and writing in turn.
type hashSet struct {
	types  []string
	hashes []hash.Hash
	feeds  []chan []byte
	done   chan struct{}
	// inline hashes each chunk in begin, in the caller's goroutine: for a
	// small source, where a goroutine and two hand-overs per chunk cost
	// more than the hashing they would overlap.
	inline bool
}

// inlineHashMax is the largest source whose chunks are hashed inline.
const inlineHashMax = 64 << 10

// newHashSet makes one hash per distinct type (case-insensitive).
func newHashSet(types []string) (*hashSet, error) {
	s := &hashSet{}
	for _, typ := range types {
		if err := s.add(typ); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// add makes a hash of typ unless there is one; only before start.
func (s *hashSet) add(typ string) error {
	typ = strings.ToLower(typ)
	if slices.Contains(s.types, typ) {
		return nil
	}
	h, err := checksum.New(typ)
	if err != nil {
		return err
	}
	s.types = append(s.types, typ)
	s.hashes = append(s.hashes, h)
	return nil
}

// empty reports whether no checksum is computed.
func (s *hashSet) empty() bool { return len(s.hashes) == 0 }

// start launches one goroutine per hash; stop ends them.
func (s *hashSet) start() {
	if s.inline {
		return
	}
	s.done = make(chan struct{}, len(s.hashes))
	for _, h := range s.hashes {
		feed := make(chan []byte)
		s.feeds = append(s.feeds, feed)
		go func() {
			for chunk := range feed {
				h.Write(chunk) // hashes never fail
				s.done <- struct{}{}
			}
		}()
	}
}

func (s *hashSet) stop() {
	for _, feed := range s.feeds {
		close(feed)
	}
	s.feeds = nil
}

// begin hands chunk to every hash. The caller may read chunk meanwhile but
// must call wait before changing it or calling begin again.
func (s *hashSet) begin(chunk []byte) {
	if s.inline {
		for _, h := range s.hashes {
			h.Write(chunk) // hashes never fail
		}
		return
	}
	for _, feed := range s.feeds {
		feed <- chunk
	}
}

// wait returns once every hash has taken in the chunk given to begin.
func (s *hashSet) wait() {
	for range s.feeds {
		<-s.done
	}
}

// result maps each type to "type:value". Call it after wait.
func (s *hashSet) result() map[string]string {
	m := make(map[string]string, len(s.types))
	for i, typ := range s.types {
		m[typ] = checksum.Format(typ, s.hashes[i])
	}
	return m
}
