package plan

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// Paths of the module view: /sys/module as a node with this profile has it
// (docs/design/modules.md).
const (
	// ModulesDir holds a directory per module the tree's drivers need, and
	// a link per module of the node, beside them.
	ModulesDir = "sys/" + sysfs.ModulesDir
	// HostModulesDir is where a consumer given the module view mounts the
	// node's own /sys/module, read-only, for the view's links to the node's
	// modules to lead into. Until something is mounted there, it holds a
	// link per node module to the node's sysfs (Options.HostSysfs), so that
	// the same links resolve on the host, and in a container that still
	// has its own /sys/module.
	HostModulesDir = HostSysDir + "/" + sysfs.ModulesDir
	// IOMMUGroupsDir holds a group per function of the tree, as the
	// kernel's /sys/kernel/iommu_groups does: the NVIDIA DRA driver needs
	// it non-empty beneath the node's / it mounts (docs/design/modules.md).
	IOMMUGroupsDir = "sys/kernel/iommu_groups"
)

// What the kernel prints in a loaded module's files.
const (
	// moduleLive is initstate once the module's init has returned.
	moduleLive = "live"
	// taintNVIDIA is the taint of the proprietary nvidia.ko (P, O, E:
	// proprietary, out of tree, unsigned) and of every module that imports
	// its symbols, which the kernel taints alike (nvidia_uvm shows (POE) in
	// /proc/modules). In-tree modules carry none.
	taintNVIDIA = "POE"
)

// KernelModule is a loadable module a GPU node has loaded, and the facts
// of its /sys/module directory. KernelModules is the one home of the
// names and of the holder graph.
type KernelModule struct {
	Name string
	// Drivers are the PCI drivers the module registers. It is loaded where
	// the tree lists one of them, and its drivers/ links to each one listed.
	Drivers []string
	// Uses are the modules it depends on: loading it loads them, and it is
	// among their holders.
	Uses []string
	// With are modules it is loaded beside, once all of them are, though
	// it does not depend on them all: what the GPU Operator's driver
	// container loads with nvidia, and the HCAs' stack with mlx5_core.
	With []string
	// Taint is its taint flags, as its taint file and /proc/modules print
	// them.
	Taint string
	// NVIDIAVersioned modules declare the driver's version
	// (MODULE_VERSION(NV_VERSION_STRING)), which their version file holds.
	NVIDIAVersioned bool
	// Size is the second column of its /proc/modules line, which lsmod
	// prints: a fixed plausible size, since nothing is loaded to measure.
	Size int
}

// KernelModules lists every module the view can render, in the order it
// renders them. The holder graph is a real node's (shared/WRITABLE.md):
// nvidia <- nvidia_uvm, nvidia_modeset, nvidia_peermem; ib_core <-
// nvidia_peermem, mlx5_ib; mlx5_core <- mlx5_ib; vfio <- vfio_pci_core,
// vfio_iommu_type1, vfio_pci; vfio_pci_core <- vfio_pci.
//
// nvidia_drm is not among them: the GPU Operator's driver container, whose
// operands are the programs that read this view, loads nvidia, nvidia_uvm
// and nvidia_modeset (and nvidia_peermem with RDMA), never nvidia_drm; and
// its driver manager reads nvidia_modeset's refcnt before it unloads the
// driver, which a holder nvidia_drm would make 1. nvidia.ko registers
// nvidia-nvswitch as well as nvidia (kernel-open/nvidia/linux_nvswitch.c).
func KernelModules() []KernelModule {
	nvidia := []string{"nvidia"}
	// Sizes: nvidia's is lsmod's on a GPU Operator node with RDMA
	// (shared/WRITABLE.md, from NVIDIA/cloud-native-docs' gpu-operator-rdma),
	// nvidia_uvm's /proc/modules' in nvidia-container-toolkit #115; the
	// others are stand-in sizes of the right order, which no consumer reads.
	return []KernelModule{
		{Name: "nvidia", Drivers: []string{profile.DriverNVIDIA, profile.DriverNVSwitch}, Taint: taintNVIDIA, NVIDIAVersioned: true, Size: 39059456},
		{Name: "nvidia_uvm", Uses: nvidia, With: nvidia, Taint: taintNVIDIA, NVIDIAVersioned: true, Size: 1507328},
		{Name: "nvidia_modeset", Uses: nvidia, With: nvidia, Taint: taintNVIDIA, NVIDIAVersioned: true, Size: 1314816},
		// GPUDirect RDMA: loaded where the node drives both GPUs and HCAs.
		{Name: "nvidia_peermem", Uses: []string{"nvidia", "ib_core"}, With: []string{"nvidia", "mlx5_core"}, Taint: taintNVIDIA, NVIDIAVersioned: true, Size: 16384},
		{Name: "vfio_pci", Drivers: []string{profile.DriverVFIO}, Uses: []string{"vfio_pci_core", "vfio"}, Size: 16384},
		{Name: "vfio_pci_core", Uses: []string{"vfio"}, Size: 86016},
		// The IOMMU backend vfio loads for a container; it holds vfio.
		{Name: "vfio_iommu_type1", Uses: []string{"vfio"}, With: []string{"vfio"}, Size: 45056},
		{Name: "vfio", Size: 61440},
		{Name: "mlx5_core", Drivers: []string{profile.DriverMLX5}, Size: 2318336},
		{Name: "mlx5_ib", Uses: []string{"mlx5_core", "ib_core"}, With: []string{"mlx5_core"}, Size: 475136},
		{Name: "ib_core", Size: 483328},
	}
}

// LoadedModules is what a node whose PCI drivers are those listed reports
// has loaded, in KernelModules' order: every module registering a listed
// driver, what those use, and what is loaded beside them.
func LoadedModules(listed func(driver string) bool) []KernelModule {
	all := KernelModules()
	loaded := map[string]bool{}
	for changed := true; changed; {
		changed = false
		for _, m := range all {
			if loaded[m.Name] {
				continue
			}
			beside := len(m.With) > 0 && !slices.ContainsFunc(m.With, func(w string) bool { return !loaded[w] })
			used := slices.ContainsFunc(all, func(h KernelModule) bool { return loaded[h.Name] && slices.Contains(h.Uses, m.Name) })
			if slices.ContainsFunc(m.Drivers, listed) || beside || used {
				loaded[m.Name], changed = true, true
			}
		}
	}
	return slices.DeleteFunc(all, func(m KernelModule) bool { return !loaded[m.Name] })
}

// Holders are the modules of loaded that use m: its holders/ entries, and
// the least its refcnt can be.
func (m KernelModule) Holders(loaded []KernelModule) []string {
	var out []string
	for _, h := range loaded {
		if slices.Contains(h.Uses, m.Name) {
			out = append(out, h.Name)
		}
	}
	slices.Sort(out)
	return out
}

// Refcnt is m's reference count on an idle node whose modules are loaded:
// its holders, nothing holding a device open. Its refcnt file and the third
// column of its /proc/modules line both print it.
func (m KernelModule) Refcnt(loaded []KernelModule) int { return len(m.Holders(loaded)) }

// modules plans the module view from the drivers the tree lists, so that a
// PCI driver is listed exactly where its module is loaded; then links the
// node's own modules beside them. A node module of one of our names is
// ours in the view: the tree's devices are bound to our driver, and its
// drivers/ must lead to them. The node's stays at HostModulesDir.
func (b *builder) modules() error {
	listed := func(d string) bool { return b.dirs[DriversDir+"/"+d] }
	for d := range b.dirs {
		if path.Dir(d) == DriversDir {
			b.drivers = append(b.drivers, path.Base(d))
		}
	}
	slices.Sort(b.drivers)
	b.loaded = LoadedModules(listed)
	loaded := b.loaded
	b.dir(ModulesDir)
	for _, m := range loaded {
		dir := ModulesDir + "/" + m.Name
		holders := m.Holders(loaded)
		b.text(dir, "initstate", moduleLive+"\n")
		b.text(dir, "refcnt", strconv.Itoa(m.Refcnt(loaded))+"\n")
		b.text(dir, "taint", m.Taint+"\n")
		if m.NVIDIAVersioned {
			b.text(dir, "version", b.machine.NVIDIAVersion()+"\n")
		}
		b.dir(dir + "/holders")
		for _, h := range holders {
			// The kernel's text: a sibling under /sys/module.
			b.inTree = append(b.inTree, link(dir+"/holders/"+h, "../../"+h))
		}
		for _, d := range m.Drivers {
			if !listed(d) {
				continue
			}
			ddir := dir + "/drivers"
			b.dir(ddir)
			b.inTree = append(b.inTree, link(ddir+"/pci:"+d, b.fromContainerRoot(ddir, DriversDir+"/"+d)))
		}
	}
	// The mount point of the node's own /sys/module is there even where the
	// node lists none: the mount set mounts it whatever the node has, and a
	// bind mount needs its target.
	b.dir(HostModulesDir)
	for _, name := range b.opts.HostModules {
		if err := CheckModuleName(name); err != nil {
			return err
		}
		b.inTree = append(b.inTree, link(HostModulesDir+"/"+name, path.Join(b.opts.HostSysfs, sysfs.ModulesDir, name)))
		if !b.ours(name) {
			b.inTree = append(b.inTree, link(ModulesDir+"/"+name, b.fromContainerRoot(ModulesDir, HostModulesDir+"/"+name)))
		}
	}
	return nil
}

// ours says whether the module view renders a module of this name, which
// then stands in the node's module of that name, in /sys/module and in
// /proc/modules alike.
func (b *builder) ours(name string) bool {
	return slices.ContainsFunc(b.loaded, func(m KernelModule) bool { return m.Name == name })
}

// moduleNames are the names of ms, in their order: Plan.Modules.
func moduleNames(ms []KernelModule) []string {
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

// fromContainerRoot is the text of a link in dir, a directory of the
// overlay, that climbs out of it as many levels as dir sits below the
// overlay root and comes back in at the container root to rel. It
// resolves on the host (through the loop link), in a container at the
// container root, and wherever dir's top directory is mounted as deep as
// it sits in the overlay: the links directory at /sys/bus/pci/devices, a
// writable drivers directory at /sys/bus/pci/drivers, the module view at
// /sys/module.
func (b *builder) fromContainerRoot(dir, rel string) string {
	return sysfs.Up(strings.Count(dir, "/")+1) + strings.TrimPrefix(b.opts.ContainerRoot, "/") + "/" + rel
}

// CheckModuleName refuses what no module of /sys/module is called: the
// view links each node module by its name.
func CheckModuleName(name string) error {
	ok := name != "" && name != "." && name != ".." && !strings.ContainsFunc(name, func(r rune) bool {
		return !(r == '_' || r == '-' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	})
	if !ok {
		return fmt.Errorf("node module %q: not a module name (letters, digits, '_', '-' and '.')", name)
	}
	return nil
}

// ReadHostModules lists the node's own modules, loaded and built in: the
// directories of the module directory of its sysfs. A sysfs without one
// (a test's, a container's without /sys/module) has none.
func ReadHostModules(sys fs.FS) ([]string, error) {
	ents, err := fs.ReadDir(sys, sysfs.ModulesDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read node modules: %w", err)
	}
	var out []string
	for _, e := range ents {
		if err := CheckModuleName(e.Name()); err != nil {
			return nil, fmt.Errorf("read node modules in %s: %w", sysfs.ModulesDir, err)
		}
		out = append(out, e.Name())
	}
	return out, nil
}
