package job

import (
	"bytes"
	"errors"
	"fmt"
	"unicode/utf8"
)

// ErrUnknownFormat is returned by Parse when a description is neither JSON
// nor xRSL.
var ErrUnknownFormat = errors.New("job description is neither JSON nor xRSL")

// maxProblems caps how many problems a parser reports, so that a large
// description full of mistakes gives a readable answer in linear time.
const maxProblems = 100

// errTooMany ends a list of problems that reached maxProblems.
var errTooMany = fmt.Errorf("more than %d problems; stopped looking", maxProblems)

// ParseError is a problem found at a known place in a job description: a
// syntax error, or a value that cannot be what its place requires.
type ParseError struct {
	Format string // "json" or "xrsl"
	Offset int    // byte offset from the start of the description, from 0
	Line   int    // line number, from 1
	Column int    // column in characters, from 1
	Msg    string // what is wrong, and what was expected
	Err    error  // underlying cause, if any
}

// Error reads, for example,
// `xrsl line 3, column 14 (byte 52): expected ")" to close the relation`.
func (e *ParseError) Error() string {
	return fmt.Sprintf("%s line %d, column %d (byte %d): %s", e.Format, e.Line, e.Column, e.Offset, e.Msg)
}

// Unwrap returns the underlying cause.
func (e *ParseError) Unwrap() error { return e.Err }

// newParseError builds a ParseError at byte offset off of data.
func newParseError(format string, data []byte, off int, cause error, msg string, args ...any) *ParseError {
	line, col := position(data, off)
	return &ParseError{
		Format: format, Offset: off, Line: line, Column: col,
		Msg: fmt.Sprintf(msg, args...), Err: cause,
	}
}

// position turns a byte offset into a 1-based line and character column.
func position(data []byte, off int) (line, col int) {
	off = min(max(off, 0), len(data))
	before := data[:off]
	line = bytes.Count(before, []byte("\n")) + 1
	start := bytes.LastIndexByte(before, '\n') + 1
	return line, utf8.RuneCount(before[start:]) + 1
}

// describeAt names the character at off for "found ..." messages.
func describeAt(data []byte, off int) string {
	if off >= len(data) {
		return "end of input"
	}
	r, _ := utf8.DecodeRune(data[off:])
	return fmt.Sprintf("%q", r)
}

// checkUTF8 refuses a description that is not UTF-8, at its first bad
// byte. Left alone, such bytes would change a file's URL on the way: the
// JSON decoder turns them into U+FFFD, the xRSL parser keeps them, and the
// job is stored and sent on as JSON.
func checkUTF8(format string, data []byte) error {
	if utf8.Valid(data) {
		return nil
	}
	off := 0
	for off < len(data) {
		r, size := utf8.DecodeRune(data[off:])
		if r == utf8.RuneError && size == 1 {
			break
		}
		off += size
	}
	return newParseError(format, data, off, nil,
		"byte 0x%02X is not UTF-8: a job description is UTF-8 text (in a URL, write other bytes percent-encoded, %%%02X)", data[off], data[off])
}

// blankBOM returns data with a leading UTF-8 byte order mark replaced by
// spaces, so that parsers skip it while offsets stay true to the input.
func blankBOM(data []byte) []byte {
	if !bytes.HasPrefix(data, []byte("\xEF\xBB\xBF")) {
		return data
	}
	out := bytes.Clone(data)
	copy(out, "   ")
	return out
}
