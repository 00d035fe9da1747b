package writer

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// The manifest lists, in plan order, every path a render owns, one
// "<kind> <path>" line each. Pruning touches nothing else.

type ownedEntry struct {
	kind plan.EntryKind // the kind of its first line, which prune removes
	// kinds holds a bit for every kind the manifest lists for the path: a
	// render killed while a path changed kind owns both.
	kinds uint8
	path  string
	pos   int // the position of its first line among distinct paths
}

func (o ownedEntry) has(k plan.EntryKind) bool { return o.kinds&(1<<k) != 0 }

const maxManifest = 64 << 20

func (w *apply) readManifest() (map[string]ownedEntry, error) {
	st, there, err := w.d.lstat(ManifestFile)
	if err != nil || !there {
		return map[string]ownedEntry{}, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > maxManifest {
		return nil, fmt.Errorf("manifest %s/%s is not a regular file of sane size", w.d.root, ManifestFile)
	}
	data, err := w.d.readFile(ManifestFile, st.Size)
	if err != nil {
		return nil, err
	}
	owned, err := parseManifest(data)
	if err != nil {
		return nil, fmt.Errorf("manifest %s/%s: %w", w.d.root, ManifestFile, err)
	}
	return owned, nil
}

// parseManifest reads "<kind> <path>" lines. A path listed twice keeps its
// first position and gains the second kind.
func parseManifest(data []byte) (map[string]ownedEntry, error) {
	owned := map[string]ownedEntry{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		k, p, ok := strings.Cut(sc.Text(), " ")
		kind, known := map[string]plan.EntryKind{"d": plan.Dir, "f": plan.File, "l": plan.Symlink}[k]
		if !ok || !known || !ownablePath(p) {
			return nil, fmt.Errorf("bad line %q", sc.Text())
		}
		o, seen := owned[p]
		if !seen {
			o = ownedEntry{kind: kind, path: p, pos: len(owned)}
		}
		o.kinds |= 1 << kind
		owned[p] = o
	}
	return owned, sc.Err()
}

// ownablePath refuses manifest paths that could reach outside the tree.
func ownablePath(p string) bool {
	if p == "" || strings.HasPrefix(p, "/") || p == StateDir || strings.HasPrefix(p, StateDir+"/") {
		return false
	}
	for _, part := range strings.Split(p, "/") {
		if part == "" || part == "." || part == ".." {
			return false
		}
	}
	return true
}

func kindLetter(k plan.EntryKind) string { return [...]string{"d", "f", "l"}[k] }

func manifestOf(entries []plan.Entry) []byte {
	var b bytes.Buffer
	for _, e := range entries {
		b.WriteString(kindLetter(e.Kind))
		b.WriteByte(' ')
		b.WriteString(e.Path)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// union lists the old entries first, in their order and with all their
// kinds, then the new ones, and a new kind of an old path.
func union(old map[string]ownedEntry, entries []plan.Entry) []byte {
	ordered := make([]ownedEntry, len(old))
	for _, o := range old {
		ordered[o.pos] = o
	}
	var b bytes.Buffer
	for _, o := range ordered {
		fmt.Fprintf(&b, "%s %s\n", kindLetter(o.kind), o.path)
		for k := plan.Dir; k <= plan.Symlink; k++ {
			if k != o.kind && o.has(k) {
				fmt.Fprintf(&b, "%s %s\n", kindLetter(k), o.path)
			}
		}
	}
	for _, e := range entries {
		if o, ok := old[e.Path]; !ok || !o.has(e.Kind) {
			fmt.Fprintf(&b, "%s %s\n", kindLetter(e.Kind), e.Path)
		}
	}
	return b.Bytes()
}

func (w *apply) writeManifest(data []byte) error {
	if err := w.stage.writeFile(ManifestFile, data, 0o644); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	return nil
}
