// Package fleet reads a fleet map: which profile each node of one install
// renders. serve reads it at every sync, so the map, like a profile, is
// edited in its ConfigMap and followed without a restart.
//
// The format is a contract with the Helm chart that writes it:
//
//	# The first rule that matches wins: the node's name, then the label
//	# rules in order, then default.
//	nodes:                 # node name -> profile
//	  worker-a: dgx-a100
//	labels:                # then the first rule all of whose labels the node has
//	  - match:
//	      nvml-mock/profile: gb200
//	    profile: gb200.yaml
//	default: dgx-a100      # optional; without it an unmatched node is not served
//
// A profile is a built-in's name or a profile file. A relative file is
// relative to the map's directory, taken as named and never with its
// symlinks resolved: a ConfigMap holding fleet.yaml and gb200.yaml mounts
// each key as a symlink through ..data, and the directory the map's
// symlink leads to is removed at the ConfigMap's next update.
package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
)

// MaxSize is the largest map accepted: a map of thousands of nodes is tens
// of KiB, and the limit keeps a wrong file (a log, a FIFO's flood) from
// costing memory.
const MaxSize = 1 << 20

// ConfigMapKey is the map's key in the chart's fleet ConfigMap, beside the
// profiles it names by file name.
const ConfigMapKey = "fleet.yaml"

// Map is a parsed fleet map.
type Map struct {
	// File is the map's path as given; relative profile files are
	// relative to its directory.
	File string `yaml:"-"`
	// Nodes maps a node's name to its profile.
	Nodes map[string]string `yaml:"nodes"`
	// Labels are tried in order for a node that Nodes does not name.
	Labels []LabelRule `yaml:"labels"`
	// Default is the profile of a node no rule matches; empty, such a node
	// is not served.
	Default string `yaml:"default"`
}

// LabelRule gives Profile to a node that carries every label of Match.
type LabelRule struct {
	Match   map[string]string `yaml:"match"`
	Profile string            `yaml:"profile"`
}

// Choice is the profile a map gives one node.
type Choice struct {
	// Profile is a built-in's name, or a profile file's absolute path.
	Profile string
	// Builtin says Profile is a built-in's name: it has no file to watch.
	Builtin bool
	// Rule is the rule that chose it: nodes[worker-a], labels[0]
	// {nvml-mock/profile=gb200} or default.
	Rule string
}

// Error refuses a map: one line naming the file, the field and the value,
// in the shape of a refused profile.
type Error struct {
	File  string
	Field string // e.g. nodes.worker-a or labels[1].match; empty for the whole file
	Value string
	Err   error
}

func (e *Error) Error() string { return profile.Refusal("fleet map", e.File, e.Field, e.Value, e.Err) }

func (e *Error) Unwrap() error { return e.Err }

// NoMatchError is a node that no rule of a map without a default matches:
// serve does not serve it, and says why in one line.
type NoMatchError struct {
	File string
	Node string
}

func (e *NoMatchError) Error() string {
	return fmt.Sprintf("fleet map %s: node %s matches no rule and the map has no default", e.File, e.Node)
}

// Load reads and parses the map in file.
func Load(file string) (*Map, error) {
	data, err := profile.ReadRegularFile(file, MaxSize)
	if err != nil {
		return nil, &Error{File: file, Err: err}
	}
	return Parse(file, data)
}

// Parse decodes a map; file names it in errors and anchors its relative
// profile files. Any field the format lacks is refused, as is a rule that
// could never serve a node right: an empty profile, a label rule with
// nothing to match, a label that no Node can carry.
func Parse(file string, data []byte) (*Map, error) {
	fail := func(field, value string, err error) (*Map, error) {
		return nil, &Error{File: file, Field: field, Value: value, Err: err}
	}
	if len(data) > MaxSize {
		return fail("", "", fmt.Errorf("larger than the %d MiB limit", MaxSize>>20))
	}
	m := &Map{File: file}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	switch err := dec.Decode(m); {
	case errors.Is(err, io.EOF):
		return fail("", "", errors.New("empty: want nodes, labels or default"))
	case err != nil:
		return fail("", "", yamlError(err))
	}
	// A second document would be silently ignored: a map pasted twice, or
	// a chart that rendered two.
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return fail("", "", errors.New("more than one YAML document; want one map"))
	}
	if len(m.Nodes) == 0 && len(m.Labels) == 0 && m.Default == "" {
		return fail("", "", errors.New("no nodes, no labels and no default: the map serves no node"))
	}
	for _, node := range slices.Sorted(maps.Keys(m.Nodes)) {
		switch {
		case node == "":
			return fail("nodes", "", errors.New("empty node name"))
		case m.Nodes[node] == "":
			return fail("nodes."+node, "", errors.New("empty profile: want a built-in name or a profile file"))
		}
	}
	for i, r := range m.Labels {
		field := fmt.Sprintf("labels[%d]", i)
		if len(r.Match) == 0 {
			return fail(field+".match", "", errors.New("no labels to match: a rule that matches every node is default's job"))
		}
		for _, key := range slices.Sorted(maps.Keys(r.Match)) {
			// A key or value no Node can carry never matches: refused here
			// rather than silently never chosen.
			if errs := validation.IsQualifiedName(key); len(errs) > 0 {
				return fail(field+".match", key, fmt.Errorf("not a label key: %s", strings.Join(errs, "; ")))
			}
			if errs := validation.IsValidLabelValue(r.Match[key]); len(errs) > 0 {
				return fail(field+".match."+key, r.Match[key], fmt.Errorf("not a label value: %s", strings.Join(errs, "; ")))
			}
		}
		if r.Profile == "" {
			return fail(field+".profile", "", errors.New("empty profile: want a built-in name or a profile file"))
		}
	}
	return m, nil
}

// yamlError is yaml.v3's error on one line, in the map's terms rather than
// Go's: its type errors name the Go types (fleet.Map) and go one per line.
func yamlError(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return errors.New(strings.TrimPrefix(err.Error(), "yaml: "))
	}
	msgs := make([]string, len(te.Errors))
	for i, msg := range te.Errors {
		// "line 3: field profle not found in type fleet.LabelRule"
		line, rest, _ := strings.Cut(msg, ": field ")
		field, typ, unknown := strings.Cut(rest, " not found in type ")
		switch {
		case unknown && typ == "fleet.Map":
			msg = fmt.Sprintf("%s: unknown field %q (a fleet map has nodes, labels and default)", line, field)
		case unknown && typ == "fleet.LabelRule":
			msg = fmt.Sprintf("%s: unknown field %q in a label rule (a rule has match and profile)", line, field)
		}
		msgs[i] = strings.NewReplacer(
			"into fleet.Map", "into a fleet map (a mapping of nodes, labels and default)",
			"into []fleet.LabelRule", "into labels (a list of rules)",
			"into fleet.LabelRule", "into a label rule (a mapping of match and profile)",
			"into map[string]string", "into a mapping",
		).Replace(msg)
	}
	return errors.New(strings.Join(msgs, "; "))
}

// NeedsLabels says whether Resolve needs the node's labels: only a map
// with label rules reads them, so only such a map needs the API server.
func (m *Map) NeedsLabels() bool { return len(m.Labels) > 0 }

// Resolve chooses node's profile: the node's own entry, else the first
// label rule whose every label the node carries, else the default. labels
// are the node's; nil is fine for a map without label rules. A node no
// rule matches, in a map without a default, is a *NoMatchError.
func (m *Map) Resolve(node string, labels map[string]string) (Choice, error) {
	if node == "" {
		return Choice{}, &Error{File: m.File, Err: errors.New("no node name to resolve: serve must be told its node")}
	}
	if p, ok := m.Nodes[node]; ok {
		return m.choice(p, fmt.Sprintf("nodes[%s]", node))
	}
	for i, r := range m.Labels {
		if matches(r.Match, labels) {
			return m.choice(r.Profile, fmt.Sprintf("labels[%d] {%s}", i, k8slabels.Set(r.Match)))
		}
	}
	if m.Default != "" {
		return m.choice(m.Default, "default")
	}
	return Choice{}, &NoMatchError{File: m.File, Node: node}
}

func matches(want, have map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// choice resolves a profile value the way shipped.Load reads --profile
// (a built-in's name holds no '/' or '.'), except that a file is
// relative to the map's directory rather than the working directory.
func (m *Map) choice(value, rule string) (Choice, error) {
	if !strings.ContainsAny(value, "/.") && slices.Contains(shipped.Names(), value) {
		return Choice{Profile: value, Builtin: true, Rule: rule}, nil
	}
	file := value
	if !filepath.IsAbs(file) {
		dir, err := filepath.Abs(filepath.Dir(m.File))
		if err != nil {
			return Choice{}, &Error{File: m.File, Err: fmt.Errorf("the map's directory: %w", err)}
		}
		file = filepath.Join(dir, file)
	}
	return Choice{Profile: filepath.Clean(file), Rule: rule}, nil
}

// Beside is the file name of c's profile when it is a file in the map's
// own directory: the key of the ConfigMap that holds the map and its
// profiles side by side, as the chart's fleet ConfigMap does. A built-in,
// or a file elsewhere, is not beside it.
func (m *Map) Beside(c Choice) (string, bool) {
	if c.Builtin {
		return "", false
	}
	dir, err := filepath.Abs(filepath.Dir(m.File))
	if err != nil || filepath.Dir(c.Profile) != dir {
		return "", false
	}
	return filepath.Base(c.Profile), true
}
