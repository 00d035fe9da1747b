package serve

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"

	"golang.org/x/sys/unix"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/fusetree"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writable"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// DefaultWritableTree is where the writable mode renders the tree it
// serves: under /run, which is memory on most hosts (a DaemonSet gives it
// an emptyDir in memory). The tree is rebuilt from the state file at every
// start, so it need not outlive the server; in memory, a bind takes a few
// milliseconds where this CI machine's disk took over ten.
const DefaultWritableTree = "/run/nvml-mock-sysfs/tree"

// writableView is the writable mode's FUSE view of the tree: a controller
// that answers writes and renders the tree at Tree, and the FUSE server
// that shows it at the served root. The state writes leave is kept in the
// served root, on the node's disk, read and written through a descriptor
// opened before the mount covers it.
type writableView struct {
	tree   string
	rootFD *os.File
	ctrl   *writableTree
	fuse   *fusetree.Server
}

// renderWritable renders ro through the controller into the tree, mounting the
// view over ro.Root at the first render and dropping the kernel's caches
// of what each later one changed.
func (s *Server) renderWritable(ro overlay.Options) (*plan.Plan, writer.Stats, error) {
	root := ro.Root
	w := s.writable
	if w == nil {
		// A view left by a killed server is detached first: the state
		// file under it must be reached, and the new view mounted there.
		if _, err := os.Lstat(root); errors.Is(err, fs.ErrNotExist) {
			if err := os.MkdirAll(root, 0o755); err != nil {
				return nil, writer.Stats{}, fmt.Errorf("served root %s: %w", root, err)
			}
		}
		if err := fusetree.PrepareMountPoint(root); err != nil {
			return nil, writer.Stats{}, err
		}
		fd, err := os.Open(root)
		if err != nil {
			return nil, writer.Stats{}, fmt.Errorf("served root %s: %w", root, err)
		}
		state := fmt.Sprintf("/proc/self/fd/%d/%s", fd.Fd(), writable.StateFile)
		tree := cmp.Or(s.opts.WritableTree, DefaultWritableTree)
		ctrl, err := openWritableTree(tree, state)
		if err != nil {
			fd.Close()
			return nil, writer.Stats{}, fmt.Errorf("served root %s: %w", root, err)
		}
		w = &writableView{tree: tree, rootFD: fd, ctrl: ctrl}
		s.writable = w
	}
	ro.Root = w.tree
	p, st, changed, err := w.ctrl.Render(ro)
	if err != nil {
		return p, st, err
	}
	if w.fuse == nil {
		f, err := fusetree.Mount(fusetree.Options{Backing: w.tree, MountPoint: root, Controller: w.ctrl, Name: "nvml-mock-sysfs"})
		if err != nil {
			return p, st, err
		}
		w.fuse = f
		s.log.Info("serving the writable view", "root", root, "tree", w.tree, "state", path.Join(root, writable.StateFile))
		return p, st, nil
	}
	w.fuse.Invalidate(changed)
	return p, st, nil
}

// closeWritable unmounts the view. Containers that mounted it see their
// mounts fail (ENOTCONN) until they restart on a new view: a FUSE server
// cannot outlive itself.
func (s *Server) closeWritable() {
	w := s.writable
	if w == nil {
		return
	}
	if w.fuse != nil {
		var held *fusetree.HeldElsewhereError
		switch err := w.fuse.Unmount(); {
		case errors.As(err, &held):
			s.log.Info("containers still hold the writable view; their mounts fail once serve exits", "root", s.opts.Render.Root)
		case err != nil:
			s.log.Error("unmounting the writable view", "root", s.opts.Render.Root, "err", err)
		}
	}
	w.rootFD.Close()
	s.writable = nil
}

// kernelRelease is the node's kernel release (uname -r), which containers
// share: the directory of /lib/modules whose modules.alias the writable
// mode stands in for. "" when uname fails, which leaves it out.
func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}
