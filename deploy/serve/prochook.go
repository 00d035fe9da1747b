package serve

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
)

// hooks are the hooks every channel's edits carry: the createContainer
// hook that serves the tree's /proc files, with ProcHookBinary.
func (s *Server) hooks() []*specs.Hook {
	if s.opts.ProcHookBinary == "" {
		return nil
	}
	return []*specs.Hook{cdispec.ProcHook(s.opts.ProcHookBinary, s.opts.Render.Root)}
}

// installProcHook installs serve's own executable at ProcHookBinary, for
// the hook the edits carry to run (see installExecutable).
func (s *Server) installProcHook() error {
	if s.opts.ProcHookBinary == "" {
		return nil
	}
	self, err := os.Executable()
	if err == nil {
		err = installExecutable(self, s.opts.ProcHookBinary)
	}
	if err != nil {
		return fmt.Errorf("--proc-hook-binary %q: %v", s.opts.ProcHookBinary, err)
	}
	s.log.Info("installed the /proc hook's binary", "file", s.opts.ProcHookBinary)
	return nil
}

// installExecutable makes dst hold src's bytes, executable, atomically:
// a runtime that runs the hook meanwhile runs the old binary or the new
// one, never a torn one, and a running old one is replaced, not written
// over (which would fail, text file busy). It writes nothing when dst
// holds these bytes already and its owner (root, who runs hooks) may run
// it, so a restart does not touch the node.
func installExecutable(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if st, err := os.Stat(dst); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o100 != 0 {
		if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, data) {
			return nil
		}
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	// The pending file is in dst's directory, so the rename is atomic.
	pf, err := renameio.NewPendingFile(dst, renameio.WithStaticPermissions(0o755))
	if err != nil {
		return err
	}
	defer pf.Cleanup()
	if _, err := pf.Write(data); err != nil {
		return err
	}
	return pf.CloseAtomicallyReplace()
}
