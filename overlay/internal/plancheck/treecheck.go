// Package plancheck is the one checker of plan invariants: CheckTree for a
// planned PCI tree, CheckPlan for a whole plan (its tree, entries, links
// and config space, CheckConfig), CheckMachine for what render would
// plan. The planner's tests and fuzzers all check through it, so an
// invariant is written once.
//
// It resolves paths in an overlay held in memory the way the kernel
// resolves them on disk: physically, following every symlink where
// it is met, so that ".." after a link climbs from the link's target. The
// overlay root plays "/", which the loop link <root>/opt/nvml-mock -> ..
// makes exact: a container sees the overlay at /opt/nvml-mock and its links
// directory at /sys/bus/pci/devices, and both resolve the same texts.
//
// Tests use it to check a plan's links before anything touches disk, and to
// replay a render step by step.
package plancheck

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// Tree is an overlay by path, relative to its root.
type Tree map[string]plan.Entry

// FromEntries builds a tree from plan entries.
func FromEntries(entries []plan.Entry) Tree {
	t := make(Tree, len(entries))
	for _, e := range entries {
		t[e.Path] = e
	}
	return t
}

// EscapeError says that a walk left the overlay: through an absolute link,
// or by climbing above the root.
type EscapeError struct {
	Link   string // the symlink whose text escaped, or "" for the walk's own path
	Target string
}

func (e *EscapeError) Error() string {
	if e.Link == "" {
		return "the path climbs out of the overlay"
	}
	return fmt.Sprintf("link %s -> %s leads out of the overlay", e.Link, e.Target)
}

// Resolve walks p from the root and returns the path of what it reaches,
// with every symlink followed. It fails when an element is missing (a
// dangling link), when a file is used as a directory, on a loop, and with
// an *EscapeError when the walk leaves the overlay.
func (t Tree) Resolve(p string) (string, error) {
	cur := "" // the root
	w := sysfs.NewWalk(p)
	link := ""
	for c, more := w.Next(); more; c, more = w.Next() {
		if c == ".." {
			if cur == "" {
				return "", &EscapeError{Link: link, Target: t[link].Target}
			}
			cur, _ = splitLast(cur)
			continue
		}
		next := c
		if cur != "" {
			next = cur + "/" + c
		}
		e, found := t[next]
		if !found {
			return "", fmt.Errorf("resolve %s: %s: %w", p, next, fs.ErrNotExist)
		}
		switch e.Kind {
		case plan.Symlink:
			if !w.Follow(e.Target) {
				return "", fmt.Errorf("resolve %s: more than %d links", p, sysfs.MaxFollows)
			}
			if path.IsAbs(e.Target) || e.Target == "" {
				return "", &EscapeError{Link: next, Target: e.Target}
			}
			link = next
		case plan.File:
			if len(w.Rest()) > 0 {
				return "", fmt.Errorf("resolve %s: %s is a file, not a directory", p, next)
			}
			cur = next
		default:
			cur = next
		}
	}
	return cur, nil
}

// splitLast splits "a/b/c" into "a/b" and "c", and "a" into "" and "a".
func splitLast(p string) (string, string) {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return "", p
	}
	return p[:i], p[i+1:]
}

// IsEscape reports whether err is an *EscapeError.
func IsEscape(err error) bool {
	var e *EscapeError
	return errors.As(err, &e)
}

// CheckLinksDir checks every entry of the links directory: a lower-case BDF
// name whose text resolves to a device directory of the same name holding a
// vendor file. It returns one message per bad entry.
func (t Tree) CheckLinksDir() []string {
	var bad []string
	for p := range t {
		if path.Dir(p) != plan.LinksDir {
			continue
		}
		if msg := t.CheckEntry(p); msg != "" {
			bad = append(bad, msg)
		}
	}
	return bad
}

// CheckEntry checks one entry of the links directory as CheckLinksDir does;
// it returns "" for a good one.
func (t Tree) CheckEntry(p string) string {
	e, ok := t[p]
	if !ok {
		return fmt.Sprintf("%s: missing", p)
	}
	name := path.Base(p)
	if !lowerBDF(name) {
		return fmt.Sprintf("%s: the name is not a lower-case BDF", p)
	}
	if e.Kind != plan.Symlink {
		return fmt.Sprintf("%s is a %s, not a symlink", p, e.Kind)
	}
	return t.CheckText(p, e.Target)
}

// CheckText checks that text, read from the links-directory entry p now
// or earlier, resolves in t to p's own device directory, with a vendor
// file: what a reader whose walk read p's text before a change and follows
// it after must find.
func (t Tree) CheckText(p, text string) string {
	// Not path.Join: it would clean "anchor/.." away lexically.
	dir, err := t.Resolve(path.Dir(p) + "/" + text)
	if err != nil {
		return fmt.Sprintf("%s -> %s: %v", p, text, err)
	}
	if path.Base(dir) != path.Base(p) {
		return fmt.Sprintf("%s -> %s resolves to %s, another device", p, text, dir)
	}
	if f, ok := t[dir+"/vendor"]; !ok || f.Kind != plan.File {
		return fmt.Sprintf("%s -> %s resolves to %s, which has no vendor file", p, text, dir)
	}
	return ""
}

// lowerBDF reports whether name is a BDF as the kernel spells it; libpci
// and ghw give up on any other name in the links directory.
func lowerBDF(name string) bool { return pciaddr.IsBDF(name) }
