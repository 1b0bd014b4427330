package core

import (
	"encoding/binary"
	"encoding/hex"
	"strings"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// A DTR waiting in a queue is kept packed: its fields encoded into one
// string with varints, its share and DN as numbers in the core's table of
// names. A million queued DTRs then cost a million small pointer-free
// strings instead of a million structs with a dozen pointers each, which
// is both less memory and much less for the garbage collector to scan.
// A DTR is unpacked when it is granted, changed, or looked at; most strings
// of an unpacked DTR are substrings of its packed form, so unpacking
// copies little text. Packing saves more where it can: the scheme and
// authority of its URLs are numbers in the table of names, its times after
// its creation small distances from it, and a W3C traceparent 25 bytes.
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
	packChained
)

// Bits of the fields of a packed DTR that follow only if set.
const (
	optAttempts = iota
	optSize
	optBytes
	optChecksum
	optStarted
	optEnded
	optNextProcess
	optTraceParent
	optTransferGrant
	optGrant
	optTURL
	optReplicas
	optReplica
	optCache
	optCacheFile
	optChecksumMismatch
	optActivity
	optTPC
	optTransferMethod
	optChecksumUnverified
	optTokenRef
	optSciTag
	optWithToken
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
	b = c.appendURL(b, d.Source)
	b = c.appendURL(b, d.Destination)
	b = binary.AppendUvarint(b, c.nameID(d.Owner.DN))
	b = binary.AppendUvarint(b, uint64(len(d.Owner.FQANs)))
	for _, f := range d.Owner.FQANs {
		b = appendString(b, f)
	}
	b = binary.AppendUvarint(b, c.nameID(string(d.Direction)))
	b = binary.AppendVarint(b, int64(d.UserPriority))
	b = appendString(b, d.Options.Checksum)
	var flags byte
	for bit, on := range [...]bool{d.Options.Overwrite, d.Options.FailureAllowed, d.Cancel, d.Cleanup, d.Error != nil, d.Options.Stage, d.Options.NoCache, d.Chained} {
		if on {
			flags |= 1 << bit
		}
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, c.nameID(d.Share))
	b = binary.AppendVarint(b, int64(d.Priority))
	b = append(b, byte(d.State))
	// The fields most DTRs waiting in a queue leave empty follow only if
	// set, as the bits of present say (opt).
	var present uint64
	for bit, on := range [...]bool{optAttempts: d.Attempts != 0, optSize: d.Size != 0, optBytes: d.Bytes != 0,
		optChecksum: d.Checksum != "", optStarted: !d.Started.IsZero(), optEnded: !d.Ended.IsZero(),
		optNextProcess: !d.NextProcess.IsZero(), optTraceParent: d.TraceParent != "", optTransferGrant: d.TransferGrant != "",
		optGrant: d.Grant != "", optTURL: d.TURL != "", optReplicas: len(d.Replicas) > 0, optReplica: d.Replica != 0,
		optCache: d.Cache != "", optCacheFile: d.CacheFile != "", optChecksumMismatch: d.ChecksumMismatch != "",
		optActivity: d.Options.Activity != "", optTPC: d.Options.TPC != "", optTransferMethod: d.TransferMethod != "",
		optChecksumUnverified: d.ChecksumUnverified != "", optTokenRef: d.TokenRef != "", optSciTag: d.Options.SciTag != 0,
		optWithToken: d.SubmittedWithToken} {
		if on {
			present |= 1 << bit
		}
	}
	b = binary.AppendUvarint(b, present)
	has := func(bit int) bool { return present&(1<<bit) != 0 }
	if has(optAttempts) {
		b = binary.AppendVarint(b, int64(d.Attempts))
	}
	b = binary.AppendVarint(b, int64(d.MaxAttempts))
	if d.Error != nil {
		b = appendString(b, string(d.Error.Kind))
		b = appendString(b, d.Error.Text)
		b = append(b, byte(d.Error.State))
		b = appendString(b, d.Error.Location)
	}
	if has(optSize) {
		b = binary.AppendVarint(b, d.Size)
	}
	if has(optBytes) {
		b = binary.AppendVarint(b, d.Bytes)
	}
	if has(optChecksum) {
		b = appendString(b, d.Checksum)
	}
	created := unixNano(d.Created)
	b = binary.AppendVarint(b, created)
	b = appendTimeAfter(b, d.Updated, created)
	if has(optStarted) {
		b = appendTimeAfter(b, d.Started, created)
	}
	if has(optEnded) {
		b = appendTimeAfter(b, d.Ended, created)
	}
	if has(optNextProcess) {
		b = appendTimeAfter(b, d.NextProcess, created)
	}
	if has(optTraceParent) {
		b = appendTraceParent(b, d.TraceParent)
	}
	for _, f := range [...]struct {
		bit int
		s   string
	}{{optTransferGrant, d.TransferGrant}, {optGrant, d.Grant}, {optTURL, d.TURL}} {
		if has(f.bit) {
			b = appendString(b, f.s)
		}
	}
	if has(optReplicas) {
		b = binary.AppendUvarint(b, uint64(len(d.Replicas)))
		for _, r := range d.Replicas {
			b = c.appendURL(b, r)
		}
	}
	if has(optReplica) {
		b = binary.AppendVarint(b, int64(d.Replica))
	}
	// The activity is not interned: it is any submitter's free text, and
	// the table of names is never pruned.
	for _, f := range [...]struct {
		bit int
		s   string
	}{{optCache, d.Cache}, {optCacheFile, d.CacheFile}, {optChecksumMismatch, d.ChecksumMismatch}, {optActivity, d.Options.Activity},
		{optTPC, string(d.Options.TPC)}, {optTransferMethod, d.TransferMethod}, {optChecksumUnverified, d.ChecksumUnverified}, {optTokenRef, d.TokenRef}} {
		if has(f.bit) {
			b = appendString(b, f.s)
		}
	}
	b = binary.AppendUvarint(b, c.nameID(d.ChecksumSource))
	if has(optSciTag) {
		b = binary.AppendUvarint(b, uint64(d.Options.SciTag))
	}
	b = appendTimeAfter(b, d.StateEntered, created)
	c.scratch = b
	return string(b)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// unixNano is t in nanoseconds since 1970, 0 for the zero time.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// appendTimeAfter appends t as its distance from base (the DTR's creation,
// in nanoseconds), a byte or a few rather than nine: 0 is the zero time,
// else 1 + the distance zigzagged.
func appendTimeAfter(b []byte, t time.Time, base int64) []byte {
	if t.IsZero() {
		return append(b, 0)
	}
	d := t.UnixNano() - base
	return binary.AppendUvarint(b, uint64(d<<1^d>>63)+1)
}

// maxURLPrefix bounds the scheme and authority of a URL interned as one
// name: a storage endpoint's is far shorter.
const maxURLPrefix = 100

// appendURL appends a URL as the number of its scheme and authority
// ("https://se.example.org:443") in the core's table of names, plus one,
// and the rest; a string that is no such URL as 0 and itself. A site has a
// few storage endpoints, each named once, where a million queued DTRs
// would each hold theirs.
func (c *Core) appendURL(b []byte, u string) []byte {
	if i := strings.Index(u, "://"); i > 0 {
		end := len(u)
		if j := strings.IndexByte(u[i+3:], '/'); j >= 0 {
			end = i + 3 + j
		}
		if end <= maxURLPrefix {
			b = binary.AppendUvarint(b, c.nameID(u[:end])+1)
			return appendString(b, u[end:])
		}
	}
	b = append(b, 0)
	return appendString(b, u)
}

// traceParentLen is the length of a W3C traceparent of version 00.
const traceParentLen = 55

// appendTraceParent appends a W3C traceparent "00-<32 hex>-<16 hex>-<2 hex>"
// in lower case as 1 and its 25 bytes, else 0 and the string itself.
func appendTraceParent(b []byte, tp string) []byte {
	if len(tp) == traceParentLen && strings.HasPrefix(tp, "00-") && tp[35] == '-' && tp[52] == '-' {
		var raw [25]byte
		_, e1 := hex.Decode(raw[:16], []byte(tp[3:35]))
		_, e2 := hex.Decode(raw[16:24], []byte(tp[36:52]))
		_, e3 := hex.Decode(raw[24:], []byte(tp[53:]))
		if e1 == nil && e2 == nil && e3 == nil && hex.EncodeToString(raw[:16]) == tp[3:35] &&
			hex.EncodeToString(raw[16:24]) == tp[36:52] && hex.EncodeToString(raw[24:]) == tp[53:] {
			b = append(b, 1)
			return append(b, raw[:]...)
		}
	}
	b = append(b, 0)
	return appendString(b, tp)
}

// unpackDTR decodes what pack encoded.
func (c *Core) unpackDTR(p string) *dtr.DTR {
	r := reader{s: p}
	d := &dtr.DTR{}
	copy(d.ID[:], r.next(16))
	d.JobID = r.str()
	d.Source = c.readURL(&r)
	d.Destination = c.readURL(&r)
	d.Owner.DN = c.names[r.uvarint()]
	if n := r.uvarint(); n > 0 {
		d.Owner.FQANs = make([]string, n)
		for i := range d.Owner.FQANs {
			d.Owner.FQANs[i] = r.str()
		}
	}
	d.Direction = dtr.Direction(c.names[r.uvarint()])
	d.UserPriority = int(r.varint())
	d.Options.Checksum = r.str()
	flags := r.byte()
	d.Options.Overwrite = flags&packOverwrite != 0
	d.Options.FailureAllowed = flags&packFailureAllowed != 0
	d.Cancel = flags&packCancel != 0
	d.Cleanup = flags&packCleanup != 0
	d.Options.Stage = flags&packStage != 0
	d.Options.NoCache = flags&packNoCache != 0
	d.Chained = flags&packChained != 0
	d.Share = c.names[r.uvarint()]
	d.Priority = int(r.varint())
	d.State = dtr.State(r.byte())
	present := r.uvarint()
	has := func(bit int) bool { return present&(1<<bit) != 0 }
	if has(optAttempts) {
		d.Attempts = int(r.varint())
	}
	d.MaxAttempts = int(r.varint())
	if flags&packError != 0 {
		d.Error = &dtr.Failure{Kind: dtr.ErrorKind(r.str()), Text: r.str(), State: dtr.State(r.byte()), Location: r.str()}
	}
	if has(optSize) {
		d.Size = r.varint()
	}
	if has(optBytes) {
		d.Bytes = r.varint()
	}
	if has(optChecksum) {
		d.Checksum = r.str()
	}
	created := r.varint()
	if created != 0 {
		d.Created = time.Unix(0, created)
	}
	d.Updated = r.timeAfter(created)
	for _, f := range [...]struct {
		bit int
		t   *time.Time
	}{{optStarted, &d.Started}, {optEnded, &d.Ended}, {optNextProcess, &d.NextProcess}} {
		if has(f.bit) {
			*f.t = r.timeAfter(created)
		}
	}
	if has(optTraceParent) {
		d.TraceParent = r.traceParent()
	}
	for _, f := range [...]struct {
		bit int
		s   *string
	}{{optTransferGrant, &d.TransferGrant}, {optGrant, &d.Grant}, {optTURL, &d.TURL}} {
		if has(f.bit) {
			*f.s = r.str()
		}
	}
	if has(optReplicas) {
		d.Replicas = make([]string, r.uvarint())
		for i := range d.Replicas {
			d.Replicas[i] = c.readURL(&r)
		}
	}
	if has(optReplica) {
		d.Replica = int(r.varint())
	}
	var tpc string
	for _, f := range [...]struct {
		bit int
		s   *string
	}{{optCache, &d.Cache}, {optCacheFile, &d.CacheFile}, {optChecksumMismatch, &d.ChecksumMismatch}, {optActivity, &d.Options.Activity},
		{optTPC, &tpc}, {optTransferMethod, &d.TransferMethod}, {optChecksumUnverified, &d.ChecksumUnverified}, {optTokenRef, &d.TokenRef}} {
		if has(f.bit) {
			*f.s = r.str()
		}
	}
	d.Options.TPC = dtr.TPCMode(tpc)
	d.ChecksumSource = c.names[r.uvarint()]
	if has(optSciTag) {
		d.Options.SciTag = int(r.uvarint())
	}
	d.SubmittedWithToken = has(optWithToken)
	d.StateEntered = r.timeAfter(created)
	return d
}

// readURL reads what appendURL wrote. A URL that was split is joined
// again, a new string: unpacked URLs are not substrings of the packed
// form.
func (c *Core) readURL(r *reader) string {
	prefix := r.uvarint()
	rest := r.str()
	if prefix == 0 {
		return rest
	}
	return c.names[prefix-1] + rest
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

// timeAfter reads what appendTimeAfter wrote.
func (r *reader) timeAfter(base int64) time.Time {
	u := r.uvarint()
	if u == 0 {
		return time.Time{}
	}
	u--
	d := int64(u >> 1)
	if u&1 != 0 {
		d = ^d
	}
	return time.Unix(0, base+d)
}

// traceParent reads what appendTraceParent wrote.
func (r *reader) traceParent() string {
	if r.byte() == 0 {
		return r.str()
	}
	raw := r.next(25)
	return "00-" + hex.EncodeToString([]byte(raw[:16])) + "-" + hex.EncodeToString([]byte(raw[16:24])) + "-" + hex.EncodeToString([]byte(raw[24:]))
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
	r.str()     // job
	r.uvarint() // source
	r.str()
	r.uvarint() // destination
	r.str()
	r.uvarint()
	for n := r.uvarint(); n > 0; n-- {
		r.str()
	}
	r.uvarint() // direction
	r.varint()  // user priority
	r.str()     // checksum option
	r.byte()    // flags
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

// Pack returns d in the core's packed form, for a caller that holds many
// DTRs before restoring them (RestorePacked): a few hundred bytes each.
// Its share, DN and checksum source are interned in the core's table of
// names.
func (c *Core) Pack(d *dtr.DTR) string { return c.packDTR(d) }

// RestorePacked is Restore of a DTR that Pack packed, whose stored record
// is at stream sequence record (Recorded).
func (c *Core) RestorePacked(now time.Time, packed string, record uint64) error {
	d := c.unpackDTR(packed)
	if err := c.Restore(now, d); err != nil {
		return err
	}
	c.Recorded(d.ID, record)
	return nil
}

// packEntry packs the DTR of an entry waiting in a queue.
func (c *Core) packEntry(e *entry) {
	if e.d != nil && e.index >= 0 && e.d.State.IsQueue() && e.queued == e.d.State {
		e.packed = c.packDTR(e.d)
		e.d = nil
	}
}
