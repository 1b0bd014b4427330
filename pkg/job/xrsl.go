package job

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// XRSLOptions supplies what an xRSL description leaves to the service that
// receives it.
type XRSLOptions struct {
	// SessionDir is the job's session directory, an absolute local path.
	// Input files are fetched to, and output files sent from,
	// file://SessionDir/<name>. It is needed only when the description has
	// files to move.
	SessionDir string
	// Owner is the identity of the user who submitted the description.
	Owner dtr.Identity
}

// ParseXRSL reads a job description in the subset of ARC's xRSL that
// describes data: a conjunction "&" of relations "(attribute = value)".
//
// Values are "double-quoted" or 'single-quoted' strings (a doubled quote
// stands for itself), ^dstringd strings with a delimiter of the user's
// choice, bare words, lists of parenthesised sequences, $(NAME) variables
// defined earlier with rsl_substitution, and concatenations with "#".
// Attribute names ignore case and underscores; (* comments *) are skipped.
//
// The attributes read are:
//
//	jobname      → Name
//	priority     → Priority (an integer)
//	inputfiles   ("name" "URL" [extra...]) ...: fetch URL to file://SessionDir/name
//	outputfiles  ("name" "URL" [extra...]) ...: send file://SessionDir/name to URL
//
// An input whose URL is empty, or is a size or "size.checksum" as ARC's
// client writes it, is uploaded by the user and gets no file here; so does
// an output whose URL is empty, which stays in the session directory. Extra
// elements of the form "option=value" are ARC URL options: "overwrite=yes"
// sets Overwrite, "cache=no" NoCache, and the Sluice option "stage=yes"
// Stage; others are ignored. Any other extra element is a Sluice
// extension: the file's expected checksum "type:value".
//
// All other attributes (executable, arguments, stdout, walltime, ...) are
// ignored. Multi-job ("+") and alternative ("|") descriptions are refused.
// File names must be relative and stay within the session directory.
// The description must be UTF-8. Syntax errors (and a byte that is not
// UTF-8) stop the parse and are returned as a *ParseError; other
// problems are all collected and joined. The owner comes from opt.
func ParseXRSL(data []byte, opt XRSLOptions) (*Job, error) {
	data = blankBOM(data)
	if err := checkUTF8("xrsl", data); err != nil {
		return nil, err
	}
	p := &xrslParser{data: data}
	root, err := p.parse()
	if err != nil {
		return nil, err
	}
	b := &xrslBuilder{
		data:    data,
		opt:     opt,
		job:     &Job{Owner: opt.Owner},
		defined: map[string]int{},
	}
	b.walk(root, map[string]string{})
	if len(b.errs) > 0 {
		return nil, errors.Join(b.errs...)
	}
	return b.job, nil
}

// The xRSL syntax tree.

// rslNode is a boolean combination or a relation.
type rslNode interface{ offset() int }

// rslBool is "&", "|" or "+" applied to parenthesised sub-descriptions.
type rslBool struct {
	op    byte
	at    int
	items []rslNode
}

// rslRelation is "attribute op values".
type rslRelation struct {
	name   string // as written
	attr   string // lower case, underscores removed
	op     string
	at     int
	values []rslValue
}

func (b *rslBool) offset() int     { return b.at }
func (r *rslRelation) offset() int { return r.at }

// valueKind says what an rslValue is.
type valueKind int

const (
	literal  valueKind = iota // text
	variable                  // $(text)
	concat                    // parts[0] # parts[1] # ...
	sequence                  // ( parts... )
)

// rslValue is one value of a relation, or of a sequence.
type rslValue struct {
	kind  valueKind
	at    int
	text  string
	parts []rslValue
}

// xrslParser is a recursive-descent parser over the raw bytes; n is the
// offset of the next unread byte.
type xrslParser struct {
	data  []byte
	n     int
	depth int // parentheses open around n
}

// maxDepth bounds nesting, so hostile input cannot exhaust the stack.
const maxDepth = 64

// enter notes an opening parenthesis at off, refusing nesting beyond
// maxDepth; leave notes its closing.
func (p *xrslParser) enter(off int) error {
	p.depth++
	if p.depth > maxDepth {
		return p.errorAt(off, "parentheses are nested more than %d deep", maxDepth)
	}
	return nil
}

func (p *xrslParser) leave() { p.depth-- }

// specials end a bare word; they cannot appear in one.
const specials = "+&|()=<>!\"'^#$"

func (p *xrslParser) errorAt(off int, msg string, args ...any) error {
	return newParseError("xrsl", p.data, off, nil, msg, args...)
}

// found names the next unread character for "found ..." messages.
func (p *xrslParser) found() string { return describeAt(p.data, p.n) }

// peek returns the next unread byte, or 0 at the end.
func (p *xrslParser) peek() byte {
	if p.n < len(p.data) {
		return p.data[p.n]
	}
	return 0
}

// at reports whether the next unread byte is c.
func (p *xrslParser) at(c byte) bool { return p.n < len(p.data) && p.data[p.n] == c }

// where formats an offset as "line L, column C".
func (p *xrslParser) where(off int) string {
	line, col := position(p.data, off)
	return fmt.Sprintf("line %d, column %d", line, col)
}

// parse reads the whole description.
func (p *xrslParser) parse() (rslNode, error) {
	root, err := p.parseRSL()
	if err != nil {
		return nil, err
	}
	if _, err := p.skip(); err != nil {
		return nil, err
	}
	if p.n < len(p.data) {
		return nil, p.errorAt(p.n, "unexpected %s after the end of the description", p.found())
	}
	return root, nil
}

// skip moves past white space and comments, reporting whether it moved.
func (p *xrslParser) skip() (bool, error) {
	start := p.n
	for p.n < len(p.data) {
		switch c := p.data[p.n]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f':
			p.n++
		case c == '(' && p.n+1 < len(p.data) && p.data[p.n+1] == '*':
			end := bytes.Index(p.data[p.n+2:], []byte("*)"))
			if end < 0 {
				return false, p.errorAt(p.n, `comment "(*" is not closed: expected "*)" before the end of input`)
			}
			p.n += 2 + end + 2
		default:
			return p.n > start, nil
		}
	}
	return p.n > start, nil
}

// parseRSL reads a boolean combination ("&(...)(...)") or one relation.
func (p *xrslParser) parseRSL() (rslNode, error) {
	if _, err := p.skip(); err != nil {
		return nil, err
	}
	start := p.n
	if c := p.peek(); c == '&' || c == '|' || c == '+' {
		p.n++
		b := &rslBool{op: c, at: start}
		if _, err := p.skip(); err != nil {
			return nil, err
		}
		if !p.at('(') {
			return nil, p.errorAt(p.n, "expected \"(\" after %q, found %s", c, p.found())
		}
		for p.at('(') {
			open := p.n
			if err := p.enter(open); err != nil {
				return nil, err
			}
			p.n++
			child, err := p.parseRSL()
			if err != nil {
				return nil, err
			}
			if _, err := p.skip(); err != nil {
				return nil, err
			}
			if !p.at(')') {
				return nil, p.errorAt(p.n, "expected \")\" to close %s opened at %s, found %s%s",
					describeNode(child), p.where(open), p.found(), quoteHint(p.peek()))
			}
			p.n++
			p.leave()
			b.items = append(b.items, child)
			if _, err := p.skip(); err != nil {
				return nil, err
			}
		}
		return b, nil
	}
	return p.parseRelation()
}

// describeNode names a parsed sub-description for messages.
func describeNode(n rslNode) string {
	if r, ok := n.(*rslRelation); ok {
		return fmt.Sprintf("the relation %q", r.name)
	}
	return "the group"
}

// quoteHint explains a character that ended a bare word unexpectedly.
func quoteHint(c byte) string {
	if c != 0 && c != ')' && strings.IndexByte(specials, c) >= 0 {
		return " (a value containing any of " + specials + " or spaces must be quoted)"
	}
	return ""
}

// parseRelation reads "attribute op values".
func (p *xrslParser) parseRelation() (rslNode, error) {
	start := p.n
	name, ok, err := p.parseString()
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, p.errorAt(p.n, "expected an attribute name, or \"&\" to start a job description, found %s", p.found())
	}
	if strings.ContainsAny(name, specials) || name == "" {
		return nil, p.errorAt(start, "attribute name %q is empty or contains one of %s", name, specials)
	}
	if _, err := p.skip(); err != nil {
		return nil, err
	}
	op := p.parseOp()
	if op == "" {
		return nil, p.errorAt(p.n, "expected a relation operator (=, !=, <, <=, >, >=) after attribute %q, found %s", name, p.found())
	}
	values, err := p.parseList()
	if err != nil {
		return nil, err
	}
	attr := strings.ReplaceAll(strings.ToLower(name), "_", "")
	return &rslRelation{name: name, attr: attr, op: op, at: start, values: values}, nil
}

// parseOp reads a relation operator, or returns "" if there is none.
func (p *xrslParser) parseOp() string {
	for _, op := range []string{"!=", "<=", ">=", "=", "<", ">"} {
		if bytes.HasPrefix(p.data[p.n:], []byte(op)) {
			p.n += len(op)
			return op
		}
	}
	return ""
}

// parseList reads values up to a ")" or anything that cannot start one,
// joining neighbours written without space between them, or with "#".
func (p *xrslParser) parseList() ([]rslValue, error) {
	var vals []rslValue
	joinable := false // the last value may be joined to the next
	for {
		spaced, err := p.skip()
		if err != nil {
			return nil, err
		}
		if p.at('#') {
			if len(vals) == 0 || !joinable {
				return nil, p.errorAt(p.n, "\"#\" (concatenation) needs a string or variable on its left")
			}
			p.n++
			if _, err := p.skip(); err != nil {
				return nil, err
			}
			v, ok, err := p.parseTerm()
			if err != nil {
				return nil, err
			}
			if !ok || v.kind == sequence {
				return nil, p.errorAt(p.n, "expected a string or variable after \"#\", found %s", p.found())
			}
			vals[len(vals)-1] = join(vals[len(vals)-1], v)
			continue
		}
		v, ok, err := p.parseTerm()
		if err != nil {
			return nil, err
		}
		if !ok {
			return vals, nil
		}
		if !spaced && joinable && v.kind != sequence {
			vals[len(vals)-1] = join(vals[len(vals)-1], v)
		} else {
			vals = append(vals, v)
		}
		joinable = v.kind != sequence
	}
}

// join concatenates two values, keeping a chain "a # b # c" flat.
func join(left, right rslValue) rslValue {
	if left.kind == concat {
		left.parts = append(left.parts, right)
		return left
	}
	return rslValue{kind: concat, at: left.at, parts: []rslValue{left, right}}
}

// parseTerm reads one value: a sequence, a variable or a string. ok is false
// if the next character cannot start a value.
func (p *xrslParser) parseTerm() (v rslValue, ok bool, err error) {
	start := p.n
	switch p.peek() {
	case '(':
		if err := p.enter(start); err != nil {
			return v, false, err
		}
		p.n++
		items, err := p.parseList()
		if err != nil {
			return v, false, err
		}
		if !p.at(')') {
			return v, false, p.errorAt(p.n, "expected \")\" to close the list opened at %s, found %s%s",
				p.where(start), p.found(), quoteHint(p.peek()))
		}
		p.n++
		p.leave()
		return rslValue{kind: sequence, at: start, parts: items}, true, nil
	case '$':
		p.n++
		if _, err := p.skip(); err != nil {
			return v, false, err
		}
		if !p.at('(') {
			return v, false, p.errorAt(p.n, "expected \"(\" after \"$\" (a variable is written $(NAME)), found %s", p.found())
		}
		p.n++
		if _, err := p.skip(); err != nil {
			return v, false, err
		}
		name, ok, err := p.parseString()
		if err != nil {
			return v, false, err
		}
		if !ok || name == "" || strings.ContainsAny(name, specials) {
			return v, false, p.errorAt(p.n, "expected a variable name in $( ), found %s", p.found())
		}
		if _, err := p.skip(); err != nil {
			return v, false, err
		}
		if !p.at(')') {
			return v, false, p.errorAt(p.n, "expected \")\" to end the variable $(%s, found %s", name, p.found())
		}
		p.n++
		return rslValue{kind: variable, at: start, text: name}, true, nil
	}
	s, ok, err := p.parseString()
	if err != nil || !ok {
		return v, false, err
	}
	return rslValue{kind: literal, at: start, text: s}, true, nil
}

// parseString reads a quoted string or a bare word. ok is false if the next
// character starts neither.
func (p *xrslParser) parseString() (s string, ok bool, err error) {
	start := p.n
	switch c := p.peek(); c {
	case '"', '\'':
		p.n++
		return p.quoted(start, c)
	case '^':
		if p.n+1 >= len(p.data) {
			return "", false, p.errorAt(start, "expected a delimiter character after \"^\", found end of input")
		}
		delim := p.data[p.n+1]
		p.n += 2
		return p.quoted(start, delim)
	}
	for p.n < len(p.data) {
		c := p.data[p.n]
		if strings.IndexByte(specials, c) >= 0 || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' {
			break
		}
		p.n++
	}
	return string(p.data[start:p.n]), p.n > start, nil
}

// quoted reads the rest of a string opened at start and closed by q, in
// which a doubled q stands for one.
func (p *xrslParser) quoted(start int, q byte) (string, bool, error) {
	var sb strings.Builder
	for {
		end := bytes.IndexByte(p.data[p.n:], q)
		if end < 0 {
			return "", false, p.errorAt(start, "string opened here is not closed: expected %q before the end of input", q)
		}
		sb.Write(p.data[p.n : p.n+end])
		p.n += end + 1
		if !p.at(q) {
			return sb.String(), true, nil
		}
		sb.WriteByte(q)
		p.n++
	}
}

// xrslBuilder turns a parsed description into a Job, collecting problems.
type xrslBuilder struct {
	data    []byte
	opt     XRSLOptions
	job     *Job
	errs    []error
	defined map[string]int // attribute → offset of its first relation

	sessionChecked bool
	sessionErr     bool
}

// errorAt records a problem at byte offset off.
func (b *xrslBuilder) errorAt(off int, cause error, msg string, args ...any) {
	b.add(newParseError("xrsl", b.data, off, cause, msg, args...))
}

// add records a problem, up to maxProblems of them.
func (b *xrslBuilder) add(err error) {
	switch {
	case len(b.errs) < maxProblems:
		b.errs = append(b.errs, err)
	case len(b.errs) == maxProblems:
		b.errs = append(b.errs, errTooMany)
	}
}

// walk visits a node with the variables defined so far. A nested "&" gets
// its own copy, so definitions inside it do not leak out.
func (b *xrslBuilder) walk(n rslNode, vars map[string]string) {
	switch n := n.(type) {
	case *rslBool:
		switch {
		case n.op == '+' && len(n.items) == 1:
			b.walk(n.items[0], vars)
		case n.op == '+':
			b.errorAt(n.at, nil, "a multi-job description (\"+\" with %d jobs) is not supported: submit one job per description", len(n.items))
		case n.op == '|':
			b.errorAt(n.at, nil, "alternatives (\"|\") are not supported: give one set of attributes")
		default:
			scope := maps.Clone(vars)
			for _, item := range n.items {
				b.walk(item, scope)
			}
		}
	case *rslRelation:
		b.relation(n, vars)
	}
}

// relation applies one relation to the job.
func (b *xrslBuilder) relation(r *rslRelation, vars map[string]string) {
	switch r.attr {
	case "rslsubstitution":
		b.substitution(r, vars)
	case "jobname":
		if s, ok := b.single(r, vars); ok {
			b.job.Name = s
		}
	case "priority":
		s, ok := b.single(r, vars)
		if !ok {
			return
		}
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			b.errorAt(r.values[0].at, err, "%s: %q is not an integer", r.name, s)
			return
		}
		b.job.Priority = n
	case "inputfiles":
		b.files(r, vars, true)
	case "outputfiles":
		b.files(r, vars, false)
	}
}

// once checks that a data attribute uses "=" and is not given twice.
func (b *xrslBuilder) once(r *rslRelation) bool {
	if r.op != "=" {
		b.errorAt(r.at, nil, "%s: operator %q is not allowed here; use \"=\"", r.name, r.op)
		return false
	}
	if first, dup := b.defined[r.attr]; dup {
		line, col := position(b.data, first)
		b.errorAt(r.at, nil, "%s is given twice (first at line %d, column %d)", r.name, line, col)
		return false
	}
	b.defined[r.attr] = r.at
	return true
}

// single returns the one string value of a relation.
func (b *xrslBuilder) single(r *rslRelation, vars map[string]string) (string, bool) {
	if !b.once(r) {
		return "", false
	}
	if len(r.values) != 1 {
		b.errorAt(r.at, nil, "%s: expected one value, found %d", r.name, len(r.values))
		return "", false
	}
	v, ok := b.eval(r.values[0], vars)
	if !ok {
		return "", false
	}
	if v.isSeq {
		b.errorAt(v.at, nil, "%s: expected a string, found a list", r.name)
		return "", false
	}
	return v.str, true
}

// substitution defines the variables of an rsl_substitution relation:
// ("NAME" "value") pairs.
func (b *xrslBuilder) substitution(r *rslRelation, vars map[string]string) {
	for _, raw := range r.values {
		v, ok := b.eval(raw, vars)
		if !ok {
			continue
		}
		if !v.isSeq || len(v.seq) != 2 || v.seq[0].isSeq || v.seq[1].isSeq {
			b.errorAt(v.at, nil, "%s: expected (\"NAME\" \"value\") pairs", r.name)
			continue
		}
		vars[v.seq[0].str] = v.seq[1].str
	}
}

// xval is an evaluated value: a string or a list of values.
type xval struct {
	at    int
	str   string
	isSeq bool
	seq   []xval
}

// eval resolves variables and concatenations.
func (b *xrslBuilder) eval(v rslValue, vars map[string]string) (xval, bool) {
	switch v.kind {
	case variable:
		s, ok := vars[v.text]
		if !ok {
			b.errorAt(v.at, nil, "variable $(%s) is not defined; define it earlier with (rsl_substitution = (\"%s\" \"value\"))", v.text, v.text)
		}
		return xval{at: v.at, str: s}, ok
	case concat:
		var sb strings.Builder
		ok := true
		for _, part := range v.parts {
			x, okX := b.eval(part, vars) // a literal or a variable
			sb.WriteString(x.str)
			ok = ok && okX
		}
		return xval{at: v.at, str: sb.String()}, ok
	case sequence:
		out := xval{at: v.at, isSeq: true}
		ok := true
		for _, part := range v.parts {
			x, okX := b.eval(part, vars)
			out.seq = append(out.seq, x)
			ok = ok && okX
		}
		return out, ok
	}
	return xval{at: v.at, str: v.text}, true
}

// files reads an inputfiles or outputfiles relation.
func (b *xrslBuilder) files(r *rslRelation, vars map[string]string, input bool) {
	if !b.once(r) {
		return
	}
	for i, raw := range r.values {
		v, ok := b.eval(raw, vars)
		if !ok {
			continue
		}
		if !v.isSeq || len(v.seq) < 2 {
			b.errorAt(v.at, nil, "%s entry %d: expected (\"name\" \"URL\"), found %s", r.name, i+1, describeXval(v))
			continue
		}
		if bad := firstList(v.seq); bad != nil {
			b.errorAt(bad.at, nil, "%s entry %d: expected strings, found a nested list", r.name, i+1)
			continue
		}
		name, remote := v.seq[0], v.seq[1]
		if err := checkName(name.str); err != nil {
			b.errorAt(name.at, err, "%s entry %d: %v", r.name, i+1, err)
			continue
		}
		f, ok := b.extras(r.name, i+1, v.seq[2:])
		if !ok {
			continue
		}
		if (input && uploadedByUser(remote.str)) || (!input && remote.str == "") {
			continue
		}
		local, ok := b.sessionURL(r, name.str)
		if !ok {
			continue
		}
		if input {
			f.Source, f.Destination = remote.str, local
			b.job.Inputs = append(b.job.Inputs, f)
		} else {
			f.Source, f.Destination = local, remote.str
			b.job.Outputs = append(b.job.Outputs, f)
		}
	}
}

// extras reads the elements after name and URL: ARC URL options
// ("overwrite=yes", "cache=no"), the Sluice staging option ("stage=yes") and the Sluice
// checksum extension ("type:value").
func (b *xrslBuilder) extras(attr string, entry int, xs []xval) (File, bool) {
	var f File
	ok := true
	for _, x := range xs {
		if name, val, isOpt := urlOption(x.str); isOpt {
			var set *bool
			switch name {
			case "overwrite":
				set = &f.Overwrite
			case "stage":
				set = &f.Stage
			case "cache":
				// ARC's cache=no keeps the file out of the cache, cache=yes
				// lets it in; its other modes (renew, copy, invariant,
				// check) Sluice does not have, and ignores.
				switch strings.ToLower(val) {
				case "no", "false":
					f.NoCache = true
				case "yes", "true":
					f.NoCache = false
				}
				continue
			default:
				continue // other ARC URL options (threads, ...) do not apply
			}
			switch strings.ToLower(val) {
			case "yes", "true":
				*set = true
			case "no", "false":
				*set = false
			default:
				b.errorAt(x.at, nil, "%s entry %d: option %q: expected %s=yes or %s=no", attr, entry, x.str, name, name)
				ok = false
			}
			continue
		}
		if f.Checksum != "" {
			b.errorAt(x.at, nil, "%s entry %d: a second checksum %q (the first is %q)", attr, entry, x.str, f.Checksum)
			ok = false
			continue
		}
		f.Checksum = x.str
	}
	return f, ok
}

// sessionURL is the file URL of name in the session directory.
func (b *xrslBuilder) sessionURL(r *rslRelation, name string) (string, bool) {
	if !b.sessionChecked {
		b.sessionChecked = true
		switch dir := b.opt.SessionDir; {
		case dir == "":
			b.add(fmt.Errorf("%s: no session directory was given (XRSLOptions.SessionDir), so files cannot be placed", r.name))
			b.sessionErr = true
		case !path.IsAbs(dir):
			b.add(fmt.Errorf("session directory %q is not an absolute path", dir))
			b.sessionErr = true
		}
	}
	if b.sessionErr {
		return "", false
	}
	u := url.URL{Scheme: "file", Path: path.Join(b.opt.SessionDir, name)}
	return u.String(), true
}

// checkName refuses file names that would leave the session directory.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("file name is empty")
	case strings.HasPrefix(name, "/"):
		return fmt.Errorf("file name %q is absolute; names are relative to the session directory", name)
	case strings.ContainsRune(name, 0):
		return fmt.Errorf("file name %q contains a NUL character", name)
	case path.Clean(name) == ".":
		return fmt.Errorf("file name %q names the session directory itself, not a file in it", name)
	}
	for _, elem := range strings.Split(name, "/") {
		if elem == ".." {
			return fmt.Errorf("file name %q has a \"..\" element, which would leave the session directory", name)
		}
	}
	return nil
}

// uploadedByUser reports whether an input's second element means the user
// uploads the file: empty, or a size or "size.checksum" as ARC's client
// writes it.
func uploadedByUser(s string) bool {
	if s == "" {
		return true
	}
	size, _, _ := strings.Cut(s, ".")
	if size == "" {
		return false
	}
	for _, c := range size {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// urlOption splits an ARC URL option "name=value". A checksum "type:value"
// is not one, even if its value holds "=".
func urlOption(s string) (name, value string, ok bool) {
	name, value, ok = strings.Cut(s, "=")
	if !ok || name == "" || strings.Contains(name, ":") {
		return "", "", false
	}
	return strings.ToLower(name), value, true
}

// firstList returns the first element of xs that is a list.
func firstList(xs []xval) *xval {
	for i := range xs {
		if xs[i].isSeq {
			return &xs[i]
		}
	}
	return nil
}

// describeXval names an evaluated value for messages.
func describeXval(v xval) string {
	if v.isSeq {
		return fmt.Sprintf("a list of %d", len(v.seq))
	}
	return fmt.Sprintf("the string %q", v.str)
}
