package scheduler

import (
	"encoding/binary"

	"github.com/google/uuid"
)

// seen is a Bloom filter of the ids of the DTRs the scheduler has stored.
// A DTR it has not seen has no record, so a new DTR needs no look-up in
// the sluice_dtrs bucket; one it may have seen (every DTR stored, and about
// one in a hundred others) is looked up as before. It never forgets: when
// a filter is full, a filter twice as large is added beside it.
type seen struct {
	filters []*bloom
}

// firstCapacity is the number of ids the first filter holds (1.2 MB).
const firstCapacity = 1 << 20

// bloom holds up to capacity ids with about 1% false positives: 9.6 bits
// and 7 probes per id.
type bloom struct {
	bits   []uint64
	n, cap int
	nbits  uint64
}

// probes is the number of bits an id sets in a filter.
const probes = 7

func newBloom(capacity int) *bloom {
	nbits := uint64(capacity) * 96 / 10
	nbits = (nbits + 63) &^ 63
	return &bloom{bits: make([]uint64, nbits/64), cap: capacity, nbits: nbits}
}

// Add records id.
func (s *seen) Add(id uuid.UUID) {
	if len(s.filters) == 0 || s.filters[len(s.filters)-1].n >= s.filters[len(s.filters)-1].cap {
		capacity := firstCapacity
		if len(s.filters) > 0 {
			capacity = 2 * s.filters[len(s.filters)-1].cap
		}
		s.filters = append(s.filters, newBloom(capacity))
	}
	b := s.filters[len(s.filters)-1]
	h1, h2 := hashes(id)
	for i := range uint64(probes) {
		bit := (h1 + i*h2) % b.nbits
		b.bits[bit/64] |= 1 << (bit % 64)
	}
	b.n++
}

// MayHave is false only if id was never added.
func (s *seen) MayHave(id uuid.UUID) bool {
	h1, h2 := hashes(id)
	for _, b := range s.filters {
		in := true
		for i := range uint64(probes) {
			bit := (h1 + i*h2) % b.nbits
			if b.bits[bit/64]&(1<<(bit%64)) == 0 {
				in = false
				break
			}
		}
		if in {
			return true
		}
	}
	return false
}

// hashes derives two hashes of an id for double hashing. A UUID's bits
// are random or a SHA-1 digest but for its version and variant: mixing
// spreads those too.
func hashes(id uuid.UUID) (uint64, uint64) {
	a, b := binary.LittleEndian.Uint64(id[:8]), binary.LittleEndian.Uint64(id[8:])
	return mix(a ^ mix(b)), mix(b+0x9e3779b97f4a7c15) | 1
}

// mix is SplitMix64's finaliser.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
