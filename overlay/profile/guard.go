package profile

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// maxExpandedNodes bounds the nodes a document may have once its aliases
// are expanded. A document without aliases has fewer nodes than bytes, so
// only an alias bomb ("billion laughs") reaches it, wherever it hides.
const maxExpandedNodes = MaxSize

// checkAliases refuses a document whose aliases expand past
// maxExpandedNodes. yaml.v3 guards only the parts it decodes, and only by a
// ratio; this names the field and stays linear in the file through
// memoising each anchor's size.
func checkAliases(source string, top *yaml.Node) error {
	sizes := map[*yaml.Node]int{}
	var walk func(n *yaml.Node, at string) (int, error)
	walk = func(n *yaml.Node, at string) (int, error) {
		if n.Kind == yaml.AliasNode {
			size, err := expandedSize(n.Alias, sizes)
			if err == nil && size > maxExpandedNodes {
				err = fmt.Errorf("the alias expands to more than %d YAML nodes: an alias bomb, refused", maxExpandedNodes)
			}
			if err != nil {
				return 0, &Error{Source: source, Field: at, Value: "*" + n.Value, Err: err}
			}
			return size, nil
		}
		total := 1
		for i, c := range n.Content {
			p := at
			switch n.Kind {
			case yaml.MappingNode:
				if i%2 == 0 {
					p = join(at, c.Value) // a key: blame the key's own path
				} else {
					p = join(at, n.Content[i-1].Value)
				}
			case yaml.SequenceNode:
				p = fmt.Sprintf("%s[%d]", at, i)
			}
			size, err := walk(c, p)
			if err != nil {
				return 0, err
			}
			total += size
			if total > maxExpandedNodes {
				value := ""
				if n.Anchor != "" {
					value = "&" + n.Anchor
				}
				return 0, &Error{Source: source, Field: at, Value: value, Err: fmt.Errorf("more than %d YAML nodes once aliases are expanded: an alias bomb, refused", maxExpandedNodes)}
			}
		}
		return total, nil
	}
	_, err := walk(top, "")
	return err
}

// expandedSize counts the nodes of n with its aliases expanded, capped just
// above the limit. An alias inside its own anchor counts as unbounded.
func expandedSize(n *yaml.Node, sizes map[*yaml.Node]int) (int, error) {
	if n == nil {
		return 1, nil
	}
	if s, ok := sizes[n]; ok {
		if s < 0 {
			return 0, fmt.Errorf("the alias refers to its own anchor, so it never ends")
		}
		return s, nil
	}
	sizes[n] = -1 // in progress
	total := 1
	if n.Kind == yaml.AliasNode {
		s, err := expandedSize(n.Alias, sizes)
		if err != nil {
			return 0, err
		}
		total = s
	}
	for _, c := range n.Content {
		s, err := expandedSize(c, sizes)
		if err != nil {
			return 0, err
		}
		total = min(total+s, maxExpandedNodes+1)
	}
	sizes[n] = total
	return total, nil
}

func join(at, key string) string {
	if at == "" {
		return key
	}
	return at + "." + key
}

func fieldByTag(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == key {
			return f, true
		}
		// An inline struct's keys are its parent's, as yaml.v3 reads them:
		// system.driver_version is NVMLSystem's, inline in SystemConfig.
		if name == "" && opts == "inline" && f.Type.Kind() == reflect.Struct {
			if in, ok := fieldByTag(f.Type, key); ok {
				in.Index = append(slices.Clone(f.Index), in.Index...)
				return in, true
			}
		}
	}
	return reflect.StructField{}, false
}
