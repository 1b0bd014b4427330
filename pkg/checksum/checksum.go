// Package checksum computes and compares the file checksums Sluice records,
// written as "type:value" (for example "adler32:11e60398").
//
// The types are those of dtr.ChecksumTypes: adler32, md5, sha256 and crc32c
// (Castagnoli, as S3 and Google Cloud Storage use it). Values are lowercase
// hex; adler32 and crc32c are always printed as eight zero-padded digits,
// as ARC and xrootd print them.
package checksum

import (
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/adler32"
	"hash/crc32"
	"io"
	"os"
	"strings"
)

// ErrUnknownType is returned (wrapped) by New for a checksum type Sluice
// does not compute.
var ErrUnknownType = errors.New("unknown checksum type")

// New returns a fresh hash for typ ("adler32", "md5" or "sha256", in any
// case).
func New(typ string) (hash.Hash, error) {
	switch strings.ToLower(typ) {
	case "adler32":
		return adler32.New(), nil
	case "md5":
		return md5.New(), nil
	case "sha256":
		return sha256.New(), nil
	case "crc32c":
		return crc32.New(crc32.MakeTable(crc32.Castagnoli)), nil
	}
	return nil, fmt.Errorf("%w %q (want adler32, md5, sha256 or crc32c)", ErrUnknownType, typ)
}

// Format returns "type:value" for the data written to h so far, with the
// type in lowercase and the value in lowercase hex. The sum of an adler32
// hash is four big-endian bytes, so it prints as eight zero-padded digits.
func Format(typ string, h hash.Hash) string {
	var buf [sha256.Size]byte
	return strings.ToLower(typ) + ":" + hex.EncodeToString(h.Sum(buf[:0]))
}

// File returns the "type:value" checksum of the file at path, read in one
// streaming pass.
func File(path, typ string) (string, error) {
	h, err := New(typ)
	if err != nil {
		return "", err
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("checksum %s: %w", typ, err)
	}
	defer f.Close()
	if _, err := io.CopyBuffer(h, f, make([]byte, 1<<20)); err != nil {
		return "", fmt.Errorf("checksum %s of %s: %w", typ, path, err)
	}
	return Format(typ, h), nil
}

// Equal reports whether two "type:value" checksums are the same: the types
// must match and the values are compared without regard to case. adler32
// and crc32c values are compared as numbers, so "adler32:0a0b0c0d" equals
// "adler32:a0b0c0d". A malformed checksum equals nothing.
func Equal(a, b string) bool {
	ta, va, ok := split(a)
	if !ok {
		return false
	}
	tb, vb, ok := split(b)
	if !ok || ta != tb {
		return false
	}
	if ta == "adler32" || ta == "crc32c" {
		va, vb = trimZeros(va), trimZeros(vb)
	}
	return va == vb
}

// split breaks "type:value" into its lowercase, trimmed parts.
func split(s string) (typ, value string, ok bool) {
	typ, value, ok = strings.Cut(s, ":")
	typ = strings.ToLower(strings.TrimSpace(typ))
	value = strings.ToLower(strings.TrimSpace(value))
	return typ, value, ok && typ != "" && value != ""
}

// SameType reports whether two "type:value" checksums are of one type
// (compared without regard to case), so that Equal can tell whether they
// match.
func SameType(a, b string) bool {
	ta, _, _ := strings.Cut(a, ":")
	tb, _, _ := strings.Cut(b, ":")
	return strings.EqualFold(strings.TrimSpace(ta), strings.TrimSpace(tb))
}

// trimZeros drops leading zeros, keeping one digit for a zero value.
func trimZeros(v string) string {
	v = strings.TrimLeft(v, "0")
	if v == "" {
		return "0"
	}
	return v
}
