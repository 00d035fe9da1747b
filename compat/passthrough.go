package compat

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"syscall"

	"github.com/NVIDIA/go-nvlib/pkg/nvpassthrough"
	"github.com/NVIDIA/go-nvlib/pkg/nvpci"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// Checks of a writable tree: go-nvlib's nvpassthrough, which the NVIDIA
// DRA driver's passthrough support binds GPUs with, each call a row, and
// what the kernel answers a bind of an address no device has.
const (
	BindVFIO    = "nvpassthrough.BindToVFIODriver"
	BindDriver  = "nvpassthrough.BindToDriver"
	UnbindCheck = "nvpassthrough.Unbind"
	BindMissing = "bind: an address no device has"
)

// missingAddress is a PCI address no profile's tree has: domain ffff is
// not one the profile format lets a device take a bus on.
const missingAddress = "ffff:ff:1f.7"

// Bind moves every GPU of m to driver (profile.DriverVFIO,
// profile.DriverNVIDIA, or "" for none) with go-nvlib's nvpassthrough, as
// the NVIDIA DRA driver's passthrough support does, and checks after each
// call what go-nvlib and deviceattribute see: the GPU on the driver, with
// its IOMMU group and, on vfio-pci, its iommufd device, and its pcieRoot
// unchanged. Each GPU's Driver in m says where it starts; the machine
// returned says where each ended. nvpassthrough writes to /sys/bus/pci
// itself, so Bind runs only where a writable tree (serve --writable) is
// mounted there, as its CDI spec mounts it; on a read-only tree every
// call fails with the error a read-only node gives.
//
// A bind of an address no device has is checked too: nvpassthrough
// refuses it before writing, and a plain write to the driver's bind file
// gets the kernel's ENODEV.
func Bind(m *profile.Machine, driver string) (*Report, *profile.Machine) {
	c := &checker{m: m, sysfs: KernelSysfs, report: &Report{Sysfs: KernelSysfs}}
	lib, _ := c.nvpci()
	c.bus.devs, c.bus.err = lib.GetAllDevices()
	pt := nvpassthrough.New()
	out := *m
	out.Devices = append([]profile.Device(nil), m.Devices...)
	for i := range out.Devices {
		if d := &out.Devices[i]; d.Kind == profile.GPU {
			c.moveGPU(pt, d, driver)
		}
	}
	c.bindMissing(pt, driver)
	return c.report, &out
}

// moveGPU makes the calls the DRA driver makes to move d to driver: a bound
// GPU is unbound first, since a driver's bind refuses a bound device.
func (c *checker) moveGPU(pt nvpassthrough.Interface, d *profile.Device, driver string) {
	if d.Driver == driver {
		return
	}
	bdf := d.Address.String()
	step := func(check, to string, call func() error) bool {
		if err := call(); err != nil {
			c.add(check, bdf, false, "%v", err)
			return false
		}
		d.Driver = to
		c.seen(check, *d)
		return true
	}
	switch driver {
	case profile.DriverVFIO:
		// BindToVFIODriver unbinds the GPU itself.
		step(BindVFIO, driver, func() error { return pt.BindToVFIODriver(bdf) })
	case "":
		step(UnbindCheck, "", func() error { return pt.Unbind(bdf) })
	default:
		if d.Driver != "" && !step(UnbindCheck, "", func() error { return pt.Unbind(bdf) }) {
			return
		}
		step(BindDriver, driver, func() error { return pt.BindToDriver(bdf, driver) })
	}
}

// seen adds check's row for d: what go-nvlib finds by its bus id (the
// driver, the IOMMU group, the iommufd device, as gpuDriver checks them)
// and its pcieRoot, after the call.
func (c *checker) seen(check string, d profile.Device) {
	bdf := d.Address.String()
	lib, _ := c.nvpci()
	g, err := lib.GetGPUByPciBusID(bdf)
	switch {
	case err != nil:
		c.add(check, bdf, false, "then go-nvlib: %v", err)
		return
	case g == nil:
		c.add(check, bdf, false, "then go-nvlib finds no GPU at %s", bdf)
		return
	}
	problems, summary := c.driverProblems(g, d)
	if p := c.pcieRoot(bdf, d.RootComplex.String()); p != "" {
		problems = append(problems, "pcieRoot: "+p)
	}
	if len(problems) > 0 {
		c.add(check, bdf, false, "then %s", strings.Join(problems, ", "))
		return
	}
	c.add(check, bdf, true, "then go-nvlib: %s; pcieRoot %s", summary, d.RootComplex)
}

// bindMissing binds an address no device has: nvpassthrough refuses it
// with its own error, and a write of it to the driver's bind file gets
// ENODEV, as on a real node.
func (c *checker) bindMissing(pt nvpassthrough.Interface, driver string) {
	driver = cmp.Or(driver, profile.DriverVFIO)
	var p []string
	lib, _ := c.nvpci()
	if _, err := lib.GetGPUByPciBusID(missingAddress); err == nil {
		p = append(p, "go-nvlib finds a GPU at "+missingAddress)
	}
	ptErr := pt.BindToDriver(missingAddress, driver)
	if ptErr == nil {
		p = append(p, "nvpassthrough.BindToDriver succeeded")
	}
	bind := path.Join(KernelSysfs, "bus/pci/drivers", driver, "bind")
	err := os.WriteFile(bind, []byte(missingAddress), 0)
	switch {
	case err == nil:
		p = append(p, "a write to "+bind+" succeeded")
	case !errors.Is(err, syscall.ENODEV):
		p = append(p, fmt.Sprintf("a write to %s: %v, want %v", bind, err, syscall.ENODEV))
	}
	if len(p) > 0 {
		c.add(BindMissing, missingAddress, false, "%s", strings.Join(p, "; "))
		return
	}
	c.add(BindMissing, missingAddress, true, "nvpassthrough: %v; %s: %v", ptErr, bind, err)
}

// driverProblems is what is wrong with the driver go-nvlib reads for g
// against d, and a summary when nothing is.
func (c *checker) driverProblems(g *nvpci.NvidiaPCIDevice, d profile.Device) ([]string, string) {
	var p []string
	if g.Driver != d.Driver {
		p = append(p, fmt.Sprintf("driver %q, want %q", g.Driver, d.Driver))
	}
	if g.IommuGroup < 0 {
		p = append(p, "no IOMMU group")
	}
	for _, o := range c.bus.devs {
		if o.Address != g.Address && o.IommuGroup == g.IommuGroup {
			p = append(p, fmt.Sprintf("IOMMU group %d shared with %s", g.IommuGroup, o.Address))
		}
	}
	switch {
	case d.Driver == profile.DriverVFIO && !sysfs.IsVFIODevName(g.IommuFD):
		p = append(p, fmt.Sprintf("iommufd device %q, want %s/%s", g.IommuFD, sysfs.VFIODevDir, sysfs.VFIODevName(0)))
	case d.Driver != profile.DriverVFIO && g.IommuFD != "":
		p = append(p, fmt.Sprintf("iommufd device %q on a GPU not bound to vfio-pci", g.IommuFD))
	}
	drv := g.Driver
	if drv == "" {
		drv = "no driver"
	}
	fd := ""
	if g.IommuFD != "" {
		fd = ", iommufd " + g.IommuFD
	}
	return p, fmt.Sprintf("%s, IOMMU group %d alone%s", drv, g.IommuGroup, fd)
}
