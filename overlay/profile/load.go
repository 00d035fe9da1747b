package profile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"unicode"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// MaxSize is the largest profile accepted. Real profiles are tens of KiB; the
// limit keeps a hostile file from costing memory or time.
const MaxSize = 4 << 20

// Error refuses a profile. It names the source, the field and the value, on
// one line, so a DaemonSet log says exactly what to fix.
type Error struct {
	Source string // a file path, or "built-in NAME"
	Field  string // e.g. devices[3].pci.bus_id; empty for whole-file problems
	Value  string
	Err    error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("profile ")
	b.WriteString(e.Source)
	if e.Field != "" {
		b.WriteString(": ")
		field := e.Field
		if strings.ContainsFunc(field, unicode.IsControl) {
			// A key of the file may hold a newline; the message stays one line.
			field = strconv.Quote(field)
		}
		b.WriteString(field)
	}
	if e.Value != "" {
		v := e.Value
		if len(v) > 80 {
			v = v[:80] + "..."
		}
		fmt.Fprintf(&b, ": value %q", v)
	}
	b.WriteString(": ")
	b.WriteString(oneLine(e.Err.Error()))
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// LoadFile reads and decodes a profile file.
func LoadFile(path string) (*Profile, error) {
	// O_NONBLOCK: a FIFO named as the profile must not hang the render;
	// the regular-file check below refuses it.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, &Error{Source: path, Err: err}
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, &Error{Source: path, Err: err}
	}
	if !info.Mode().IsRegular() {
		return nil, &Error{Source: path, Err: fmt.Errorf("not a regular file (%s)", info.Mode().Type())}
	}
	// Read one byte past the limit so that an oversized file is told apart
	// from one exactly at the limit, without reading the rest of it.
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, &Error{Source: path, Err: err}
	}
	return Parse(path, data)
}

// Parse decodes profile YAML. source names it in errors.
func Parse(source string, data []byte) (*Profile, error) {
	fail := func(err error) (*Profile, error) { return nil, &Error{Source: source, Err: err} }
	if len(data) > MaxSize {
		return fail(fmt.Errorf("larger than the %d MiB limit", MaxSize>>20))
	}
	if i := bytes.IndexByte(data, 0); i >= 0 {
		return fail(fmt.Errorf("NUL byte at offset %d: a profile is YAML text", i))
	}
	if !utf8.Valid(data) {
		return fail(errors.New("not UTF-8 text"))
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fail(fmt.Errorf("not valid YAML: %w", err))
	}
	if len(doc.Content) == 0 {
		return fail(errors.New("empty: want an nvml-mock profile with devices"))
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return fail(fmt.Errorf("the top level is a YAML %s; want a mapping with device_defaults, devices and pcie_topology", kindName(top.Kind)))
	}
	if err := checkAliases(source, top); err != nil {
		return nil, err
	}
	var p Profile
	if err := top.Decode(&p); err != nil {
		return nil, decodeError(source, top, err)
	}
	if err := checkIntegers(source, top, reflect.TypeFor[Profile](), ""); err != nil {
		return nil, err
	}
	return &p, nil
}

// nodeError is a decoding failure at a known line of the file.
type nodeError struct {
	line  int
	value string
	err   error
}

func (e *nodeError) Error() string { return fmt.Sprintf("line %d: %v", e.line, e.err) }

// decodeError turns a YAML decoding error into one that names the field.
// yaml.v3 reports only a line, so find which field sits on that line.
func decodeError(source string, top *yaml.Node, err error) error {
	var ne *nodeError
	if errors.As(err, &ne) {
		field, _ := fieldAtLine(top, ne.line)
		return &Error{Source: source, Field: field, Value: ne.value, Err: fmt.Errorf("%w (line %d)", ne.err, ne.line)}
	}
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg := te.Errors[0]
		line, rest := splitLine(msg)
		field, value := fieldOfTypeError(top, line, rest)
		return &Error{Source: source, Field: field, Value: value, Err: fmt.Errorf("%s (line %d)", describeTypeError(rest), line)}
	}
	return &Error{Source: source, Err: err}
}

// splitLine splits "line 12: message" into 12 and "message".
func splitLine(msg string) (int, string) {
	head, rest, ok := strings.Cut(msg, ": ")
	if !ok || !strings.HasPrefix(head, "line ") {
		return 0, msg
	}
	n, err := strconv.Atoi(strings.TrimPrefix(head, "line "))
	if err != nil {
		return 0, msg
	}
	return n, rest
}

// describeTypeError rephrases "cannot unmarshal !!str `x` into int" as
// "want an integer, found a string".
func describeTypeError(msg string) string {
	rest, ok := strings.CutPrefix(msg, "cannot unmarshal ")
	if !ok {
		return msg
	}
	tag, _, _ := strings.Cut(rest, " ")
	_, into, ok := strings.Cut(rest, " into ")
	if !ok {
		return msg
	}
	return fmt.Sprintf("want %s, found %s", goTypeName(into), yamlTagName(tag))
}

func yamlTagName(tag string) string {
	switch tag {
	case "!!str":
		return "a string"
	case "!!int":
		return "an integer"
	case "!!float":
		return "a float"
	case "!!bool":
		return "a boolean"
	case "!!seq":
		return "a sequence"
	case "!!map":
		return "a mapping"
	case "!!null":
		return "null"
	}
	return tag
}

func goTypeName(t string) string {
	switch {
	case strings.HasPrefix(t, "[]"):
		return "a sequence"
	case strings.HasPrefix(t, "profile."):
		return "a mapping"
	case t == "string":
		return "a string"
	case strings.HasPrefix(t, "uint"):
		return "a non-negative integer"
	case strings.HasPrefix(t, "int"):
		return "an integer"
	}
	return t
}

// fieldOfTypeError names the node a yaml.v3 type error is about. The error
// gives only a line and the node's tag ("cannot unmarshal !!seq into
// string"); on a line such as bus_id: ["x"] both the sequence and its
// scalar sit, and the tag tells them apart. Without a match it falls back
// to fieldAtLine.
func fieldOfTypeError(top *yaml.Node, line int, msg string) (string, string) {
	if rest, ok := strings.CutPrefix(msg, "cannot unmarshal "); ok {
		tag, _, _ := strings.Cut(rest, " ")
		if path, value, ok := taggedNodeAtLine(top, line, tag); ok {
			return path, value
		}
	}
	return fieldAtLine(top, line)
}

// taggedNodeAtLine finds the outermost node with the tag on the line.
func taggedNodeAtLine(n *yaml.Node, line int, tag string) (string, string, bool) {
	var walk func(n *yaml.Node, at string) (string, string, bool)
	match := func(v *yaml.Node, p string) (string, string, bool) {
		if v.Line == line && v.ShortTag() == tag {
			return p, nodeText(v), true
		}
		return walk(v, p)
	}
	walk = func(n *yaml.Node, at string) (string, string, bool) {
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				if p, v, ok := match(n.Content[i+1], join(at, n.Content[i].Value)); ok {
					return p, v, true
				}
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				if p, v, ok := match(c, fmt.Sprintf("%s[%d]", at, i)); ok {
					return p, v, true
				}
			}
		}
		return "", "", false
	}
	return walk(n, "")
}

// nodeText is a scalar's value, or a collection in YAML's flow style.
func nodeText(v *yaml.Node) string {
	if v.Kind == yaml.ScalarNode {
		return v.Value
	}
	flow := *v
	flow.Style = yaml.FlowStyle
	b, err := yaml.Marshal(&flow)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// fieldAtLine finds the innermost node on a line and returns its path
// (devices[3].pci.bus_id) and, for a scalar, its value.
func fieldAtLine(n *yaml.Node, line int) (string, string) {
	var path, value string
	var walk func(n *yaml.Node, at string) bool
	visit := func(k, v *yaml.Node, p string) bool {
		if v.Kind == yaml.ScalarNode || v.Kind == yaml.AliasNode {
			if v.Line == line {
				path, value = p, v.Value
				return true
			}
			return false
		}
		if walk(v, p) {
			return true
		}
		if v.Line == line || (k != nil && k.Line == line) {
			path = p
			return true
		}
		return false
	}
	walk = func(n *yaml.Node, at string) bool {
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := n.Content[i].Value
				if at != "" {
					p = at + "." + p
				}
				if visit(n.Content[i], n.Content[i+1], p) {
					return true
				}
			}
		case yaml.SequenceNode:
			for i, v := range n.Content {
				if visit(nil, v, fmt.Sprintf("%s[%d]", at, i)) {
					return true
				}
			}
		}
		return false
	}
	walk(n, "")
	return path, value
}
