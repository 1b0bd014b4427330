package scheduler

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// StateLines writes ARC's dtr.state format (what A-REX writes to its
// control directory): one line per unfinished DTR, "<id> <STATE> <priority>
// <share>", and for TRANSFER and TRANSFERRING also " <destination>
// <delivery host>". The host is that of the worker process delivering the
// DTR, from deliveryHost(its grant) (the host in its heartbeats); it is empty,
// as ARC writes it for local delivery, for a DTR still queued for
// TRANSFER and for one whose deliverer has not been heard from. The share
// (a DN, say), the destination and the host are written by stateField:
// whitespace, control characters and '%' percent-encoded, so that the
// token count stays right (ARC's own file gets spaces wrong) and no value
// can end a line or start another.
func StateLines(ds []dtr.DTR, deliveryHost func(grant string) string) []byte {
	var b bytes.Buffer
	for i := range ds {
		d := &ds[i]
		fmt.Fprintf(&b, "%s %s %d %s", d.ID, d.State, d.Priority, stateField(d.Share))
		if d.State == dtr.Transfer || d.State == dtr.Transferring {
			host := ""
			if d.State == dtr.Transferring && d.Grant != "" && deliveryHost != nil {
				host = deliveryHost(d.Grant)
			}
			fmt.Fprintf(&b, " %s %s", stateField(d.Destination), stateField(host))
		}
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// stateField returns s as one token of a dtr.state line: each byte of a
// whitespace or control character (Unicode's, line and paragraph
// separators included), of invalid UTF-8, and of '%' itself written as
// %XX, so that the encoding can be undone.
func stateField(s string) string {
	clean := true
	for _, r := range s {
		if needsEscape(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if needsEscape(r) {
			for _, c := range []byte(s[i : i+size]) {
				fmt.Fprintf(&b, "%%%02X", c)
			}
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

func needsEscape(r rune) bool {
	return r == '%' || r == utf8.RuneError || unicode.IsSpace(r) || unicode.IsControl(r)
}

// WriteFileAtomic replaces path with data: a reader sees the old file or
// the new one, never a part.
func WriteFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// PriorityChange is one line of a dtr.state.prio file.
type PriorityChange struct {
	DTR      uuid.UUID
	Priority int
}

// ParsePriorityFile reads ARC's dtr.state.prio format: lines "<id> <prio>",
// absolute priorities 1–100. Blank lines and lines starting with # are
// skipped. Every malformed line is reported by number, however long; the
// good lines are returned all the same.
func ParsePriorityFile(data []byte) ([]PriorityChange, error) {
	var out []PriorityChange
	var errs []error
	n := 0
	for raw := range bytes.Lines(data) { // no line is too long
		n++
		line := strings.TrimSpace(string(raw))
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			errs = append(errs, fmt.Errorf("line %d %s: want \"<dtr id> <priority>\"", n, quoteStart(line)))
			continue
		}
		id, err := uuid.Parse(fields[0])
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: DTR id %s: %w", n, quoteStart(fields[0]), err))
			continue
		}
		p, err := strconv.Atoi(fields[1])
		if err != nil || p < 1 || p > 100 {
			errs = append(errs, fmt.Errorf("line %d: priority %s is not an integer 1–100", n, quoteStart(fields[1])))
			continue
		}
		out = append(out, PriorityChange{DTR: id, Priority: p})
	}
	return out, errors.Join(errs...)
}

// quoteStart quotes s for a message, cut after its first 80 bytes: a line
// may be of any length, and the messages go to the log.
func quoteStart(s string) string {
	if len(s) <= 80 {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:80]) + "…"
}

// readPriorityFile takes path.prio if it is there: its lines are parsed and
// the file is renamed to path.prio.read, as ARC does.
func readPriorityFile(path string) ([]PriorityChange, error) {
	prio := path + ".prio"
	data, err := os.ReadFile(prio)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if err := os.Rename(prio, prio+".read"); err != nil {
		return nil, err
	}
	changes, perr := ParsePriorityFile(data)
	if perr != nil {
		perr = fmt.Errorf("%s: %w", prio, perr)
	}
	return changes, perr
}
