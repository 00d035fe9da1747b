package compat

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvlib/pkg/nvpci"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// Consumer names of the rows about the HCAs of the infiniband block.
const (
	HCAPCIeRoot        = "deviceattribute.pcieRoot(HCA)"
	HCANUMA            = "deviceattribute.numaNode(HCA)"
	HCAAllDevices      = "nvpci.GetAllDevices(HCAs)"
	NetworkControllers = "nvpci.GetNetworkControllers"
)

// hcas checks the machine's HCAs, placed as the render placed them, around
// the host's own devices the tree lists: each resolves through
// deviceattribute to its GPU's pcieRoot and NUMA node, go-nvlib lists every
// one with its ids, and its GetNetworkControllers, which matches class
// 0x020000 only, lists exactly those in Ethernet mode. Mellanox functions at
// other addresses are the host's (--host-devices merge): named in the
// detail, never a failure.
func (c *checker) hcas() {
	if c.m.HCAs == nil {
		return
	}
	t, err := c.hcaTree()
	if err != nil {
		c.add(HCAPCIeRoot, "*", false, "plan the HCAs: %v", err)
		return
	}
	for _, h := range t.HCAs {
		c.hcaAttributes(h)
	}
	lib, _ := c.nvpci()
	want := map[string]*plan.Node{}
	var ethernet []string
	for _, h := range t.HCAs {
		want[h.Node.Address.String()] = h.Node
		if h.Node.Identity.Class == profile.ClassEthernet {
			ethernet = append(ethernet, h.Node.Address.String())
		}
	}
	all, err := c.bus.devs, c.bus.err
	if err != nil {
		c.add(HCAAllDevices, "*", false, "%v", err)
		return
	}
	var found, problems, host []string
	for _, d := range all {
		if d.Vendor != boards.VendorMellanox {
			continue
		}
		n, ok := want[d.Address]
		if !ok {
			host = append(host, d.Address)
			continue
		}
		found = append(found, d.Address)
		if p := mismatch(d, *n.Device); p != "" {
			problems = append(problems, d.Address+": "+p)
		}
		if d.Driver != profile.DriverMLX5 {
			problems = append(problems, fmt.Sprintf("%s: driver %q, want %s", d.Address, d.Driver, profile.DriverMLX5))
		}
	}
	if missing := missingFrom(found, keys(want)); len(missing) > 0 {
		problems = append(problems, "missing "+strings.Join(missing, ", "))
	}
	hostNote := ""
	if len(host) > 0 {
		hostNote = fmt.Sprintf("; the host's own: %s", strings.Join(host, ", "))
	}
	if len(problems) > 0 {
		c.add(HCAAllDevices, "*", false, "%s", strings.Join(problems, "; "))
	} else {
		c.add(HCAAllDevices, "*", true, "%d HCAs %s (%04x:%04x), class, subsystem, numa_node and driver as planned%s", len(found), c.m.HCAs.Name, boards.VendorMellanox, c.m.HCAs.Device, hostNote)
	}
	c.networkControllers(lib, want, ethernet)
}

func (c *checker) hcaAttributes(h plan.HCA) {
	bdf, gpu := h.Node.Address.String(), h.GPU.Address.String()
	hcaRoot, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(bdf, c.attrMods()...)
	if err != nil {
		c.add(HCAPCIeRoot, bdf, false, "%v", err)
	} else if gpuRoot, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(gpu, c.attrMods()...); err != nil {
		c.add(HCAPCIeRoot, bdf, false, "its GPU %s: %v", gpu, err)
	} else if got, want := describe(hcaRoot), describe(gpuRoot); got != want || want != h.GPU.RootComplex.String() {
		c.add(HCAPCIeRoot, bdf, false, "%s, its GPU %s %s, want both %s", got, gpu, want, h.GPU.RootComplex)
	} else {
		c.add(HCAPCIeRoot, bdf, true, "%s, as its GPU %s", got, gpu)
	}
	attr, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(bdf, deviceattribute.ScalarAttribute, c.attrMods()...)
	c.numa(HCANUMA, bdf, h.GPU.NUMANode, attr, err)
}

func (c *checker) networkControllers(lib nvpci.Interface, want map[string]*plan.Node, ethernet []string) {
	devs, err := lib.GetNetworkControllers()
	if err != nil {
		c.add(NetworkControllers, "*", false, "%v", err)
		return
	}
	var got []string
	for _, d := range devs {
		if _, mock := want[d.Address]; mock {
			got = append(got, d.Address)
		}
	}
	slices.Sort(got)
	slices.Sort(ethernet)
	if !slices.Equal(got, ethernet) {
		c.add(NetworkControllers, "*", false, "lists HCAs %v, want exactly the Ethernet-mode ones %v", got, ethernet)
		return
	}
	c.add(NetworkControllers, "*", true, "exactly the %d Ethernet-mode HCAs (link_layer %s)", len(ethernet), c.m.HCAs.LinkLayer)
}

// hcaTree plans the machine's tree as the render placed it, around the
// host's own devices the tree lists: where the HCAs are.
func (c *checker) hcaTree() (*plan.Tree, error) {
	return plan.BuildTree(c.m, plan.BuildOptions{Reserved: c.hostDevices()})
}

// hostDevices lists the entries of the links directory that carry the
// kernel's own link text (../../../devices/...), which only the host's
// devices merged by --host-devices merge have: the render placed the HCAs
// around them.
func (c *checker) hostDevices() []pciaddr.Address {
	dir := c.sysfs + "/" + sysfs.LinksDir
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []pciaddr.Address
	for _, e := range entries {
		target, err := os.Readlink(dir + "/" + e.Name())
		if err != nil || !plan.IsKernelLinkText(target) {
			continue
		}
		if a, err := pciaddr.Parse(e.Name()); err == nil {
			out = append(out, a)
		}
	}
	return out
}
