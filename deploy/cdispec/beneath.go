package cdispec

import (
	"io/fs"
	"path"
	"slices"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// Beneath is what a served container that mounts the node's / or /sys
// somewhere else (the NVIDIA DRA driver's chart: / at /host-root;
// nfd-worker's: /sys at /host-sys) gets beneath that mount, besides the
// mount set: the facts of the node and of the tree its Mounts decide on.
// Its zero value adds nothing but the module view.
type Beneath struct {
	// Root is the overlay root on the node.
	Root string
	// TreeGroups says the rendered tree has IOMMU groups (its
	// plan.IOMMUGroupsDir is not empty): the DRA driver needs a non-empty
	// $HOST_ROOT/sys/kernel/iommu_groups to prepare a VFIO claim.
	TreeGroups bool
	// NodeGroups says the node's sysfs has kernel/iommu_groups, so that
	// the tree's groups can be mounted at the same path beneath a bind of
	// it. Beneath a bind of the node's sysfs a missing mount target cannot
	// be made (sysfs refuses mkdir, and the runtime fails the container's
	// creation), so without it the tree's sys/kernel, which holds only its
	// groups, is mounted at <sys>/kernel, which every kernel has: that
	// hides the node's own /sys/kernel beneath that mount only (never at
	// the container's /sys/kernel, never on the node), which neither the
	// DRA driver nor nfd-worker reads there.
	NodeGroups bool
}

// NewBeneath reads Beneath's facts: the tree's groups in tree (the
// overlay root, at root on the node) and the node's in nodeSysfs (the
// node's /sys).
func NewBeneath(root string, tree, nodeSysfs fs.FS) Beneath {
	groups, _ := fs.ReadDir(tree, plan.IOMMUGroupsDir)
	node, err := fs.Stat(nodeSysfs, path.Join("kernel", path.Base(plan.IOMMUGroupsDir)))
	return Beneath{Root: root, TreeGroups: len(groups) > 0, NodeGroups: err == nil && node.IsDir()}
}

// Mounts decides, for a served container with the mounts ctr, which
// mounts it gets beneath its binds of the node's / or /sys, given the
// destinations it is served already (served, the edits' mounts):
//
//   - an rbind of / at D: the module view at D/sys/module, and the tree's
//     groups at D/sys/kernel/iommu_groups (or its sys/kernel at
//     D/sys/kernel, see NodeGroups) where it has groups. Only an rbind: a
//     plain bind of / does not carry the node's sysfs, so D/sys/module
//     would be a directory the runtime makes on the node's root filesystem.
//   - a bind (or rbind) of /sys at D: the same at D/module and
//     D/kernel/iommu_groups (or D/kernel).
//
// A mount the container has at /sys is served already (the mount set),
// and so is any destination the container is served, or mounts itself,
// already: those are left out. So is a mount with shared propagation
// (a pod's Bidirectional hostPath): a mount beneath it would propagate to
// the node's own /sys. Each added mount is read-only, like the mount set.
//
// The module view's links climb sysfs.ModulesDepth levels, so they
// resolve at D/module for a /sys at /host-sys (two levels deep) but not at
// /host-root/sys/module (three): there only its directories serve, which
// is all the DRA driver needs (a stat of /host-root/sys/module/vfio_pci).
// The groups' links lead to the node's PCI devices beneath the same
// mount, not the tree's; the DRA driver only lists the directory.
func (b Beneath) Mounts(ctr []Mount, served []string) []Mount {
	taken := slices.Clone(served)
	for _, m := range ctr {
		taken = append(taken, path.Clean(m.Destination))
	}
	var out []Mount
	add := func(source, dest string) {
		if slices.Contains(taken, dest) {
			return
		}
		taken = append(taken, dest)
		out = append(out, Mount{Source: source, Destination: dest, Options: mountOptions()})
	}
	for _, m := range ctr {
		sys, ok := nodeSysfsAt(m)
		if !ok || sys == sysfs.Mount {
			continue
		}
		add(path.Join(b.Root, plan.ModulesDir), path.Join(sys, sysfs.ModulesDir))
		switch {
		case !b.TreeGroups:
		case b.NodeGroups:
			add(path.Join(b.Root, plan.IOMMUGroupsDir), path.Join(sys, "kernel", path.Base(plan.IOMMUGroupsDir)))
		default:
			add(path.Join(b.Root, path.Dir(plan.IOMMUGroupsDir)), path.Join(sys, "kernel"))
		}
	}
	return out
}

// nodeSysfsAt is where a container's mount puts the node's sysfs: D/sys
// for an rbind of / at D, D for a bind of /sys at D; false for any other
// mount, and for one whose propagation is shared.
func nodeSysfsAt(m Mount) (string, bool) {
	has := func(o ...string) bool {
		return slices.ContainsFunc(m.Options, func(x string) bool { return slices.Contains(o, x) })
	}
	if SharedPropagation(m.Options) {
		return "", false
	}
	dest := path.Clean(m.Destination)
	switch path.Clean(m.Source) {
	case "/":
		return path.Join(dest, sysfs.Mount), has("rbind")
	case sysfs.Mount:
		return dest, has("bind", "rbind")
	}
	return "", false
}

// SharedPropagation reports whether a mount's options give it shared
// propagation (a pod's Bidirectional volume): a mount made beneath it
// reaches its peers, the node's own.
func SharedPropagation(options []string) bool {
	return slices.Contains(options, "shared") || slices.Contains(options, "rshared")
}
