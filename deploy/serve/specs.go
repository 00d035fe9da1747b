package serve

import (
	"cmp"
	"fmt"
	"os"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// writeSpecs writes the standalone spec and merges into the other, as
// configured, behind the same gate as the cdi command and the NRI plugin
// (served). It returns how many files it changed.
func (s *Server) writeSpecs() (int, error) {
	env, err := s.served()
	if err != nil {
		return 0, err
	}
	n := 0
	if s.opts.Output != "" {
		_, wrote, err := cdispec.WriteStandalone(s.opts.Output, s.opts.Kind, s.mounts, env, true, s.hooks()...)
		if err != nil {
			return n, err
		}
		if wrote {
			n++
			s.log.Info("wrote CDI spec", "file", s.opts.Output, "device", s.opts.Kind+"="+cdispec.DeviceName, "mounts", len(s.mounts), "env", env)
		}
	}
	if s.opts.MergeInto != "" {
		_, r, wrote, err := cdispec.MergeInto(s.opts.MergeInto, s.mounts, env, true, s.hooks()...)
		if err != nil {
			return n, fmt.Errorf("merge into %s: %w; left as it was", s.opts.MergeInto, err)
		}
		if wrote {
			n++
			s.log.Info("merged into CDI spec", "file", s.opts.MergeInto, "removed", len(r.Removed), "added", len(r.Added), "env", r.Env)
		}
	}
	return n, nil
}

// served is the gate of every channel: the root holds a complete render
// (its completion marker, not a directory existing). It returns the
// variables that go with the mounts, which follow the render (a profile
// may gain or lose its machine type), unlike the mounts.
func (s *Server) served() ([]string, error) {
	root := s.opts.Render.Root
	rootFS := os.DirFS(root)
	if err := cdispec.CheckRendered(rootFS, root); err != nil {
		return nil, err
	}
	return cdispec.Env(rootFS, s.opts.Render.ContainerRoot), nil
}

// Edits are the edits of the spec's device (cdispec.DeviceEdits) as the
// root is now: the NRI plugin's source, read at each container's creation.
// When the root cannot be served now, the error says why, and the edits
// hold the mounts it would serve, without their variables.
func (s *Server) Edits() (specs.ContainerEdits, error) { return s.edits(s.mounts) }

// ReadOnlyEdits are Edits with the read-only tree's mounts (cdispec.Mounts)
// of the same root: with Writable, the view mounted read-only, which shows
// what writers did but takes no write; else Edits.
func (s *Server) ReadOnlyEdits() (specs.ContainerEdits, error) { return s.edits(s.readOnly) }

func (s *Server) edits(mounts []cdispec.Mount) (specs.ContainerEdits, error) {
	env, err := s.served()
	edits := cdispec.DeviceEdits(mounts, env, s.hooks()...)
	if err != nil {
		edits.Env = nil
	}
	return edits, err
}

// beneath is what the NRI plugin adds beneath a served container's binds
// of the node's / or /sys, read at each creation: the tree's groups follow
// the render, and the node's sysfs (Render.HostSysfs) is read as it is.
func (s *Server) beneath() cdispec.Beneath {
	root := s.opts.Render.Root
	return cdispec.NewBeneath(root, os.DirFS(root), os.DirFS(cmp.Or(s.opts.Render.HostSysfs, plan.DefaultHostSysfs)))
}
