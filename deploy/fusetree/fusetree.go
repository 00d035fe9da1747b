// Package fusetree serves an already-rendered tree (a directory on disk, the
// backing tree) through FUSE at a mount point, read-only except for a set of
// control files whose writes go to a Controller, as writes to the Linux
// kernel's sysfs attributes go to the driver behind them (driver_override,
// drivers/vfio-pci/bind, ...).
//
// The file system is go-fuse's loopback (fs.LoopbackNode), so what a reader
// sees of a file, a symlink or a directory (content, link text, entries,
// mode, size, owner, inode number) is what the backing tree holds at that
// moment; fusetree only refuses what would change the tree, routes
// control-file writes to the Controller and drops the kernel's caches for
// what the Controller changed. Where the kernel has FUSE passthrough (Linux
// 6.9 on, as root), reads of a regular file go from the kernel straight to
// the backing file, opened at open(2); each open is still a round trip to
// this server, and that is most of what a full enumeration costs.
//
// # What is refused, and with which errno
//
// Every answer is the one a sysfs directory or read-only attribute gives, so
// a tool probing the mock meets the errors it meets on a real node; where
// sysfs would allow the change (chmod, setxattr), the answer is EACCES, the
// errno of a write to a read-only attribute. The backing tree is never
// touched by any of them.
//
//	open for writing a non-control file   EACCES (kernfs_fop_open)
//	create (open O_CREAT of a new name)   EACCES (the VFS, no ->create)
//	O_TMPFILE                             EOPNOTSUPP (the VFS, no ->tmpfile)
//	mkdir, mknod, symlink, link           EPERM (the VFS/kernfs answer)
//	unlink, rmdir, rename                 EPERM (the VFS/kernfs answer)
//	truncate(2) of a non-control file     EACCES
//	chmod, chown, utimes (any file)       EACCES
//	setxattr, removexattr                 EACCES
//
// # Control files
//
// A regular file is a control file when Controller.Writable says so for its
// path; the answer is asked at open, so a control file the Controller adds
// later (a new device's driver_override) works at once. A control file opens
// for writing with O_WRONLY or O_RDWR, with or without O_TRUNC: `echo x >
// file` sends a truncating open, and the truncation is accepted and ignored,
// as sysfs ignores it. Each write(2) is one Controller.Write call (a write
// larger than the mount's max_write, 128 KiB, arrives in pieces; no
// attribute takes that much). Its errno is what write(2) returns; on success
// write(2) returns the whole length, whatever the offset, as sysfs does.
//
// Control files are opened with direct I/O and every read opens the backing
// file afresh, so a reader never gets a stale page cache or the content of
// a file the Controller has since replaced by rename.
//
// Writes are serialized here, not by the Controller: one Controller.Write
// runs at a time, in the order the writes reach fusetree (a FIFO lock), and
// the caches are dropped before the next one starts. The kernel already
// serializes writes to one file; the lock extends that to all of them, which
// is what a renderer that rewrites shared parts of the tree (a bind changes
// the driver's directory and the device's links) needs.
//
// # Caches
//
// The kernel caches directory entries (including negative ones), attributes
// and symlink text for the timeouts in Options; directory listings are not
// cached. After a Controller.Write, and
// in Invalidate, fusetree tells the kernel to drop, for each changed path,
// the entry in its parent, the path's own attributes and cached pages, and
// the parent's attributes, for every inode go-fuse knows; an inode go-fuse
// does not know has nothing cached in the kernel. A writer therefore sees
// the new tree as soon as its write(2) returns, whatever the timeouts.
//
// The timeouts only bound two things: a change the Controller or the serve
// loop did not report, and a reader whose lookup raced the re-render (its
// answer may arrive after the invalidation). See DefaultEntryTimeout.
//
// # Serving a directory over itself
//
// Backing may equal MountPoint: Mount opens the backing directory (O_PATH)
// before it mounts, and the loopback reaches it through /proc/self/fd/N.
// Following that magic link lands in the directory itself, under the FUSE
// mount, not in the mount, so the server never recurses into itself. The
// same path (BackingPath) is how a Controller, or the serve loop, writes the
// shadowed tree while it is mounted over. Mount uses it in every case, so the
// served directory is the one that existed at Mount even if its path is
// later renamed.
//
// # Mounting over a dead server
//
// A server killed without unmounting leaves its mount behind, and accesses
// to it fail with ENOTCONN (stat of its root only once the kernel's cached
// attributes expire; statfs at once). Mount detaches such a mount
// (MNT_DETACH) and mounts afresh; a FUSE mount whose server answers is
// refused, as is one whose server does not answer within five seconds.
package fusetree

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Controller answers writes to a tree's writable attributes.
type Controller interface {
	// Writable reports whether the file at rel (slash-separated, relative to
	// the tree root, e.g. "sys/bus/pci/drivers/vfio-pci/bind") takes writes.
	//
	// It is asked at every open of a regular file, from many goroutines at
	// once, so it must be cheap and safe for concurrent use. Who may write
	// is still up to the backing file's mode: the kernel checks it, as on
	// sysfs.
	Writable(rel string) bool
	// Write applies one write(2) of data to rel, synchronously. It returns the
	// errno the writer must see (0 for success) and the tree-relative paths
	// whose entries changed, appeared or vanished.
	//
	// fusetree calls Write for one write at a time (see the package
	// documentation), so Write must not write a control file through the
	// mount: that write would wait for itself. data is the Controller's to
	// keep. A changed path may be a file, a symlink or a directory;
	// reporting a directory drops everything cached below it too. When
	// Backing equals MountPoint the backing tree must be written through
	// Server.BackingPath (or a descriptor opened before Mount): the mount
	// point's path then reaches the read-only mount.
	Write(rel string, data []byte) (changed []string, errno syscall.Errno)
}

// Default cache timeouts, used for the zero values of Options.
//
// A full enumeration of the tree (about 2000 entries: every stat, readlink
// and read) resolves each path's leading components again and again. With
// zero timeouts each component of each path is a LOOKUP round trip to this
// server, and every stat a GETATTR: measured (BenchmarkWalk), such a walk
// takes six times as long as with the defaults. With timeouts longer than
// one enumeration (0.15 s on a 2-CPU VM) each name is looked up once, and a
// walk's READDIRPLUS fills the entries of a whole directory in one round
// trip, so a walk costs little more than one OPEN per file read.
//
// Longer timeouts would buy almost nothing: a walk refills the caches from
// its READDIRPLUS answers anyway, and a process that opens paths directly
// pays one LOOKUP per component per second. What the timeouts do bound is
// staleness where invalidation cannot reach: a change nobody reported, and a
// reader whose lookup was in flight during a re-render (its answer may land
// after the invalidation). One second keeps both short.
const (
	DefaultEntryTimeout    = time.Second
	DefaultAttrTimeout     = time.Second
	DefaultNegativeTimeout = time.Second
)

// Options configure Mount.
type Options struct {
	// Backing is the rendered tree on disk. It may equal MountPoint.
	Backing string
	// MountPoint is the directory to mount on.
	MountPoint string
	// Controller answers writes to control files. Nil makes every file
	// read-only.
	Controller Controller

	// EntryTimeout is how long the kernel trusts a name's lookup, AttrTimeout
	// a file's attributes, and NegativeTimeout a name's absence. Zero means
	// the Default value; a negative value turns that cache off.
	//
	// The kernel also caches a symlink's text, for as long as it keeps the
	// symlink's inode. A symlink changes only by being replaced, which makes
	// a new inode, so EntryTimeout bounds that cache too; a negative
	// EntryTimeout turns it off.
	EntryTimeout    time.Duration
	AttrTimeout     time.Duration
	NegativeTimeout time.Duration

	// Name is the file system type's suffix in /proc/self/mountinfo
	// ("fuse.<Name>"); empty means "fusetree".
	Name string
	// Debug logs every FUSE request and answer (go-fuse's debug log).
	Debug bool
}

// Server is a mounted tree.
type Server struct {
	mountPoint string
	backing    string // the magic link to the backing directory
	backingFd  int
	controller Controller
	fuse       *fuse.Server
	root       *gofs.Inode

	// writeTurn is a one-slot FIFO lock: goroutines blocked sending on a
	// channel are woken in the order they blocked, which sync.Mutex does
	// not promise.
	writeTurn chan struct{}

	unmountMu sync.Mutex
	done      chan struct{}
}

// Mount serves opts.Backing at opts.MountPoint and returns once the kernel
// has the mount. See the package documentation for what it refuses.
func Mount(opts Options) (*Server, error) {
	if opts.Backing == "" || opts.MountPoint == "" {
		return nil, errors.New("fusetree: Options need both Backing and MountPoint")
	}
	mountPoint, err := resolve(opts.MountPoint)
	if err != nil {
		return nil, fmt.Errorf("fusetree: mount point %s: %w", opts.MountPoint, err)
	}
	backingPath, err := filepath.Abs(opts.Backing)
	if err != nil {
		return nil, fmt.Errorf("fusetree: backing tree %s: %w", opts.Backing, err)
	}
	// The mount point first: if it is a dead mount over the backing tree
	// itself, only detaching it uncovers the tree to open.
	if err := PrepareMountPoint(mountPoint); err != nil {
		return nil, err
	}

	// O_PATH: the descriptor only names the directory; opening through it
	// later goes by the permissions of what is opened.
	fd, err := unix.Open(backingPath, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("fusetree: backing tree %s: %w", backingPath, err)
	}
	backing := "/proc/self/fd/" + strconv.Itoa(fd)
	var st unix.Stat_t
	if err := unix.Stat(backing, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("fusetree: backing tree %s: cannot reach it through %s (is /proc mounted?): %w", backingPath, backing, err)
	}

	s := &Server{
		mountPoint: mountPoint,
		backing:    backing,
		backingFd:  fd,
		controller: opts.Controller,
		writeTurn:  make(chan struct{}, 1),
		done:       make(chan struct{}),
	}
	lr := &gofs.LoopbackRoot{Path: backing, Dev: uint64(st.Dev)}
	root := &node{LoopbackNode: &gofs.LoopbackNode{RootData: lr}, srv: s}
	lr.RootNode = root

	name := opts.Name
	if name == "" {
		name = "fusetree"
	}
	entry := timeout(opts.EntryTimeout, DefaultEntryTimeout)
	attr := timeout(opts.AttrTimeout, DefaultAttrTimeout)
	negative := timeout(opts.NegativeTimeout, DefaultNegativeTimeout)
	fsOpts := &gofs.Options{
		// The root's own inode number, as every other node has (go-fuse
		// would report 0).
		RootStableAttr:  &gofs.StableAttr{Ino: st.Ino},
		EntryTimeout:    &entry,
		AttrTimeout:     &attr,
		NegativeTimeout: &negative,
		MountOptions: fuse.MountOptions{
			DirectMount:       true,
			DirectMountStrict: true,
			AllowOther:        true,
			// The kernel checks the backing tree's modes, as it does on
			// sysfs: without this, AllowOther would let any user write a
			// control file.
			Options: []string{"default_permissions"},
			Name:    name,
			FsName:  backingPath,
			// sysfs trees are full of links, and Invalidate drops a
			// re-pointed one's cached text (see EntryTimeout).
			EnableSymlinkCaching: entry > 0,
			Debug:                opts.Debug,
		},
	}
	// Before mounting: a write may arrive as soon as the kernel has the
	// mount, before gofs.Mount returns.
	s.root = root.EmbeddedInode()
	srv, err := gofs.Mount(mountPoint, root, fsOpts)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("fusetree: mount %s on %s: %w", backingPath, mountPoint, err)
	}
	s.fuse = srv
	go func() {
		// The descriptor must outlive every request, and Wait returns
		// only when the last one is answered, however the mount ends
		// (Unmount, or umount by someone else).
		srv.Wait()
		unix.Close(fd)
		close(s.done)
	}()
	return s, nil
}

// resolve makes dir absolute and free of symlinks, as mountinfo names
// mount points. A dead mount cannot be resolved (its stat fails), so then
// only its parent is.
func resolve(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		return r, nil
	}
	if parent, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		return filepath.Join(parent, filepath.Base(abs)), nil
	}
	return abs, nil
}

func timeout(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	}
	return d
}

// probeTimeout bounds the wait for the server of a FUSE mount found at the
// mount point to answer.
const probeTimeout = 5 * time.Second

// PrepareMountPoint detaches dead FUSE mounts at dir and refuses a live one.
//
// A mount is probed with statfs, not stat: the kernel answers stat of a
// dead mount's root from its attribute cache until that expires, but sends
// every statfs to the server, and fails it with ENOTCONN once the server is
// gone.
func PrepareMountPoint(dir string) error {
	for {
		isFUSE, err := IsFUSEMount(dir)
		if err != nil {
			return err
		}
		if !isFUSE {
			break
		}
		err = probe(dir)
		switch {
		case err == nil:
			return fmt.Errorf("fusetree: mount point %s is already served by a live FUSE server; unmount it first", dir)
		case errors.Is(err, unix.ENOTCONN) || errors.Is(err, unix.ECONNABORTED):
			// MNT_DETACH: a process may still hold something under the
			// dead mount open, which makes a plain unmount fail with
			// EBUSY. Then look again: the dead mount may have covered
			// another.
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				return fmt.Errorf("fusetree: mount point %s is a dead FUSE mount, and detaching it failed: %w", dir, err)
			}
		default:
			return fmt.Errorf("fusetree: mount point %s is a FUSE mount whose server fails statfs (%v); unmount it first", dir, err)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("fusetree: mount point %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("fusetree: mount point %s is not a directory", dir)
	}
	return nil
}

// probe asks the server of the FUSE mount at dir for statfs. A server that
// does not answer in probeTimeout is taken for live, and the goroutine
// asking stays blocked until it answers or dies.
func probe(dir string) error {
	res := make(chan error, 1)
	go func() {
		var st unix.Statfs_t
		res <- unix.Statfs(dir, &st)
	}()
	select {
	case err := <-res:
		return err
	case <-time.After(probeTimeout):
		return fmt.Errorf("no answer in %v", probeTimeout)
	}
}

// BackingPath is a path that reaches the backing tree itself while it is
// mounted, even when it is mounted over (Backing equal to MountPoint):
// /proc/self/fd/N, valid in this process until Wait returns. A Controller or
// a serve loop re-renders the tree through it.
func (s *Server) BackingPath() string { return s.backing }

// MountPoint is the absolute path the tree is mounted on.
func (s *Server) MountPoint() string { return s.mountPoint }

// Invalidate drops the kernel's caches for paths changed outside
// Controller.Write, such as a re-render by the serve loop. It returns once
// the kernel has dropped them.
func (s *Server) Invalidate(changed []string) {
	s.invalidate(changed)
}

// HeldElsewhereError is Unmount's answer when the tree is unmounted here
// but a copy of the mount lives on elsewhere (a container's bind mount of
// it, in a mount namespace of its own): the connection, and every request
// it could still carry, ends when this process closes /dev/fuse, that is
// when it exits; those mounts then fail with ENOTCONN.
type HeldElsewhereError struct{ MountPoint string }

func (e *HeldElsewhereError) Error() string {
	return fmt.Sprintf("fusetree: %s is unmounted here, but other mount namespaces still hold the view; it ends when this process exits", e.MountPoint)
}

// heldWait is how long Unmount waits for the last request once the mount
// point is unmounted: a view no one else holds ends at once.
const heldWait = 2 * time.Second

// Unmount unmounts the tree and returns once the last request is answered,
// or with a *HeldElsewhereError after heldWait. It fails, leaving the
// mount served, while a process has a file under it open or its working
// directory in it.
func (s *Server) Unmount() error {
	s.unmountMu.Lock()
	defer s.unmountMu.Unlock()
	select {
	case <-s.done:
		return nil
	default:
	}
	// go-fuse's Unmount returns only when the connection ends, which a
	// copy of the mount elsewhere postpones for as long as it lives.
	unmounted := make(chan error, 1)
	go func() { unmounted <- s.fuse.Unmount() }()
	select {
	case err := <-unmounted:
		if err != nil {
			return fmt.Errorf("fusetree: unmount %s: %w", s.mountPoint, err)
		}
		<-s.done
		return nil
	case <-time.After(heldWait):
		return &HeldElsewhereError{MountPoint: s.mountPoint}
	}
}

// Wait returns when the tree is unmounted, by Unmount or otherwise.
func (s *Server) Wait() { <-s.done }

// write runs one control-file write: the Controller, then the invalidation,
// under the write lock, so the writer's write(2) returns only after the
// kernel has dropped what the write changed.
func (s *Server) write(rel string, data []byte) syscall.Errno {
	s.writeTurn <- struct{}{}
	defer func() { <-s.writeTurn }()
	changed, errno := s.controller.Write(rel, data)
	// A failed write may still have changed something (half a bind); what
	// the Controller reports is dropped either way.
	s.invalidate(changed)
	return errno
}

// invalidate drops the kernel's entries, attributes and pages for changed
// paths. Only inodes go-fuse knows are notified: the kernel caches nothing
// under an inode it was never told of, and go-fuse forgets an inode only
// after the kernel does.
func (s *Server) invalidate(changed []string) {
	parents := map[*gofs.Inode]bool{}
	for _, rel := range changed {
		rel = strings.TrimPrefix(path.Clean("/"+rel), "/")
		if rel == "" {
			// The root has no entry; its attributes may still change.
			s.root.NotifyContent(0, 0)
			continue
		}
		dir, base := path.Split(rel)
		parent := s.known(dir)
		if parent == nil {
			continue
		}
		// The old inode first: a file rewritten in place keeps its inode,
		// and its cached size would cut reads of longer content short.
		// Offset 0, length 0: every page, and the attributes.
		if child := parent.GetChild(base); child != nil {
			child.NotifyContent(0, 0)
		}
		// Also drops a negative entry, for a name that appeared.
		parent.NotifyEntry(base)
		parents[parent] = true
	}
	// The parents' link counts and times change with their entries.
	for p := range parents {
		p.NotifyContent(0, 0)
	}
}

// known returns the inode go-fuse holds for the directory dir
// (slash-separated, relative to the root), or nil.
func (s *Server) known(dir string) *gofs.Inode {
	n := s.root
	for _, name := range strings.Split(dir, "/") {
		if name == "" {
			continue
		}
		if n = n.GetChild(name); n == nil {
			return nil
		}
	}
	return n
}

// IsFUSEMount reports whether dir is the mount point of a FUSE file system
// (type fuse, fuse.* or fuseblk) in this process's mount namespace, going by
// the topmost mount on it in /proc/self/mountinfo. It says nothing of
// whether the server is alive.
func IsFUSEMount(dir string) (bool, error) {
	abs, err := resolve(dir)
	if err != nil {
		return false, fmt.Errorf("fusetree: %s: %w", dir, err)
	}
	fstype, err := mountType(abs)
	if err != nil {
		return false, err
	}
	return fstype == "fuse" || fstype == "fuseblk" || strings.HasPrefix(fstype, "fuse."), nil
}

// mountType returns the type of the topmost mount on dir, or "" when dir
// is not a mount point.
func mountType(dir string) (string, error) {
	mounts, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return m.Mountpoint != dir, false
	})
	if err != nil {
		return "", fmt.Errorf("fusetree: mounts of this process: %w", err)
	}
	// Mounts stacked on one path each have the one below as parent; the
	// topmost is the parent of none.
	for _, m := range mounts {
		covered := false
		for _, o := range mounts {
			covered = covered || o.Parent == m.ID
		}
		if !covered {
			return m.FSType, nil
		}
	}
	return "", nil
}
