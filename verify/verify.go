// Package verify checks, from inside a running container, that the mock
// sysfs is served as intended: the real consumer libraries see the
// profile's GPUs (through package compat, which runs them), and nothing
// else of the container's sysfs changed.
//
// Every read goes through System, so the checks run against a rendered
// tree on the host in tests and against /sys and /proc/self in a container.
package verify

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"k8s.io/utils/cpuset"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// SysfsMagic is the statfs type of the kernel's sysfs (SYSFS_MAGIC).
const SysfsMagic = 0x62656572

// Names of verify's own checks; the consumer rows keep compat's names.
const (
	LinksResolve   = "links resolve"
	DisplayDevices = "display-class devices"
	KernelDevices  = "isolation: /sys/devices"
	CPUTopology    = "isolation: CPU topology"
	NetInterfaces  = "isolation: /sys/class/net"
	DMI            = "isolation: /sys/class/dmi/id"
	LinksMount     = "mount: links directory"
	OverlayMount   = "mount: overlay"
	NodeDevices    = "node devices listed"
	OtherMocks     = "environment: no other PCI mock"
)

// Variables of nvml-mock's LD_PRELOAD shim, libpcimocksys, which redirects
// PCI sysfs reads of dynamically linked programs into its own tree. Its
// NRI plugin sets both by default (pkg/nri/nvmlmock, adjust.go).
const (
	pciShim        = "libpcimocksys"
	PCIShimRootEnv = "MOCK_PCI_ROOT"
)

// System is what verify reads of the system it checks.
type System struct {
	// Sysfs is where consumers read: /sys in a container.
	Sysfs string
	// ContainerRoot is where the overlay is mounted: /opt/nvml-mock.
	ContainerRoot string
	// Statfs returns the type (magic) of the filesystem holding a path.
	Statfs func(path string) (int64, error)
	// MountInfo returns the process's mount table (/proc/self/mountinfo).
	MountInfo func() ([]byte, error)
	// Interfaces names the network interfaces of the process's network
	// namespace, as netlink lists them.
	Interfaces func() ([]string, error)
	// LookupEnv reads the process's environment; nil is an empty one.
	LookupEnv func(key string) (string, bool)
	// NVMLProfile is the profile nvml-mock's NVML serves; empty means the
	// one MOCK_NVML_CONFIG names, if set.
	NVMLProfile string
}

func (s System) getenv(key string) (string, bool) {
	if s.LookupEnv == nil {
		return "", false
	}
	return s.LookupEnv(key)
}

// Live is the running system, seen from this process.
func Live(sysRoot, containerRoot string) System {
	return System{
		Sysfs:         sysRoot,
		ContainerRoot: containerRoot,
		Statfs: func(p string) (int64, error) {
			var st unix.Statfs_t
			if err := unix.Statfs(p, &st); err != nil {
				return 0, err
			}
			return int64(st.Type), nil
		},
		MountInfo: func() ([]byte, error) { return os.ReadFile("/proc/self/mountinfo") },
		LookupEnv: os.LookupEnv,
		Interfaces: func() ([]string, error) {
			ifs, err := net.Interfaces()
			if err != nil {
				return nil, err
			}
			var names []string
			for _, i := range ifs {
				names = append(names, i.Name)
			}
			return names, nil
		},
	}
}

// Run checks the system against the machine it should show. The report
// is compat's, with verify's own rows around the consumers' rows.
func Run(m *profile.Machine, sys System) *compat.Report {
	v := &verifier{m: m, sys: sys, fsys: os.DirFS(sys.Sysfs), report: &compat.Report{Sysfs: sys.Sysfs}}
	v.links()
	v.nodeDevices()
	v.report.Results = append(v.report.Results, compat.Run(m, sys.Sysfs).Results...)
	v.nvml()
	v.otherMocks()
	v.kernelDevices()
	v.cpuTopology()
	v.netInterfaces()
	v.dmi()
	mounts, err := v.mounts()
	v.mountCheck(LinksMount, path.Join(sys.Sysfs, sysfs.LinksDir), "/"+plan.LinksDir, mounts, err)
	v.mountCheck(OverlayMount, sys.ContainerRoot, "", mounts, err)
	return v.report
}

type verifier struct {
	m      *profile.Machine
	sys    System
	fsys   fs.FS
	report *compat.Report
}

func (v *verifier) add(name, subject string, ok bool, format string, args ...any) {
	v.report.Results = append(v.report.Results, compat.Result{Check: name, Device: subject, OK: ok, Detail: fmt.Sprintf(format, args...)})
}

// links opens every entry of the links directory, as go-nvlib and NFD do
// (one unreadable entry aborts go-nvlib's whole scan), and checks that the
// NVIDIA functions of display class (0x03) are exactly the profile's GPUs.
// Other vendors' display devices, such as a server's BMC VGA listed by
// --host-devices merge, are the node's own and confuse no GPU consumer.
func (v *verifier) links() {
	where := path.Join(v.sys.Sysfs, sysfs.LinksDir)
	entries, err := fs.ReadDir(v.fsys, sysfs.LinksDir)
	if err != nil {
		v.add(LinksResolve, where, false, "%v", err)
		v.add(DisplayDevices, where, false, "cannot list %s", where)
		return
	}
	var broken []string
	display := map[string]string{}
	for _, e := range entries {
		p := sysfs.LinksDir + "/" + e.Name()
		st, err := fs.Stat(v.fsys, p)
		if err != nil || !st.IsDir() {
			broken = append(broken, fmt.Sprintf("%s (%v)", e.Name(), errOrKind(err, st)))
			continue
		}
		class, err := readHex(v.fsys, p+"/class")
		if err != nil {
			broken = append(broken, fmt.Sprintf("%s (class: %v)", e.Name(), err))
			continue
		}
		vendor, err := readHex(v.fsys, p+"/vendor")
		if err != nil {
			broken = append(broken, fmt.Sprintf("%s (vendor: %v)", e.Name(), err))
			continue
		}
		if class>>16 == 0x03 && vendor == uint64(boards.VendorNVIDIA) {
			display[e.Name()] = fmt.Sprintf("0x%06x", class)
		}
	}
	if len(broken) > 0 {
		v.add(LinksResolve, where, false, "%d of %d entries do not resolve to a device directory: %s", len(broken), len(entries), strings.Join(broken, "; "))
	} else {
		v.add(LinksResolve, where, true, "%d entries, each resolves to a device directory with a class", len(entries))
	}
	v.displayDevices(where, display)
}

func errOrKind(err error, st fs.FileInfo) string {
	if err != nil {
		return err.Error()
	}
	return "not a directory: " + st.Mode().String()
}

func readHex(fsys fs.FS, name string) (uint64, error) {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 0, 32)
}

// displayDevices: the profile's GPUs are there, and no other device claims
// a display class, which every GPU-finding consumer keys on.
func (v *verifier) displayDevices(where string, display map[string]string) {
	var problems, gpus []string
	for _, g := range v.m.GPUs() {
		bdf := g.Address.String()
		gpus = append(gpus, bdf)
		if _, ok := display[bdf]; !ok {
			problems = append(problems, bdf+" of the profile is missing or not of display class")
		}
	}
	var others []string
	for bdf, class := range display {
		if !slices.Contains(gpus, bdf) {
			others = append(others, bdf+" (class "+class+")")
		}
	}
	slices.Sort(others)
	if len(others) > 0 {
		problems = append(problems, "NVIDIA functions of display class not in the profile: "+strings.Join(others, ", "))
	}
	if len(problems) > 0 {
		v.add(DisplayDevices, where, false, "%s", strings.Join(problems, "; "))
		return
	}
	v.add(DisplayDevices, where, true, "exactly the profile's %d GPUs are NVIDIA functions of display class", len(gpus))
}

// kernelDevices: the mock serves only the links directory, so /sys/devices
// must still be the kernel's sysfs, not a bind mount of a mock tree.
func (v *verifier) kernelDevices() {
	p := path.Join(v.sys.Sysfs, "devices")
	v.sysfsCheck(KernelDevices, p, "the kernel's sysfs")
}

func (v *verifier) sysfsCheck(name, p, what string) bool {
	magic, err := v.sys.Statfs(p)
	switch {
	case err != nil:
		v.add(name, p, false, "statfs: %v", err)
		return false
	case magic != SysfsMagic:
		v.add(name, p, false, "statfs magic 0x%x, not sysfs (0x%x): something is mounted over it", magic, SysfsMagic)
		return false
	}
	v.add(name, p, true, "statfs magic 0x%x: %s", magic, what)
	return true
}

// cpuTopology: the CPU topology that schedulers and deviceattribute's NUMA
// list read is the kernel's and readable.
func (v *verifier) cpuTopology() {
	const cpuDir = "devices/system/cpu"
	p := path.Join(v.sys.Sysfs, cpuDir)
	b, err := fs.ReadFile(v.fsys, cpuDir+"/online")
	if err != nil {
		v.add(CPUTopology, p, false, "%v", err)
		return
	}
	online, err := cpuset.Parse(strings.TrimSpace(string(b)))
	if err != nil || online.Size() == 0 {
		v.add(CPUTopology, p, false, "online %q: not a CPU list (%v)", strings.TrimSpace(string(b)), err)
		return
	}
	first := online.List()[0]
	pkg, err := fs.ReadFile(v.fsys, fmt.Sprintf("%s/cpu%d/topology/physical_package_id", cpuDir, first))
	if err != nil {
		v.add(CPUTopology, p, false, "online %s, but: %v", online, err)
		return
	}
	v.add(CPUTopology, p, true, "online %s (%d CPUs), cpu%d in package %s", online, online.Size(), first, strings.TrimSpace(string(pkg)))
}

// netInterfaces: sysfs shows the network namespace of whoever mounted it,
// so /sys/class/net matching netlink shows the container's own sysfs.
func (v *verifier) netInterfaces() {
	const netDir = "class/net"
	p := path.Join(v.sys.Sysfs, netDir)
	entries, err := fs.ReadDir(v.fsys, netDir)
	if err != nil {
		v.add(NetInterfaces, p, false, "%v", err)
		return
	}
	var listed []string
	for _, e := range entries {
		listed = append(listed, e.Name())
	}
	own, err := v.sys.Interfaces()
	if err != nil {
		v.add(NetInterfaces, p, false, "netlink: %v", err)
		return
	}
	slices.Sort(listed)
	slices.Sort(own)
	if !slices.Equal(listed, own) {
		v.add(NetInterfaces, p, false, "lists %v, but this network namespace has %v", listed, own)
		return
	}
	v.add(NetInterfaces, p, true, "%s: the same as netlink lists for this network namespace", strings.Join(listed, " "))
}

// dmi: where the kernel has DMI, the container still sees it; where it has
// none, /sys/class is the kernel's and simply has no dmi.
func (v *verifier) dmi() {
	const id = "class/dmi/id"
	p := path.Join(v.sys.Sysfs, id)
	if _, err := fs.Stat(v.fsys, id); errors.Is(err, fs.ErrNotExist) {
		class := path.Join(v.sys.Sysfs, "class")
		magic, err := v.sys.Statfs(class)
		if err != nil || magic != SysfsMagic {
			v.add(DMI, p, false, "absent, and %s is not the kernel's sysfs (magic 0x%x, %v)", class, magic, err)
			return
		}
		v.add(DMI, p, true, "absent, and %s is the kernel's sysfs: this kernel has no DMI", class)
		return
	}
	if !v.sysfsCheck(DMI, p, "the kernel's DMI") {
		return
	}
	if b, err := fs.ReadFile(v.fsys, id+"/sys_vendor"); err == nil {
		c := &v.report.Results[len(v.report.Results)-1]
		c.Detail += ", sys_vendor " + strings.TrimSpace(string(b))
	}
}

func (v *verifier) mounts() ([]*mountinfo.Info, error) {
	b, err := v.sys.MountInfo()
	if err != nil {
		return nil, err
	}
	return mountinfo.GetMountsFromReader(bytes.NewReader(b), nil)
}

// mountCheck: the mount point's topmost mount is read-only and not sysfs,
// and its root (the directory a bind mount shows) ends with rootSuffix.
func (v *verifier) mountCheck(name, at, rootSuffix string, mounts []*mountinfo.Info, err error) {
	if err != nil {
		v.add(name, at, false, "mountinfo: %v", err)
		return
	}
	var top *mountinfo.Info
	for _, m := range mounts {
		if m.Mountpoint == at {
			top = m
		}
	}
	switch {
	case top == nil:
		v.add(name, at, false, "nothing is mounted at %s", at)
	case top.FSType == "sysfs":
		v.add(name, at, false, "mount %d is the kernel's sysfs, not a bind mount of the overlay", top.ID)
	case !slices.Contains(strings.Split(top.Options, ","), "ro"):
		v.add(name, at, false, "mount %d (%s %s) is writable: %s", top.ID, top.FSType, top.Root, top.Options)
	case !strings.HasSuffix(top.Root, rootSuffix):
		v.add(name, at, false, "mount %d shows %s of %s %s, not an overlay's %s", top.ID, top.Root, top.FSType, top.Source, strings.TrimPrefix(rootSuffix, "/"))
	default:
		v.add(name, at, true, "mount %d: %s of %s %s, %s", top.ID, top.Root, top.FSType, top.Source, top.Options)
	}
}

// nvml: the GPUs nvml-mock's NVML reports are the sysfs's GPUs. Without
// nvml-mock's profile (no MOCK_NVML_CONFIG, no --nvml-profile) there is
// nothing to compare, and the row says so.
func (v *verifier) nvml() {
	file := v.sys.NVMLProfile
	if file == "" {
		file, _ = v.sys.getenv(compat.NVMLProfileEnv)
	}
	if file == "" {
		v.add(compat.NVMLAgreement, "-", true, "not compared: %s is not set and no --nvml-profile was given, so no nvml-mock NVML serves this container", compat.NVMLProfileEnv)
		return
	}
	v.report.Results = append(v.report.Results, compat.NVMLCheck(file, v.sys.Sysfs))
}

// otherMocks: nvml-mock's LD_PRELOAD shim would redirect the PCI sysfs
// reads of dynamically linked programs into its own tree, while static Go
// programs read ours: two mocks that disagree.
func (v *verifier) otherMocks() {
	var problems []string
	if preload, _ := v.sys.getenv("LD_PRELOAD"); strings.Contains(preload, pciShim) {
		problems = append(problems, fmt.Sprintf("LD_PRELOAD=%s loads nvml-mock's %s", preload, pciShim))
	}
	if root, _ := v.sys.getenv(PCIShimRootEnv); root != "" {
		problems = append(problems, fmt.Sprintf("%s=%s points nvml-mock's %s at its own tree", PCIShimRootEnv, root, pciShim))
	}
	if len(problems) > 0 {
		v.add(OtherMocks, "env", false, "%s: two PCI mocks would disagree; drop %s from nvml-mock-nri's --ld-preload-shims and set %s= empty (docs/user/nvml-mock.md)", strings.Join(problems, "; "), pciShim, PCIShimRootEnv)
		return
	}
	v.add(OtherMocks, "env", true, "LD_PRELOAD does not load %s and %s is not set", pciShim, PCIShimRootEnv)
}

// nodeDevices: every PCI device the node has, as the kernel's own
// /sys/devices/pci*/ directories show it (they stay the kernel's in a served
// container), is still listed in the served links directory, by a link
// that leads to that very directory. A device missing there, or shadowed
// by a mock device at its address, has vanished for ghw, NFD and lspci.
func (v *verifier) nodeDevices() {
	where := path.Join(v.sys.Sysfs, sysfs.LinksDir)
	roots, err := fs.Glob(v.fsys, "devices/pci[0-9a-f]*")
	if err != nil || len(roots) == 0 {
		v.add(NodeDevices, where, false, "no host bridges under %s (%v)", path.Join(v.sys.Sysfs, "devices"), err)
		return
	}
	var node []string
	for _, r := range roots {
		node = append(node, deviceDirs(v.fsys, r)...)
	}
	var missing, shadowed []string
	for _, dir := range node {
		bdf := path.Base(dir)
		link := sysfs.LinksDir + "/" + bdf
		if _, err := fs.Lstat(v.fsys, link); err != nil {
			missing = append(missing, bdf)
			continue
		}
		listed, err := fs.Stat(v.fsys, link)
		own, derr := fs.Stat(v.fsys, dir)
		if err != nil || derr != nil || !os.SameFile(listed, own) {
			target, _ := fs.ReadLink(v.fsys, link)
			shadowed = append(shadowed, fmt.Sprintf("%s -> %s", bdf, target))
		}
	}
	if len(missing)+len(shadowed) > 0 {
		slices.Sort(missing)
		var problems []string
		if len(missing) > 0 {
			problems = append(problems, fmt.Sprintf("%d of the node's %d PCI devices are not listed: %s", len(missing), len(node), strings.Join(missing, " ")))
		}
		if len(shadowed) > 0 {
			problems = append(problems, fmt.Sprintf("%d shadowed by mock devices at their addresses: %s", len(shadowed), strings.Join(shadowed, ", ")))
		}
		v.add(NodeDevices, where, false, "%s (render with --host-devices merge)", strings.Join(problems, "; "))
		return
	}
	v.add(NodeDevices, where, true, "all %d PCI devices under %s are listed, each by a link to its own directory", len(node), path.Join(v.sys.Sysfs, "devices/pci*"))
}

// deviceDirs lists the directories of the PCI functions below a directory:
// its subdirectories named by a BDF, and theirs, as the kernel nests
// devices below bridges.
func deviceDirs(fsys fs.FS, dir string) []string {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() || !pciaddr.IsBDF(e.Name()) {
			continue
		}
		out = append(out, dir+"/"+e.Name())
		out = append(out, deviceDirs(fsys, dir+"/"+e.Name())...)
	}
	return out
}
