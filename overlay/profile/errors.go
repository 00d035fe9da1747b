package profile

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
)

// Error refuses a profile. It names the source, the field and the value, on
// one line, so a DaemonSet log says exactly what to fix.
type Error struct {
	Source string // a file path, or "built-in NAME"
	Field  string // e.g. devices[3].pci.bus_id; empty for whole-file problems
	Value  string
	Err    error
}

func (e *Error) Error() string { return Refusal("profile", e.Source, e.Field, e.Value, e.Err) }

func (e *Error) Unwrap() error { return e.Err }

// Refusal is the one-line message of a refused input, the shape of every
// input error (a profile's, an nvidia-smi capture's): what and its source,
// then the field and the value where known, then why.
func Refusal(what, source, field, value string, err error) string {
	var b strings.Builder
	b.WriteString(what + " " + source)
	if field != "" {
		if strings.ContainsFunc(field, unicode.IsControl) {
			// A key of the file may hold a newline; the message stays one line.
			field = strconv.Quote(field)
		}
		b.WriteString(": " + field)
	}
	if value != "" {
		if len(value) > 80 {
			value = value[:80] + "..."
		}
		fmt.Fprintf(&b, ": value %q", value)
	}
	b.WriteString(": " + oneLine(err.Error()))
	return b.String()
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// reason drops the input from an error that can say why without it (a
// pciaddr.ParseError, a boards.UnknownHCAError), since Error names the
// value.
func reason(err error) string { return pciaddr.Reason(err) }
