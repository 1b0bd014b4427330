package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// kind is the JSON type a place in a job description must hold.
type kind int

const (
	kString kind = iota
	kBool
	kInt
	kObject
	kArray
)

var kindNames = [...]string{kString: "a string", kBool: "true or false", kInt: "an integer", kObject: "an object", kArray: "an array"}

// shape describes the JSON a place must hold: its kind, an object's fields
// or an array's elements.
type shape struct {
	kind   kind
	fields map[string]*shape
	elem   *shape
}

var (
	stringShape = &shape{kind: kString}
	boolShape   = &shape{kind: kBool}
	fileShape   = &shape{kind: kObject, fields: map[string]*shape{
		"source":          stringShape,
		"destination":     stringShape,
		"checksum":        stringShape,
		"overwrite":       boolShape,
		"failure_allowed": boolShape,
		"stage":           boolShape,
		"no_cache":        boolShape,
		"replicas":        {kind: kArray, elem: stringShape},
		"activity":        stringShape,
		"tpc":             stringShape,
		"scitag":          {kind: kInt},
	}}
	jobShape = &shape{kind: kObject, fields: map[string]*shape{
		"id":   stringShape,
		"name": stringShape,
		"owner": {kind: kObject, fields: map[string]*shape{
			"dn":    stringShape,
			"fqans": {kind: kArray, elem: stringShape},
		}},
		"priority": {kind: kInt},
		"inputs":   {kind: kArray, elem: fileShape},
		"outputs":  {kind: kArray, elem: fileShape},
	}}
)

// ParseJSON reads a JSON job description strictly: besides malformed JSON,
// it reports unknown fields (field names are case-sensitive), fields given
// twice, values of the wrong type (null included), anything after the job
// object, and bytes that are not UTF-8. Every such problem (up to 100) is
// reported, joined, as a *ParseError that names the field and its line and
// column; a byte that is not UTF-8 stops the parse.
//
// ParseJSON does not check the values themselves; that is Validate's job.
func ParseJSON(data []byte) (*Job, error) {
	data = blankBOM(data)
	if err := checkUTF8("json", data); err != nil {
		return nil, err
	}
	c := &jsonChecker{data: data, dec: json.NewDecoder(bytes.NewReader(data))}
	c.dec.UseNumber()
	c.value("", jobShape)
	if c.broken == nil {
		if end := int(c.dec.InputOffset()); len(bytes.TrimSpace(data[end:])) > 0 {
			off := c.start()
			c.report(off, "unexpected %s after the end of the job object", describeAt(data, off))
		}
	}
	if len(c.errs) > 0 {
		return nil, errors.Join(c.errs...)
	}
	var j Job
	if err := json.Unmarshal(data, &j); err != nil {
		// The checker has already seen to everything Unmarshal rejects, so
		// this is unexpected; report it rather than lose it.
		return nil, fmt.Errorf("json: %w", err)
	}
	return &j, nil
}

// jsonChecker walks the tokens of a description and compares them with a
// shape, collecting every problem it finds.
type jsonChecker struct {
	data   []byte
	dec    *json.Decoder
	errs   []error
	broken error // set once the JSON itself is malformed; walking stops
}

// report records a problem at byte offset off.
func (c *jsonChecker) report(off int, msg string, args ...any) {
	if c.broken != nil {
		return
	}
	c.errs = append(c.errs, newParseError("json", c.data, off, nil, msg, args...))
	if len(c.errs) == maxProblems {
		c.errs = append(c.errs, errTooMany)
		c.broken = errTooMany // stop walking
	}
}

// start is the offset of the next token: the decoder's offset moved past
// the white space, colons and commas that separate tokens.
func (c *jsonChecker) start() int {
	off := int(c.dec.InputOffset())
	for off < len(c.data) && strings.IndexByte(" \t\r\n:,", c.data[off]) >= 0 {
		off++
	}
	return off
}

// token reads the next token, recording a syntax error and returning false
// if the JSON is malformed.
func (c *jsonChecker) token() (json.Token, bool) {
	if c.broken != nil {
		return nil, false
	}
	off := c.start()
	tok, err := c.dec.Token()
	if err != nil {
		c.broken = err
		var syn *json.SyntaxError
		switch {
		case errors.As(err, &syn):
			// The decoder's message already says what it found; its
			// offset is at, or at the start of the value holding, the
			// offending character.
			c.errs = append(c.errs, newParseError("json", c.data, int(syn.Offset), err, "malformed JSON: %s", strings.TrimPrefix(syn.Error(), "json: ")))
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			if off >= len(c.data) && len(bytes.TrimSpace(c.data)) == 0 {
				c.errs = append(c.errs, newParseError("json", c.data, off, err, "the description is empty; expected a job object"))
			} else {
				c.errs = append(c.errs, newParseError("json", c.data, len(c.data), err, "malformed JSON: unexpected end of input"))
			}
		default:
			c.errs = append(c.errs, newParseError("json", c.data, off, err, "malformed JSON: %v", err))
		}
		return nil, false
	}
	return tok, true
}

// value checks the next value against sh. path names it in messages
// ("inputs[2].source"); the top level has an empty path.
func (c *jsonChecker) value(path string, sh *shape) {
	off := c.start()
	tok, ok := c.token()
	if !ok {
		return
	}
	got := tokenKind(tok)
	if got != sh.kind {
		c.report(off, "%s: expected %s, found %s", describePath(path), kindNames[sh.kind], describeToken(tok))
		c.skip(tok)
		return
	}
	switch sh.kind {
	case kInt:
		if _, err := strconv.Atoi(tok.(json.Number).String()); err != nil {
			c.report(off, "%s: expected an integer, found %s", describePath(path), tok)
		}
	case kArray:
		for i := 0; c.more(); i++ {
			c.value(fmt.Sprintf("%s[%d]", path, i), sh.elem)
		}
		c.token() // ']'
	case kObject:
		c.object(path, sh)
	}
}

// object checks the fields of an object whose '{' has been read.
func (c *jsonChecker) object(path string, sh *shape) {
	seen := map[string]int{}
	for c.more() {
		off := c.start()
		tok, ok := c.token()
		if !ok {
			return
		}
		name := tok.(string) // the decoder only yields strings as keys
		field := name
		if path != "" {
			field = path + "." + name
		}
		if first, dup := seen[name]; dup {
			line, col := position(c.data, first)
			c.report(off, "%s: field %q is given twice (first at line %d, column %d)", describePath(path), name, line, col)
		}
		seen[name] = off
		child, known := sh.fields[name]
		if !known {
			c.report(off, "%s: unknown field %q%s", describePath(path), name, suggest(name, sh.fields))
			c.skipValue()
			continue
		}
		c.value(field, child)
	}
	c.token() // '}'
}

// more reports whether the current array or object has another element.
func (c *jsonChecker) more() bool { return c.broken == nil && c.dec.More() }

// skipValue reads and discards the next value.
func (c *jsonChecker) skipValue() {
	if tok, ok := c.token(); ok {
		c.skip(tok)
	}
}

// skip discards the rest of a value whose first token was tok.
func (c *jsonChecker) skip(tok json.Token) {
	if d, ok := tok.(json.Delim); ok && (d == '{' || d == '[') {
		for depth := 1; depth > 0; {
			t, ok := c.token()
			if !ok {
				return
			}
			switch t {
			case json.Delim('{'), json.Delim('['):
				depth++
			case json.Delim('}'), json.Delim(']'):
				depth--
			}
		}
	}
}

// tokenKind is the kind of value a token starts; -1 for null.
func tokenKind(tok json.Token) kind {
	switch t := tok.(type) {
	case string:
		return kString
	case bool:
		return kBool
	case json.Number:
		return kInt
	case json.Delim:
		if t == '{' {
			return kObject
		}
		return kArray
	}
	return -1
}

// describeToken names a token for "found ..." messages.
func describeToken(tok json.Token) string {
	switch t := tok.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("string %q", t)
	case bool:
		return strconv.FormatBool(t)
	case json.Number:
		return "number " + t.String()
	case json.Delim:
		if t == '{' {
			return "an object"
		}
		return "an array"
	}
	return fmt.Sprint(tok)
}

// describePath names a place for messages; the top level is "job".
func describePath(path string) string {
	if path == "" {
		return "job"
	}
	return path
}

// suggest proposes the known field a mistyped one was probably meant to be.
func suggest(name string, fields map[string]*shape) string {
	best, bestDist := "", 3 // suggest only within two edits
	for _, f := range slices.Sorted(maps.Keys(fields)) {
		d := editDistance(strings.ToLower(name), f)
		if d < bestDist {
			best, bestDist = f, d
		}
	}
	if best == "" {
		return fmt.Sprintf(" (known fields: %s)", strings.Join(slices.Sorted(maps.Keys(fields)), ", "))
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the Levenshtein distance between two short strings.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
