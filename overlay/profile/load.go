package profile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"syscall"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// MaxSize is the largest profile accepted. Real profiles are tens of KiB; the
// limit keeps a hostile file from costing memory or time.
const MaxSize = 4 << 20

// LoadFile reads and decodes a profile file.
func LoadFile(path string) (*Profile, error) {
	data, err := ReadRegularFile(path, MaxSize)
	if err != nil {
		return nil, &Error{Source: path, Err: err}
	}
	return Parse(path, data)
}

// ReadRegularFile reads a regular file of at most limit bytes, and one
// byte more of a larger one: enough for the caller's size check to tell an
// oversized file from one exactly at the limit, without reading the rest.
// Files a ConfigMap or a user names (a profile, a fleet map) come through
// it. O_NONBLOCK: a FIFO named so must not hang the caller; the
// regular-file check refuses it.
func ReadRegularFile(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%s)", info.Mode())
	}
	return io.ReadAll(io.LimitReader(f, limit+1))
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
	d := &decoder{source: source}
	if err := d.decode(top, reflect.ValueOf(&p).Elem(), ""); err != nil {
		return nil, err
	}
	p.Unknown = unknownKeys(source, top)
	return &p, nil
}

// decoder fills the schema types from a YAML node tree field by field, so
// that every error names the exact field (devices[3].pci.bus_id); yaml.v3
// itself reports only a line. Aliases are expanded as they are met:
// checkAliases has already bounded what they expand to.
type decoder struct {
	source string
}

func (d *decoder) fail(field string, n *yaml.Node, err error) error {
	value := ""
	if n.Kind == yaml.ScalarNode {
		value = n.Value
	}
	return &Error{Source: d.source, Field: field, Value: value, Err: fmt.Errorf("%w (line %d)", err, n.Line)}
}

func (d *decoder) decode(n *yaml.Node, v reflect.Value, field string) error {
	if n.Kind == yaml.AliasNode {
		return d.decode(n.Alias, v, field)
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil // an empty value leaves the field unset
	}
	if _, custom := v.Addr().Interface().(yaml.Unmarshaler); custom {
		if err := n.Decode(v.Addr().Interface()); err != nil {
			return d.fail(field, n, err)
		}
		return nil
	}
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		return d.decode(n, v.Elem(), field)
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return d.fail(field, n, fmt.Errorf("want a mapping, found a %s", kindName(n.Kind)))
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, value := n.Content[i], n.Content[i+1]
			f, ok := fieldByTag(v.Type(), key.Value)
			if !ok {
				continue // nvml-mock profiles carry much that sysfs does not need
			}
			if err := d.decode(value, v.FieldByIndex(f.Index), join(field, key.Value)); err != nil {
				return err
			}
		}
		return nil
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return d.fail(field, n, fmt.Errorf("want a sequence, found a %s", kindName(n.Kind)))
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			if err := d.decode(item, s.Index(i), fmt.Sprintf("%s[%d]", field, i)); err != nil {
				return err
			}
		}
		v.Set(s)
		return nil
	}
	if n.Kind != yaml.ScalarNode {
		return d.fail(field, n, fmt.Errorf("want %s, found a %s", goTypeName(v.Type().String()), kindName(n.Kind)))
	}
	if isInteger(v.Kind()) && n.ShortTag() == "!!float" {
		// yaml.v3 would quietly truncate max_link_gen: 4.5 to 4.
		return d.fail(field, n, errors.New("want an integer, found a float"))
	}
	if err := n.Decode(v.Addr().Interface()); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) && len(te.Errors) > 0 {
			_, msg, _ := strings.Cut(te.Errors[0], ": ")
			err = errors.New(describeTypeError(msg))
		}
		return d.fail(field, n, err)
	}
	return nil
}

func isInteger(k reflect.Kind) bool {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
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
