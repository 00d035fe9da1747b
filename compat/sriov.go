package compat

import (
	"fmt"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// Checks of SR-IOV on a writable tree: the write that enables or disables
// an HCA's virtual functions, and what VF-aware readers then list.
const (
	SRIOVWrite    = "write sriov_numvfs"
	SRIOVNvpci    = "nvpci SriovInfo"
	SRIOVPCIeRoot = "deviceattribute.pcieRoot(VF)"
)

// SRIOV writes n to every HCA's sriov_numvfs at /sys, as the SR-IOV
// network operator or a NIC DRA driver does, and checks what go-nvlib and
// deviceattribute then see: the physical function with n of its
// sriov_totalvfs enabled, n virtual functions (VFAddress) whose physical
// function it is, each with the physical function's pcieRoot, and no other
// of its VFs. It writes only where a writable tree (serve --writable) is
// mounted at /sys/bus/pci, as its CDI spec mounts it.
func SRIOV(m *profile.Machine, n int) *Report {
	c := &checker{m: m, sysfs: KernelSysfs, report: &Report{Sysfs: KernelSysfs}}
	if m.HCAs == nil || m.HCAs.TotalVFs == 0 {
		c.add(SRIOVWrite, "*", false, "the profile gives no HCA sriov_totalvfs (infiniband.sriov_totalvfs)")
		return c.report
	}
	t, err := c.hcaTree()
	if err != nil {
		c.add(SRIOVWrite, "*", false, "plan the HCAs: %v", err)
		return c.report
	}
	wrote := map[string]bool{}
	for _, h := range t.HCAs {
		pf := h.Node.Address.String()
		file := path.Join(KernelSysfs, sysfs.LinksDir, pf, "sriov_numvfs")
		if err := os.WriteFile(file, []byte(strconv.Itoa(n)), 0); err != nil {
			c.add(SRIOVWrite, pf, false, "%v", err)
			continue
		}
		wrote[pf] = true
		c.add(SRIOVWrite, pf, true, "%d to %s", n, file)
	}
	lib, _ := c.nvpci()
	all, err := lib.GetAllDevices()
	if err != nil {
		c.add(SRIOVNvpci, "*", false, "%v", err)
		return c.report
	}
	for _, h := range t.HCAs {
		pf := h.Node.Address
		if !wrote[pf.String()] {
			continue
		}
		var want []string
		for i := range n {
			a, _ := plan.VFAddress(pf, i)
			want = append(want, a.String())
		}
		var got, p []string
		for _, d := range all {
			switch {
			case d.Address == pf.String():
				info := d.SriovInfo.PhysicalFunction
				if info == nil || info.NumVFs != uint64(n) || info.TotalVFs != uint64(m.HCAs.TotalVFs) {
					p = append(p, fmt.Sprintf("physical function %+v, want %d of %d enabled", info, n, m.HCAs.TotalVFs))
				}
			case d.SriovInfo.IsVF() && d.SriovInfo.VirtualFunction.PhysicalFunction.Address == pf.String():
				got = append(got, d.Address)
				if d.Driver != profile.DriverMLX5 || d.Device != m.HCAs.VFDevice {
					p = append(p, fmt.Sprintf("%s: %04x bound to %q, want %04x on %s", d.Address, d.Device, d.Driver, m.HCAs.VFDevice, profile.DriverMLX5))
				}
			}
		}
		if !slices.Equal(got, want) {
			p = append(p, fmt.Sprintf("virtual functions %v, want %v", got, want))
		}
		if len(p) > 0 {
			c.add(SRIOVNvpci, pf.String(), false, "%s", strings.Join(p, "; "))
		} else {
			c.add(SRIOVNvpci, pf.String(), true, "%d of %d VFs enabled, listed with their physical function: %s", n, m.HCAs.TotalVFs, strings.Join(got, " "))
		}
		c.vfRoots(h.Node.Device.RootComplex.String(), want)
	}
	return c.report
}

// vfRoots checks that deviceattribute gives every VF its physical
// function's pcieRoot, as a topology-aware DRA claim aligns them.
func (c *checker) vfRoots(root string, vfs []string) {
	for _, vf := range vfs {
		if p := c.pcieRoot(vf, root); p != "" {
			c.add(SRIOVPCIeRoot, vf, false, "%s", p)
		} else {
			c.add(SRIOVPCIeRoot, vf, true, "%s, its physical function's", root)
		}
	}
}
