package sysfs

import "strings"

// MaxFollows is the kernel's limit on symlinks followed in one lookup;
// past it the lookup fails with ELOOP.
const MaxFollows = 40

// Walk is what remains of a path being resolved physically, as the
// kernel's lookup walks it: element by element, with each symlink's text
// spliced in where the link is met, so that ".." after a link climbs from
// the link's target. plancheck.Tree.Resolve (the test checker) walks an overlay held in memory with it,
// and compat's served-links check a mount namespace on disk; each decides
// what an element is and where ".." leads.
type Walk struct {
	todo    []string
	follows int
}

// NewWalk starts a walk of p.
func NewWalk(p string) *Walk { return &Walk{todo: strings.Split(p, "/")} }

// Next returns the next element, passing over empty ones and ".", and
// false at the end of the path.
func (w *Walk) Next() (string, bool) {
	for len(w.todo) > 0 {
		c := w.todo[0]
		w.todo = w.todo[1:]
		if c != "" && c != "." {
			return c, true
		}
	}
	return "", false
}

// Follow splices a symlink's text before what remains. Past MaxFollows
// links it splices nothing and returns false, as the kernel gives up.
func (w *Walk) Follow(target string) bool {
	if w.follows++; w.follows > MaxFollows {
		return false
	}
	w.todo = append(strings.Split(target, "/"), w.todo...)
	return true
}

// Rest is what remains to walk, as elements, empty ones and "." included.
func (w *Walk) Rest() []string { return w.todo }
