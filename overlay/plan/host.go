package plan

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"k8s.io/utils/cpuset"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// HostCPUs is what local_cpus and local_cpulist need of the host: a device
// on NUMA node N lists node N's CPUs, as the kernel does.
type HostCPUs struct {
	Possible int                   // nr_cpu_ids, the width of a CPU mask
	Online   cpuset.CPUSet         // for a node the host does not have
	Nodes    map[int]cpuset.CPUSet // node -> its CPUs
}

// SingleCPU is a host with one CPU and one node; tests use it so that plans
// do not depend on the machine they run on.
func SingleCPU() HostCPUs {
	return HostCPUs{Possible: 1, Online: cpuset.New(0), Nodes: map[int]cpuset.CPUSet{0: cpuset.New(0)}}
}

// cpusOf returns the CPUs local to a NUMA node.
func (h HostCPUs) cpusOf(node int) cpuset.CPUSet {
	if c, ok := h.Nodes[node]; ok {
		return c
	}
	return h.Online
}

// ReadHostCPUs reads the host's CPUs and NUMA nodes from a sysfs tree.
func ReadHostCPUs(sys fs.FS) (HostCPUs, error) {
	read := func(name string) (cpuset.CPUSet, error) {
		b, err := fs.ReadFile(sys, name)
		if err != nil {
			return cpuset.CPUSet{}, err
		}
		s, err := cpuset.Parse(strings.TrimSpace(string(b)))
		if err != nil {
			return cpuset.CPUSet{}, fmt.Errorf("%s: %w", name, err)
		}
		return s, nil
	}
	possible, err := read("devices/system/cpu/possible")
	if err != nil {
		return HostCPUs{}, fmt.Errorf("read host CPUs: %w", err)
	}
	online, err := read("devices/system/cpu/online")
	if err != nil {
		return HostCPUs{}, fmt.Errorf("read host CPUs: %w", err)
	}
	h := HostCPUs{Online: online, Nodes: map[int]cpuset.CPUSet{}}
	if list := possible.List(); len(list) > 0 {
		h.Possible = list[len(list)-1] + 1
	}
	nodes, err := fs.Glob(sys, "devices/system/node/node[0-9]*")
	if err != nil {
		return HostCPUs{}, fmt.Errorf("read host NUMA nodes: %w", err)
	}
	for _, dir := range nodes {
		id, err := strconv.Atoi(strings.TrimPrefix(path.Base(dir), "node"))
		if err != nil {
			continue
		}
		cpus, err := read(dir + "/cpulist")
		if err != nil {
			return HostCPUs{}, fmt.Errorf("read host NUMA node %d: %w", id, err)
		}
		h.Nodes[id] = cpus
	}
	if len(h.Nodes) == 0 {
		h.Nodes[0] = online // a kernel without NUMA has one node
	}
	return h, nil
}

// cpuMask formats CPUs as the kernel's local_cpus does: comma-separated
// 32-bit hex words, most significant first, as wide as nr_cpu_ids.
func cpuMask(cpus cpuset.CPUSet, possible int) string {
	if possible < 1 {
		possible = 1
	}
	words := make([]uint32, (possible+31)/32)
	for _, c := range cpus.List() {
		if c < possible {
			words[c/32] |= 1 << (c % 32)
		}
	}
	var b strings.Builder
	for i := len(words) - 1; i >= 0; i-- {
		width := 8
		if i == len(words)-1 {
			if rem := possible % 32; rem != 0 {
				width = (rem + 3) / 4
			}
		}
		fmt.Fprintf(&b, "%0*x", width, words[i])
		if i > 0 {
			b.WriteByte(',')
		}
	}
	return b.String()
}

// HostDevice is a PCI device of the node itself, kept beside the mock ones
// by --host-devices merge.
type HostDevice struct {
	Address pciaddr.Address
	// Target is the kernel's own link text, e.g.
	// ../../../devices/pci0000:00/0000:00:1f.2.
	Target string
	// Buses is a bridge's secondary..subordinate range; zero otherwise.
	Buses BusRange
}

// IsKernelLinkText reports whether a links-directory entry's text is the
// kernel's own form (../../../devices/...), which in a rendered tree only
// the node's devices merged by --host-devices merge have: mock devices'
// links climb into the overlay or start from their anchor.
func IsKernelLinkText(target string) bool { return strings.HasPrefix(target, "../../../devices/") }

// SysPath is the device's directory relative to sysfs, from its link text.
func (h HostDevice) SysPath() (string, error) {
	p := path.Clean(path.Join(sysfs.LinksDir, h.Target))
	if !strings.HasPrefix(p, "devices/") || path.Base(p) != h.Address.String() {
		return "", fmt.Errorf("host device %s: link %q does not lead into /sys/devices", h.Address, h.Target)
	}
	return p, nil
}

// HostAddresses lists the host devices' addresses: those a plan beside
// them must leave to the host.
func HostAddresses(hs []HostDevice) []pciaddr.Address {
	out := make([]pciaddr.Address, 0, len(hs))
	for _, h := range hs {
		out = append(out, h.Address)
	}
	return out
}

// ReadHostDevices lists the host's PCI devices from a sysfs tree.
func ReadHostDevices(sys fs.ReadLinkFS) ([]HostDevice, error) {
	entries, err := fs.ReadDir(sys, sysfs.LinksDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read host PCI devices: %w", err)
	}
	var out []HostDevice
	for _, e := range entries {
		a, err := pciaddr.Parse(e.Name())
		if err != nil || a.String() != e.Name() {
			return nil, fmt.Errorf("read host PCI devices: unexpected entry %q in %s", e.Name(), sysfs.LinksDir)
		}
		target, err := sys.ReadLink(sysfs.LinksDir + "/" + e.Name())
		if err != nil {
			return nil, fmt.Errorf("read host PCI device %s: %w", e.Name(), err)
		}
		h := HostDevice{Address: a, Target: target}
		if _, err := h.SysPath(); err != nil {
			return nil, err
		}
		if r, ok := readBridgeRange(sys, h); ok {
			h.Buses = r
		}
		out = append(out, h)
	}
	return out, nil
}

// BusRange is the buses First..Last of a PCI domain that a host bridge
// owns: its secondary to its subordinate bus.
type BusRange struct {
	Domain      uint16
	First, Last uint8
	Owner       pciaddr.Address // the host bridge
}

// readBridgeRange reads a host device's bus range from its config space,
// where a type 1 (bridge) header keeps the secondary and subordinate bus
// numbers. Sysfs lets anyone read the first 64 bytes.
func readBridgeRange(sys fs.FS, h HostDevice) (BusRange, bool) {
	config, err := fs.ReadFile(sys, sysfs.LinksDir+"/"+h.Address.String()+"/config")
	if err != nil || len(config) <= sysfs.ConfigSubordinateBus || config[sysfs.ConfigHeaderType]&sysfs.HeaderTypeMask != sysfs.HeaderTypeBridge {
		return BusRange{}, false
	}
	sec, sub := config[sysfs.ConfigSecondaryBus], config[sysfs.ConfigSubordinateBus]
	if sec == 0 || sub < sec {
		return BusRange{}, false // not configured by firmware
	}
	return BusRange{Domain: h.Address.Domain, First: sec, Last: sub, Owner: h.Address}, true
}

// hostBusRanges lists the bus ranges of the host's bridges, which no mock
// bridge may take a bus of. Bridges listed without their ranges (a test's
// sysfs) reserve nothing beyond their own devices' buses.
func hostBusRanges(host []HostDevice) []BusRange {
	var out []BusRange
	for _, h := range host {
		if h.Buses.Last != 0 {
			out = append(out, h.Buses)
		}
	}
	return out
}

// ReadHostDrivers lists the node's own PCI drivers: the directories of
// bus/pci/drivers in its sysfs.
func ReadHostDrivers(sys fs.FS) ([]string, error) {
	ents, err := fs.ReadDir(sys, "bus/pci/drivers")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
