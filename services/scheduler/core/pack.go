package core

import (
	"encoding/binary"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// A DTR waiting in a queue is kept packed: its fields encoded into one
// string with varints, its share and DN as numbers in the core's table of
// names. A million queued DTRs then cost a million small pointer-free
// strings instead of a million structs with a dozen pointers each, which
// is both less memory and much less for the garbage collector to scan.
// A DTR is unpacked when it is granted, changed, or looked at; the strings
// of an unpacked DTR are substrings of its packed form, so unpacking
// copies no text.
//
// Times keep their instant but not their location or monotonic reading; a
// time exactly at the Unix epoch reads back as the zero time.

// Flag bits of a packed DTR.
const (
	packOverwrite = 1 << iota
	packFailureAllowed
	packCancel
	packCleanup
	packError
	packStage
	packNoCache
)

// nameID returns the number of an interned name, adding it if new.
func (c *Core) nameID(s string) uint64 {
	if id, ok := c.nameIDs[s]; ok {
		return uint64(id)
	}
	c.nameIDs[s] = uint32(len(c.names))
	c.names = append(c.names, s)
	return uint64(len(c.names) - 1)
}

// intern returns one shared copy of a string that many DTRs hold.
func (c *Core) intern(s string) string { return c.names[c.nameID(s)] }

// packDTR encodes d.
func (c *Core) packDTR(d *dtr.DTR) string {
	b := c.scratch[:0]
	b = append(b, d.ID[:]...)
	b = appendString(b, d.JobID)
	b = appendString(b, d.Source)
	b = appendString(b, d.Destination)
	b = binary.AppendUvarint(b, c.nameID(d.Owner.DN))
	b = binary.AppendUvarint(b, uint64(len(d.Owner.FQANs)))
	for _, f := range d.Owner.FQANs {
		b = appendString(b, f)
	}
	b = appendString(b, string(d.Direction))
	b = binary.AppendVarint(b, int64(d.UserPriority))
	b = appendString(b, d.Options.Checksum)
	var flags byte
	for bit, on := range [...]bool{d.Options.Overwrite, d.Options.FailureAllowed, d.Cancel, d.Cleanup, d.Error != nil, d.Options.Stage, d.Options.NoCache} {
		if on {
			flags |= 1 << bit
		}
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, c.nameID(d.Share))
	b = binary.AppendVarint(b, int64(d.Priority))
	b = append(b, byte(d.State))
	b = binary.AppendVarint(b, int64(d.Attempts))
	b = binary.AppendVarint(b, int64(d.MaxAttempts))
	if d.Error != nil {
		b = appendString(b, string(d.Error.Kind))
		b = appendString(b, d.Error.Text)
		b = append(b, byte(d.Error.State))
		b = appendString(b, d.Error.Location)
	}
	b = binary.AppendVarint(b, d.Size)
	b = binary.AppendVarint(b, d.Bytes)
	b = appendString(b, d.Checksum)
	for _, t := range [...]time.Time{d.Created, d.Updated, d.Started, d.Ended, d.NextProcess} {
		var ns int64
		if !t.IsZero() {
			ns = t.UnixNano()
		}
		b = binary.AppendVarint(b, ns)
	}
	b = appendString(b, d.TraceParent)
	b = appendString(b, d.TransferGrant)
	b = appendString(b, d.Grant)
	b = appendString(b, d.TURL)
	b = binary.AppendUvarint(b, uint64(len(d.Replicas)))
	for _, r := range d.Replicas {
		b = appendString(b, r)
	}
	b = binary.AppendVarint(b, int64(d.Replica))
	b = appendString(b, d.Cache)
	b = appendString(b, d.CacheFile)
	b = appendString(b, d.ChecksumMismatch)
	// Not interned: an activity is any submitter's free text, and the
	// table of names is never pruned.
	b = appendString(b, d.Options.Activity)
	b = appendString(b, string(d.Options.TPC))
	b = appendString(b, d.TransferMethod)
	b = appendString(b, d.ChecksumUnverified)
	b = appendString(b, d.TokenRef)
	b = binary.AppendUvarint(b, c.nameID(d.ChecksumSource))
	b = binary.AppendUvarint(b, uint64(d.Options.SciTag))
	var withToken byte
	if d.SubmittedWithToken {
		withToken = 1
	}
	b = append(b, withToken)
	var entered int64
	if !d.StateEntered.IsZero() {
		entered = d.StateEntered.UnixNano()
	}
	b = binary.AppendVarint(b, entered)
	c.scratch = b
	return string(b)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// unpackDTR decodes what pack encoded.
func (c *Core) unpackDTR(p string) *dtr.DTR {
	r := reader{s: p}
	d := &dtr.DTR{}
	copy(d.ID[:], r.next(16))
	d.JobID = r.str()
	d.Source = r.str()
	d.Destination = r.str()
	d.Owner.DN = c.names[r.uvarint()]
	if n := r.uvarint(); n > 0 {
		d.Owner.FQANs = make([]string, n)
		for i := range d.Owner.FQANs {
			d.Owner.FQANs[i] = r.str()
		}
	}
	d.Direction = dtr.Direction(r.str())
	d.UserPriority = int(r.varint())
	d.Options.Checksum = r.str()
	flags := r.byte()
	d.Options.Overwrite = flags&packOverwrite != 0
	d.Options.FailureAllowed = flags&packFailureAllowed != 0
	d.Cancel = flags&packCancel != 0
	d.Cleanup = flags&packCleanup != 0
	d.Options.Stage = flags&packStage != 0
	d.Options.NoCache = flags&packNoCache != 0
	d.Share = c.names[r.uvarint()]
	d.Priority = int(r.varint())
	d.State = dtr.State(r.byte())
	d.Attempts = int(r.varint())
	d.MaxAttempts = int(r.varint())
	if flags&packError != 0 {
		d.Error = &dtr.Failure{Kind: dtr.ErrorKind(r.str()), Text: r.str(), State: dtr.State(r.byte()), Location: r.str()}
	}
	d.Size = r.varint()
	d.Bytes = r.varint()
	d.Checksum = r.str()
	for _, t := range [...]*time.Time{&d.Created, &d.Updated, &d.Started, &d.Ended, &d.NextProcess} {
		if ns := r.varint(); ns != 0 {
			*t = time.Unix(0, ns)
		}
	}
	d.TraceParent = r.str()
	d.TransferGrant = r.str()
	d.Grant = r.str()
	d.TURL = r.str()
	if n := r.uvarint(); n > 0 {
		d.Replicas = make([]string, n)
		for i := range d.Replicas {
			d.Replicas[i] = r.str()
		}
	}
	d.Replica = int(r.varint())
	d.Cache = r.str()
	d.CacheFile = r.str()
	d.ChecksumMismatch = r.str()
	d.Options.Activity = r.str()
	d.Options.TPC = dtr.TPCMode(r.str())
	d.TransferMethod = r.str()
	d.ChecksumUnverified = r.str()
	d.TokenRef = r.str()
	d.ChecksumSource = c.names[r.uvarint()]
	d.Options.SciTag = int(r.uvarint())
	d.SubmittedWithToken = r.byte() != 0
	if ns := r.varint(); ns != 0 {
		d.StateEntered = time.Unix(0, ns)
	}
	return d
}

// reader reads a packed DTR. The core wrote it, so it is never malformed.
type reader struct {
	s string
	i int
}

func (r *reader) next(n int) string { s := r.s[r.i : r.i+n]; r.i += n; return s }
func (r *reader) byte() byte        { b := r.s[r.i]; r.i++; return b }
func (r *reader) str() string       { return r.next(int(r.uvarint())) }

func (r *reader) uvarint() uint64 {
	var v uint64
	for shift := 0; ; shift += 7 {
		b := r.byte()
		v |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return v
		}
	}
}

func (r *reader) varint() int64 {
	u := r.uvarint()
	v := int64(u >> 1)
	if u&1 != 0 {
		v = ^v
	}
	return v
}

// jobOf returns the job id of an entry's DTR without unpacking it.
func (c *Core) jobOf(e *entry) string {
	if e.d != nil {
		return e.d.JobID
	}
	r := reader{s: e.packed, i: 16}
	return r.str()
}

// shareOf returns the share of an entry's DTR without unpacking it.
func (c *Core) shareOf(e *entry) string {
	if e.d != nil {
		return e.d.Share
	}
	r := reader{s: e.packed, i: 16}
	r.str() // job
	r.str() // source
	r.str() // destination
	r.uvarint()
	for n := r.uvarint(); n > 0; n-- {
		r.str()
	}
	r.str()    // direction
	r.varint() // user priority
	r.str()    // checksum option
	r.byte()   // flags
	return c.names[r.uvarint()]
}

// unpackEntry returns an entry's DTR to change it, unpacking it for good.
func (c *Core) unpackEntry(e *entry) *dtr.DTR {
	if e.d == nil {
		e.d = c.unpackDTR(e.packed)
		e.packed = ""
	}
	return e.d
}

// peekEntry returns an entry's DTR to read it: the DTR itself if it is unpacked,
// else a copy that the caller must not change.
func (c *Core) peekEntry(e *entry) *dtr.DTR {
	if e.d != nil {
		return e.d
	}
	return c.unpackDTR(e.packed)
}

// packEntry packs the DTR of an entry waiting in a queue.
func (c *Core) packEntry(e *entry) {
	if e.d != nil && e.index >= 0 && e.d.State.IsQueue() && e.queued == e.d.State {
		e.packed = c.packDTR(e.d)
		e.d = nil
	}
}
