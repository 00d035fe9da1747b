package fusetree

import (
	"bytes"
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is go-fuse's loopback node with every change refused but writes to
// control files. It wraps the loopback's children through NodeWrapChilder,
// go-fuse's replacement for the deprecated LoopbackRoot.NewNode hook, so
// every node of the tree is one.
type node struct {
	*gofs.LoopbackNode
	srv *Server
}

var (
	_ gofs.NodeWrapChilder    = (*node)(nil)
	_ gofs.NodeOpener         = (*node)(nil)
	_ gofs.NodeCreater        = (*node)(nil)
	_ gofs.NodeTmpfiler       = (*node)(nil)
	_ gofs.NodeMkdirer        = (*node)(nil)
	_ gofs.NodeMknoder        = (*node)(nil)
	_ gofs.NodeSymlinker      = (*node)(nil)
	_ gofs.NodeLinker         = (*node)(nil)
	_ gofs.NodeUnlinker       = (*node)(nil)
	_ gofs.NodeRmdirer        = (*node)(nil)
	_ gofs.NodeRenamer        = (*node)(nil)
	_ gofs.NodeSetattrer      = (*node)(nil)
	_ gofs.NodeSetxattrer     = (*node)(nil)
	_ gofs.NodeRemovexattrer  = (*node)(nil)
	_ gofs.NodeCopyFileRanger = (*node)(nil)
)

func (n *node) WrapChild(ctx context.Context, ops gofs.InodeEmbedder) gofs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*gofs.LoopbackNode), srv: n.srv}
}

// control returns the node's tree-relative path and whether it is a control
// file. It asks the Controller every time rather than once at lookup, so a
// control file keeps up with a Controller that changes its mind.
func (n *node) control() (string, bool) {
	if n.srv.controller == nil || n.StableAttr().Mode&syscall.S_IFMT != syscall.S_IFREG {
		return "", false
	}
	rel := n.Path(nil)
	return rel, n.srv.controller.Writable(rel)
}

func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if rel, ok := n.control(); ok {
		// Direct I/O: no page cache to go stale between a write and a
		// read, and each read goes to the file the backing tree holds now.
		// Writes are done by the time write(2) returns: nothing to flush.
		return &controlFile{srv: n.srv, rel: rel}, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH, 0
	}
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.EACCES
	}
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	// No FLUSH at close: a read-only file has nothing to flush, and
	// without FUSE locks the kernel keeps POSIX locks itself. One round
	// trip fewer per file, a quarter of a full enumeration's time.
	return fh, fuseFlags | fuse.FOPEN_NOFLUSH, errno
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EACCES
}

func (n *node) Tmpfile(ctx context.Context, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EOPNOTSUPP
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (n *node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno { return syscall.EPERM }

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno { return syscall.EPERM }

func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	return syscall.EPERM
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return syscall.EACCES
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno { return syscall.EACCES }

// CopyFileRange refuses so the kernel falls back to reads and writes: a
// copy into a control file is then Controller.Write calls like any other.
func (n *node) CopyFileRange(ctx context.Context, fhIn gofs.FileHandle, offIn uint64, out *gofs.Inode, fhOut gofs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	return 0, syscall.EOPNOTSUPP
}

// truncateBits are the attributes the kernel sets for the truncation of a
// truncating open (O_TRUNC: size, and the times it implies).
const truncateBits = fuse.FATTR_SIZE | fuse.FATTR_FH | fuse.FATTR_LOCKOWNER |
	fuse.FATTR_MTIME | fuse.FATTR_MTIME_NOW | fuse.FATTR_CTIME | fuse.FATTR_KILL_SUIDGID

// Setattr accepts, and ignores, the truncation of a control file, which is
// how `echo x > file` opens it; every other change of attributes is
// refused.
func (n *node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if in.Valid&fuse.FATTR_SIZE != 0 && in.Valid&^truncateBits == 0 {
		if _, ok := n.control(); ok {
			return n.LoopbackNode.Getattr(ctx, nil, out)
		}
	}
	return syscall.EACCES
}

// controlFile is an open control file. It holds no descriptor: a read
// opens the backing file afresh, since the Controller replaces files by
// rename and a descriptor would keep the old one.
type controlFile struct {
	srv *Server
	rel string
}

var (
	_ gofs.FileReader   = (*controlFile)(nil)
	_ gofs.FileWriter   = (*controlFile)(nil)
	_ gofs.FileFlusher  = (*controlFile)(nil)
	_ gofs.FileFsyncer  = (*controlFile)(nil)
	_ gofs.FileReleaser = (*controlFile)(nil)
)

func (f *controlFile) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	fd, err := openBeneath(f.srv.backingFd, f.rel)
	if err != nil {
		return nil, gofs.ToErrno(err)
	}
	defer unix.Close(fd)
	n, err := unix.Pread(fd, dest, off)
	if err != nil {
		return nil, gofs.ToErrno(err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

// Write hands the write to the Controller; see Server.write.
func (f *controlFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	// go-fuse reuses data's buffer once Write returns; the Controller may
	// keep what it is given.
	if errno := f.srv.write(f.rel, bytes.Clone(data)); errno != 0 {
		return 0, errno
	}
	return uint32(len(data)), 0
}

func (f *controlFile) Flush(ctx context.Context) syscall.Errno { return 0 }

func (f *controlFile) Fsync(ctx context.Context, flags uint32) syscall.Errno { return 0 }

func (f *controlFile) Release(ctx context.Context) syscall.Errno { return 0 }

// openBeneath opens rel for reading inside the directory dirfd, following no
// symlink, as the loopback opens files.
func openBeneath(dirfd int, rel string) (int, error) {
	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH,
	}
	fd, err := unix.Openat2(dirfd, rel, &how)
	if err == unix.ENOSYS {
		// Before Linux 5.6; the last component is still not followed.
		fd, err = unix.Openat(dirfd, rel, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	}
	return fd, err
}
