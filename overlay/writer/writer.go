// Package writer puts a plan on disk, small and careful: it is the only
// part of the renderer that touches the filesystem.
//
// A render compares every planned entry with what is there and writes only
// the differences, each through a staged name and rename(2), so a container
// reading the tree meanwhile sees each entry old or new, never torn, and
// in an order (order.go) that keeps every entry of the links directory
// resolving at every moment, also when a render is killed. The two
// mount sources, the root and its links directory, are never removed or
// recreated, because running containers hold bind mounts of them.
//
// State lives in <root>/.nvml-mock-sysfs: the manifest of what the render
// owns (only those paths are ever pruned), the staging directory, and the
// completion marker, which is removed before the first change and written
// after the last, so its presence means the tree is exactly the plan it names.
package writer

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// Paths of the writer's own state, relative to the root.
const (
	StateDir     = ".nvml-mock-sysfs"
	MarkerFile   = StateDir + "/complete"
	ManifestFile = StateDir + "/manifest"
	stagingDir   = StateDir + "/staging"
)

// Options adjust a render.
type Options struct {
	// LockTimeout bounds the wait for another render of the same root.
	LockTimeout time.Duration
	// CompareContent compares every file byte for byte even when the marker
	// says the tree already is this plan.
	CompareContent bool
	// Force lets a first render (a root without a manifest) replace files
	// and links that are already at its paths: the user's own, for all the
	// writer can tell, so by default it refuses and names them.
	Force bool
	// SkipSync leaves out the syncfs(2) that puts the tree on disk before
	// the marker vouches for it. It syncs the root's whole filesystem, which
	// under a busy build can take seconds, so tests that do not test
	// durability set it; the product never does.
	SkipSync bool
	// Holds is the plan the root holds, when the caller knows it (it
	// rendered it): if the root's completion marker vouches for that very
	// plan, an entry equal to its own is taken as unchanged without
	// reading the disk, and only the others are compared. The writable
	// mode renders after each write so, where reading every file of a
	// large tree took most of a bind's time.
	Holds *plan.Plan
}

// readerGrace is how long a settle step (order.go) waits for readers'
// walks in flight to end. A walk takes microseconds; the pause covers a
// reader the scheduler stopped midway on a busy node. A render waits it at
// most twice, and only when it changes links, which takes a new profile or
// finishing a killed render.
const readerGrace = 50 * time.Millisecond

// Stats count what a render did.
type Stats struct {
	DirsCreated    int
	FilesWritten   int
	LinksWritten   int
	BytesWritten   int64
	FilesUnchanged int
	LinksUnchanged int
	BytesUnchanged int64
	Removed        int
	// Foreign lists entries of the links directory that no render made.
	// go-nvlib aborts its scan on an unreadable one, so they are reported.
	Foreign []string
	// Kept lists stale directories left because they hold foreign files.
	Kept []string
}

// Written is the number of files and links written.
func (s Stats) Written() int { return s.FilesWritten + s.LinksWritten }

// CheckRoot refuses roots the writer must never use.
func CheckRoot(root string) error {
	if err := plan.CheckAbsolutePath(root); err != nil {
		return fmt.Errorf("root %q %w", root, err)
	}
	return nil
}

// Apply makes root hold exactly the plan. It creates root if needed.
func Apply(root string, p *plan.Plan, opts Options) (Stats, error) {
	var st Stats
	if err := CheckRoot(root); err != nil {
		return st, err
	}
	if err := checkModes(p); err != nil {
		return st, err
	}
	if err := mkdirAllRoot(root); err != nil {
		return st, err
	}
	d, err := openRoot(root)
	if err != nil {
		return st, err
	}
	defer d.close()
	if err := lock(d.rootFD, root, opts.LockTimeout); err != nil {
		return st, err
	}
	defer unix.Flock(d.rootFD, unix.LOCK_UN)
	w := &apply{d: d, plan: p, stats: &st}
	// run fills st through w.stats: call it before st is read.
	err = w.run(opts)
	return st, err
}

func mkdirAllRoot(root string) error {
	parent := path.Dir(root)
	if parent != root {
		if err := mkdirAllRoot(parent); err != nil {
			return err
		}
	}
	err := unix.Mkdir(root, 0o755)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create root %s: %w", root, err)
	}
	// 0755 whatever the umask: containers read the overlay as any user.
	if err := unix.Chmod(root, 0o755); err != nil {
		return fmt.Errorf("create root %s: %w", root, err)
	}
	return nil
}

// checkModes refuses a plan that would make anything writable by others,
// set-uid or special: files are 0644 or stricter, directories 0755, and
// only the installed binary is executable.
func checkModes(p *plan.Plan) error {
	for _, e := range p.Entries {
		if e.Kind == plan.Symlink {
			continue
		}
		if e.Mode&^fs.FileMode(0o755) != 0 || (e.Kind == plan.File && e.Mode&0o111 != 0 && e.Path != plan.BinaryFile) {
			return fmt.Errorf("plan entry %s has mode %v; refusing", e.Path, e.Mode)
		}
		if !ownablePath(e.Path) || strings.Contains(e.Path, "\n") || path.Clean(e.Path) != e.Path || path.IsAbs(e.Path) || strings.HasPrefix(e.Path, "../") || e.Path == StateDir || strings.HasPrefix(e.Path, StateDir+"/") {
			return fmt.Errorf("plan entry path %q is not a clean relative path of the overlay", e.Path)
		}
	}
	return nil
}

// lock serialises renders of one root with flock(2) on the root directory
// itself, so no lock file can be planted to redirect it.
func lock(fd int, root string, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = time.Minute
	}
	deadline := time.Now().Add(timeout)
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("lock %s: %w", root, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("another render holds the lock on %s; gave up after %s", root, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type apply struct {
	d     *dirs
	plan  *plan.Plan
	stats *Stats
	stage *stager
}

// change is one planned entry that differs from the disk.
type change struct {
	entry   plan.Entry
	replace bool // something of another kind is there and must go first
}

// diff is what a render must change: the planned entries that differ from
// the disk, and the owned entries the plan no longer has.
type diff struct {
	planned map[string]plan.EntryKind
	changes []change
	stale   []ownedEntry
}

// run is a render in its two phases: the diff reads the tree and changes
// nothing; the commit, only when there is something to change, makes the
// changes between withdrawing the marker and writing it again.
func (w *apply) run(opts Options) error {
	owned, err := w.readOwned(opts.Force)
	if err != nil {
		return err
	}
	marker := markerOf(w.plan)
	oldMarker, _ := w.d.readFile(MarkerFile, 4096)
	complete := bytes.Equal(oldMarker, marker.bytes())
	var holds map[string]*plan.Entry
	if h := opts.Holds; h != nil && !opts.CompareContent && bytes.Equal(oldMarker, markerOf(h).bytes()) {
		holds = make(map[string]*plan.Entry, len(h.Entries))
		for i := range h.Entries {
			holds[h.Entries[i].Path] = &h.Entries[i]
		}
	}
	d, err := w.diff(owned, opts.CompareContent || !complete, holds)
	if err != nil {
		return err
	}
	if len(d.changes) == 0 && len(d.stale) == 0 && complete {
		// A render killed after writing the marker leaves an empty staging
		// directory behind; the tree is complete, so only that goes.
		err = w.d.removeAll(stagingDir)
	} else {
		err = w.commit(d, owned, marker, opts.SkipSync)
	}
	if err != nil {
		return err
	}
	return w.reportForeign(d.planned, owned)
}

// readOwned reads the manifest of what earlier renders made, refusing a
// root another renderer holds and, on a first render without force, one
// that already has files where the plan writes.
func (w *apply) readOwned(force bool) (map[string]ownedEntry, error) {
	owned, err := w.readManifest()
	if err != nil {
		return nil, err
	}
	if err := w.checkNoOtherRenderer(owned); err != nil {
		return nil, err
	}
	if len(owned) == 0 && !force {
		if err := w.refuseForeignFiles(); err != nil {
			return nil, err
		}
	}
	return owned, nil
}

// diff compares the plan with the disk. Without deep, files are compared
// by size and mode only (see compare).
func (w *apply) diff(owned map[string]ownedEntry, deep bool, holds map[string]*plan.Entry) (diff, error) {
	d := diff{planned: make(map[string]plan.EntryKind, len(w.plan.Entries))}
	for _, e := range w.plan.Entries {
		d.planned[e.Path] = e.Kind
	}
	// Directories this render makes in place of something of another kind
	// (a host device's link, when a render without --host-devices merge
	// follows one with it): nothing below them is on disk yet, and looking
	// would go through what is there now.
	replaced := map[string]bool{}
	for _, e := range w.plan.Entries {
		if replaced[path.Dir(e.Path)] {
			d.changes = append(d.changes, change{entry: e})
			replaced[e.Path] = e.Kind == plan.Dir
			continue
		}
		if h, ok := holds[e.Path]; ok && h.Equal(e) {
			w.unchanged(e)
			continue
		}
		c, differs, err := w.compare(e, deep, owned)
		if err != nil {
			return d, err
		}
		replaced[e.Path] = c.replace && e.Kind == plan.Dir
		if differs {
			d.changes = append(d.changes, c)
		}
	}
	for _, o := range owned {
		if _, ok := d.planned[o.path]; !ok && !belowNonDir(o.path, d.planned) {
			d.stale = append(d.stale, o)
		}
	}
	slices.SortFunc(d.stale, func(a, b ownedEntry) int { return a.pos - b.pos })
	return d, nil
}

// commit changes the tree: it withdraws the marker, owns the union of the
// old and new entries, makes the changes in order, and then vouches for
// the result with the new marker.
func (w *apply) commit(d diff, owned map[string]ownedEntry, marker Marker, skipSync bool) error {
	if err := w.withdrawMarker(); err != nil {
		return err
	}
	var err error
	if w.stage, err = newStager(w.d, stagingDir); err != nil {
		return err
	}
	defer w.stage.close()
	// Own the union before changing anything, so that a render killed
	// halfway leaves nothing the next one would not prune.
	if err := w.writeManifest(union(owned, w.plan.Entries)); err != nil {
		return err
	}
	if err := w.applyChanges(d); err != nil {
		return err
	}
	return w.vouch(marker, skipSync)
}

// withdrawMarker removes the marker before the first change and makes a
// fresh, empty staging directory.
func (w *apply) withdrawMarker() error {
	if _, err := w.d.remove(MarkerFile, false); err != nil {
		return err
	}
	if err := w.d.mkdir(StateDir, 0o755); err != nil {
		return err
	}
	if err := w.d.removeAll(stagingDir); err != nil {
		return err
	}
	return w.d.mkdir(stagingDir, 0o700)
}

// applyChanges writes and prunes in the order that keeps the links
// directory resolving (order.go).
func (w *apply) applyChanges(d diff) error {
	current, err := w.linkTexts()
	if err != nil {
		return err
	}
	for _, s := range order(w.plan.Entries, d.changes, d.stale, current) {
		switch {
		case s.settle:
			time.Sleep(readerGrace)
		case s.change != nil:
			err = w.write(*s.change)
		default:
			err = w.prune(*s.stale)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// vouch records the finished tree: the manifest of exactly the plan, then
// the marker, and only after the tree has reached the disk.
func (w *apply) vouch(marker Marker, skipSync bool) error {
	if !skipSync {
		if err := unix.Syncfs(w.d.rootFD); err != nil {
			return fmt.Errorf("sync %s: %w", w.d.root, err)
		}
	}
	if err := w.writeManifest(manifestOf(w.plan.Entries)); err != nil {
		return err
	}
	if err := w.stage.writeFile(MarkerFile, marker.bytes(), 0o644); err != nil {
		return err
	}
	return w.d.removeAll(stagingDir)
}

// refuseForeignFiles refuses a root that no render made (it has no
// manifest) but that already holds files or links where the plan puts
// something: an effective-profile.json or bin/nvml-mock-sysfs of the
// user's own would otherwise be silently replaced. Directories are shared,
// not replaced, so they do not count.
func (w *apply) refuseForeignFiles() error {
	var found []string
	blocked := map[string]bool{} // found paths, whose children cannot be looked at
	for _, e := range w.plan.Entries {
		if underAny(e.Path, blocked) {
			continue
		}
		st, there, err := w.d.lstat(e.Path)
		if err != nil {
			return err
		}
		if there && (e.Kind != plan.Dir || st.Mode&unix.S_IFMT != unix.S_IFDIR) {
			found = append(found, e.Path)
			blocked[e.Path] = true
		}
	}
	if len(found) == 0 {
		return nil
	}
	const shown = 5
	names := strings.Join(found[:min(len(found), shown)], ", ")
	if len(found) > shown {
		names += fmt.Sprintf(" and %d more", len(found)-shown)
	}
	return fmt.Errorf("%s holds no render (no %s) but already has %s where a render writes: refusing to replace them; --force replaces them", w.d.root, ManifestFile, names)
}

// underAny reports whether p lies below one of the paths in set.
func underAny(p string, set map[string]bool) bool {
	for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
		if set[d] {
			return true
		}
	}
	return false
}

// compare decides whether an entry must be written. Without deep, a file
// whose kind, size and mode match is taken as unchanged: the marker vouched
// that the tree was this very plan.
func (w *apply) compare(e plan.Entry, deep bool, owned map[string]ownedEntry) (change, bool, error) {
	c := change{entry: e}
	st, there, err := w.d.lstat(e.Path)
	if err != nil {
		return c, false, err
	}
	if !there {
		return c, true, nil
	}
	kind, ok := kindOf(st.Mode)
	if !ok || kind != e.Kind {
		o, mine := owned[e.Path]
		if !mine || !o.has(kind) {
			return c, false, fmt.Errorf("refusing to replace %s: found a %s that no render made where the plan has a %s", path.Join(w.d.root, e.Path), describeMode(st.Mode), e.Kind)
		}
		c.replace = true
		return c, true, nil
	}
	switch e.Kind {
	case plan.Dir:
		return c, st.Mode&0o7777 != uint32(e.Mode.Perm()), nil
	case plan.Symlink:
		target, err := w.d.readlink(e.Path)
		if err != nil {
			return c, false, err
		}
		if target != e.Target {
			return c, true, nil
		}
		w.unchanged(e)
		return c, false, nil
	}
	if st.Size != e.Len() || st.Mode&0o7777 != uint32(e.Mode.Perm()) || st.Nlink != 1 {
		return c, true, nil
	}
	if deep {
		data, err := w.d.readFile(e.Path, st.Size)
		if err != nil {
			return c, false, err
		}
		want := e.Data
		if e.Source != nil {
			if want, err = os.ReadFile(e.Source.Path); err != nil {
				return c, false, fmt.Errorf("read %s to compare: %w", e.Source.Path, err)
			}
		}
		if !bytes.Equal(data, want) {
			return c, true, nil
		}
	}
	w.unchanged(e)
	return c, false, nil
}

// unchanged counts an entry left as it is.
func (w *apply) unchanged(e plan.Entry) {
	switch e.Kind {
	case plan.Symlink:
		w.stats.LinksUnchanged++
	case plan.File:
		w.stats.FilesUnchanged++
		w.stats.BytesUnchanged += e.Len()
	}
}

// prune removes a stale entry; a directory that still holds foreign files
// is kept and reported.
func (w *apply) prune(o ownedEntry) error {
	removed, err := w.d.remove(o.path, o.kind == plan.Dir)
	if err != nil {
		return err
	}
	if removed {
		w.stats.Removed++
	} else if o.kind == plan.Dir {
		if _, there, _ := w.d.lstat(o.path); there {
			w.stats.Kept = append(w.stats.Kept, o.path)
		}
	}
	return nil
}

// linkTexts reads the text of every symlink in the links directory, which
// order needs to know which old entries are endpoints and which bridges.
func (w *apply) linkTexts() (map[string]string, error) {
	names, err := w.d.list(plan.LinksDir)
	if err != nil {
		return nil, err
	}
	texts := make(map[string]string, len(names))
	for _, n := range names {
		p := plan.LinksDir + "/" + n
		st, there, err := w.d.lstat(p)
		if err != nil {
			return nil, err
		}
		if !there || st.Mode&unix.S_IFMT != unix.S_IFLNK {
			continue
		}
		if texts[p], err = w.d.readlink(p); err != nil {
			return nil, err
		}
	}
	return texts, nil
}

func (w *apply) write(c change) error {
	e := c.entry
	if c.replace {
		if err := w.d.removeAll(e.Path); err != nil {
			return err
		}
	}
	switch e.Kind {
	case plan.Dir:
		w.stats.DirsCreated++
		return w.d.mkdir(e.Path, uint32(e.Mode.Perm()))
	case plan.Symlink:
		w.stats.LinksWritten++
		return w.stage.symlink(e.Path, e.Target)
	}
	w.stats.FilesWritten++
	w.stats.BytesWritten += e.Len()
	if e.Source != nil {
		return w.stage.copyFile(e.Path, e.Source.Path, uint32(e.Mode.Perm()))
	}
	return w.stage.writeFile(e.Path, e.Data, uint32(e.Mode.Perm()))
}

// reportForeign lists links-directory entries that no render made.
func (w *apply) reportForeign(planned map[string]plan.EntryKind, owned map[string]ownedEntry) error {
	names, err := w.d.list(plan.LinksDir)
	if err != nil {
		return err
	}
	for _, n := range names {
		p := plan.LinksDir + "/" + n
		if _, ok := planned[p]; ok {
			continue
		}
		if _, ok := owned[p]; ok {
			continue
		}
		w.stats.Foreign = append(w.stats.Foreign, n)
	}
	slices.Sort(w.stats.Foreign)
	return nil
}

// belowNonDir reports whether a path lies below one the plan makes a file
// or a link (a mock directory that --host-devices merge turns into a host
// device's link): replacing that removes the path with it, and pruning it
// afterwards would have to go through the new link.
func belowNonDir(p string, planned map[string]plan.EntryKind) bool {
	for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
		if k, ok := planned[d]; ok && k != plan.Dir {
			return true
		}
	}
	return false
}

func kindOf(mode uint32) (plan.EntryKind, bool) {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return plan.Dir, true
	case unix.S_IFREG:
		return plan.File, true
	case unix.S_IFLNK:
		return plan.Symlink, true
	}
	return 0, false
}

func describeMode(mode uint32) string {
	if k, ok := kindOf(mode); ok {
		return k.String()
	}
	return fmt.Sprintf("special file (mode %#o)", mode&unix.S_IFMT)
}

// markerOf is the completion marker that vouches for p.
func markerOf(p *plan.Plan) Marker {
	return Marker{Digest: p.Digest(), Entries: len(p.Entries), GPUs: len(p.Machine.GPUs()), ContainerRoot: p.ContainerRoot}
}

// Marker is the completion marker's content.
type Marker struct {
	Digest  string
	Entries int
	GPUs    int
	// ContainerRoot is where the tree's links expect the overlay to be
	// mounted; cdi and mounts take it from here. Empty in a marker written
	// before it was recorded.
	ContainerRoot string
}

func (m Marker) bytes() []byte {
	return fmt.Appendf(nil, "digest %s\nentries %d\ngpus %d\ncontainer-root %s\n", m.Digest, m.Entries, m.GPUs, m.ContainerRoot)
}

// ReadMarker reads a root's completion marker. An error means the tree is
// not known to be complete: never rendered, or a render is under way or
// was interrupted.
func ReadMarker(fsys fs.FS) (Marker, error) {
	b, err := fs.ReadFile(fsys, MarkerFile)
	if err != nil {
		return Marker{}, fmt.Errorf("no completion marker: %w", err)
	}
	var m Marker
	if _, err := fmt.Sscanf(string(b), "digest %s\nentries %d\ngpus %d\n", &m.Digest, &m.Entries, &m.GPUs); err != nil {
		return Marker{}, fmt.Errorf("completion marker %s: %w", MarkerFile, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "container-root "); ok {
			m.ContainerRoot = v
		}
	}
	return m, nil
}
