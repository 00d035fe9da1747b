package writer

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// dirs opens directories beneath the root without following any symlink:
// openat2 with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, or where the kernel lacks
// openat2, a walk of O_NOFOLLOW opens. Every write below is then a
// single-name *at call on such a descriptor, so a symlink planted inside the
// root can neither redirect a write nor lead it outside.
type dirs struct {
	root    string // for messages
	rootFD  int
	noOpen2 bool
	open    []openDir // a few recently used directories, newest last
}

type openDir struct {
	path string
	fd   int
}

const dirCacheSize = 16

func openRoot(root string) (*dirs, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open root %s: %w", root, err)
	}
	return &dirs{root: root, rootFD: fd}, nil
}

func (d *dirs) close() {
	for _, o := range d.open {
		unix.Close(o.fd)
	}
	d.open = nil
	unix.Close(d.rootFD)
}

// fd returns a descriptor for a directory relative to the root ("" is the root).
func (d *dirs) fd(dir string) (int, error) {
	if dir == "" || dir == "." {
		return d.rootFD, nil
	}
	for i := len(d.open) - 1; i >= 0; i-- {
		if d.open[i].path == dir {
			return d.open[i].fd, nil
		}
	}
	fd, err := d.openBeneath(dir)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
			return -1, fmt.Errorf("refusing to write through %s: a path element is a symlink or not a directory (%w)", path.Join(d.root, dir), err)
		}
		return -1, fmt.Errorf("open %s: %w", path.Join(d.root, dir), err)
	}
	if len(d.open) == dirCacheSize {
		unix.Close(d.open[0].fd)
		d.open = d.open[1:]
	}
	d.open = append(d.open, openDir{path: dir, fd: fd})
	return fd, nil
}

func (d *dirs) openBeneath(dir string) (int, error) {
	const flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW
	if !d.noOpen2 {
		fd, err := unix.Openat2(d.rootFD, dir, &unix.OpenHow{
			Flags:   flags,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if !errors.Is(err, unix.ENOSYS) {
			return fd, err
		}
		d.noOpen2 = true
	}
	// No openat2: walk the path one O_NOFOLLOW open at a time.
	cur := d.rootFD
	for _, name := range strings.Split(dir, "/") {
		if name == "" || name == "." || name == ".." {
			if cur != d.rootFD {
				unix.Close(cur)
			}
			return -1, fmt.Errorf("bad path element %q: %w", name, unix.EXDEV)
		}
		next, err := unix.Openat(cur, name, flags, 0)
		if cur != d.rootFD {
			unix.Close(cur)
		}
		if err != nil {
			return -1, err
		}
		cur = next
	}
	return cur, nil
}

// forget drops cached descriptors of a removed directory and its children.
func (d *dirs) forget(dir string) {
	kept := d.open[:0]
	for _, o := range d.open {
		if o.path == dir || strings.HasPrefix(o.path, dir+"/") {
			unix.Close(o.fd)
			continue
		}
		kept = append(kept, o)
	}
	d.open = kept
}

func split(p string) (string, string) {
	dir, name := path.Split(p)
	return strings.TrimSuffix(dir, "/"), name
}

// lstat stats a path without following a final symlink. ok is false when
// nothing is there.
func (d *dirs) lstat(p string) (unix.Stat_t, bool, error) {
	var st unix.Stat_t
	dir, name := split(p)
	fd, err := d.fd(dir)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return st, false, nil
		}
		return st, false, err
	}
	err = unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("stat %s: %w", path.Join(d.root, p), err)
	}
	return st, true, nil
}

// isFile reports whether p is a regular file.
func (d *dirs) isFile(p string) bool {
	st, there, err := d.lstat(p)
	return err == nil && there && st.Mode&unix.S_IFMT == unix.S_IFREG
}

// readFile reads a regular file, refusing to follow a symlink. O_NONBLOCK
// keeps a FIFO planted in the root from blocking the render (with its lock
// held) forever; fstat then refuses anything but a regular file.
func (d *dirs) readFile(p string, size int64) ([]byte, error) {
	dir, name := split(p)
	dfd, err := d.fd(dir)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path.Join(d.root, p), err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("read %s: %w", path.Join(d.root, p), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("read %s: found a %s, not a regular file", path.Join(d.root, p), describeMode(st.Mode))
	}
	buf := make([]byte, size+1)
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path.Join(d.root, p), err)
		}
		if m == 0 {
			break
		}
		n += m
	}
	return buf[:n], nil
}

func (d *dirs) readlink(p string) (string, error) {
	dir, name := split(p)
	fd, err := d.fd(dir)
	if err != nil {
		return "", err
	}
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(fd, name, buf)
	if err != nil {
		return "", fmt.Errorf("readlink %s: %w", path.Join(d.root, p), err)
	}
	return string(buf[:n]), nil
}

// mkdir creates a directory with exactly mode, whatever the umask.
func (d *dirs) mkdir(p string, mode uint32) error {
	dir, name := split(p)
	dfd, err := d.fd(dir)
	if err != nil {
		return err
	}
	if err := unix.Mkdirat(dfd, name, mode); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("mkdir %s: %w", path.Join(d.root, p), err)
	}
	return d.chmodDir(p, mode)
}

func (d *dirs) chmodDir(p string, mode uint32) error {
	dir, name := split(p)
	dfd, err := d.fd(dir)
	if err != nil {
		return err
	}
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path.Join(d.root, p), err)
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("chmod %s: %w", path.Join(d.root, p), err)
	}
	return nil
}

// stager writes new files and links under fresh names in a staging
// directory of the same filesystem, then renames them into place: readers
// see the old entry or the new one, never a partial one, and no temporary
// name ever appears in a directory that consumers list.
type stager struct {
	d  *dirs
	fd int // the staging directory, held open apart from the cache
	n  int
}

func newStager(d *dirs, dir string) (*stager, error) {
	fd, err := d.openBeneath(dir)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path.Join(d.root, dir), err)
	}
	return &stager{d: d, fd: fd}, nil
}

func (s *stager) close() { unix.Close(s.fd) }

func (s *stager) next() (int, string, error) {
	s.n++
	return s.fd, "e" + strconv.Itoa(s.n), nil
}

func (s *stager) writeFile(p string, data []byte, mode uint32) error {
	return s.stageFile(p, mode, func(fd int) error { return writeAll(fd, data) })
}

// copyFile stages a copy of a host file: the installed binary, streamed
// rather than held in memory.
func (s *stager) copyFile(p, source string, mode uint32) error {
	src, err := os.Open(source)
	if err != nil {
		return fmt.Errorf("stage %s: %w", p, err)
	}
	defer src.Close()
	return s.stageFile(p, mode, func(fd int) error {
		_, err := io.Copy(fdWriter(fd), src)
		return err
	})
}

// fdWriter writes to a descriptor the stager owns and closes.
type fdWriter int

func (w fdWriter) Write(b []byte) (int, error) {
	if err := writeAll(int(w), b); err != nil {
		return 0, err
	}
	return len(b), nil
}

// stageFile creates a new file in the staging directory, fills it, sets its
// mode whatever the umask, and renames it over p.
func (s *stager) stageFile(p string, mode uint32, fill func(fd int) error) error {
	sfd, tmp, err := s.next()
	if err != nil {
		return err
	}
	fd, err := unix.Openat(sfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return fmt.Errorf("stage %s: %w", p, err)
	}
	werr := fill(fd)
	if werr == nil {
		werr = unix.Fchmod(fd, mode)
	}
	if cerr := unix.Close(fd); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("stage %s: %w", p, werr)
	}
	return s.place(sfd, tmp, p)
}

func writeAll(fd int, data []byte) error {
	for len(data) > 0 {
		n, err := unix.Write(fd, data)
		if err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

func (s *stager) symlink(p, target string) error {
	sfd, tmp, err := s.next()
	if err != nil {
		return err
	}
	if err := unix.Symlinkat(target, sfd, tmp); err != nil {
		return fmt.Errorf("stage link %s: %w", p, err)
	}
	return s.place(sfd, tmp, p)
}

// place renames a staged entry over p. rename(2) replaces p itself, even
// when p is a symlink, so nothing is followed.
func (s *stager) place(sfd int, tmp, p string) error {
	dir, name := split(p)
	dfd, err := s.d.fd(dir)
	if err != nil {
		return err
	}
	if err := unix.Renameat(sfd, tmp, dfd, name); err != nil {
		return fmt.Errorf("rename into %s: %w", path.Join(s.d.root, p), err)
	}
	return nil
}

// remove unlinks a file, link or empty directory. A directory that still
// holds something the render does not own is left alone.
func (d *dirs) remove(p string, isDir bool) (bool, error) {
	dir, name := split(p)
	fd, err := d.fd(dir)
	if err != nil {
		// Under a missing directory, or one a render replaced by a regular
		// file, nothing is left to remove; a symlink is still refused.
		if errors.Is(err, unix.ENOENT) || (errors.Is(err, unix.ENOTDIR) && d.isFile(dir)) {
			return false, nil
		}
		return false, err
	}
	flags := 0
	if isDir {
		flags = unix.AT_REMOVEDIR
		d.forget(p)
	}
	err = unix.Unlinkat(fd, name, flags)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case isDir && (errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST)):
		return false, nil
	case errors.Is(err, unix.EISDIR), errors.Is(err, unix.ENOTDIR):
		// The kind changed since the manifest; remove it as what it is.
		return d.remove(p, !isDir)
	}
	return false, fmt.Errorf("remove %s: %w", path.Join(d.root, p), err)
}

// removeAll removes a directory tree below the root without following links.
func (d *dirs) removeAll(p string) error {
	st, ok, err := d.lstat(p)
	if err != nil || !ok {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		fd, err := d.fd(p)
		if err != nil {
			return err
		}
		names, err := readNames(fd)
		if err != nil {
			return fmt.Errorf("list %s: %w", path.Join(d.root, p), err)
		}
		for _, n := range names {
			if err := d.removeAll(p + "/" + n); err != nil {
				return err
			}
		}
	}
	_, err = d.remove(p, st.Mode&unix.S_IFMT == unix.S_IFDIR)
	return err
}

// readNames lists a directory by descriptor, from its start.
func readNames(fd int) ([]string, error) {
	if _, err := unix.Seek(fd, 0, 0); err != nil {
		return nil, err
	}
	var names []string
	buf := make([]byte, 8192)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// list names a directory's entries; a missing directory has none.
func (d *dirs) list(dir string) ([]string, error) {
	fd, err := d.fd(dir)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return readNames(fd)
}
