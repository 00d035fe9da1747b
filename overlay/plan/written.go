package plan

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// WrittenState is what writes to a writable tree changed since the render, by
// function address. A function it names shows exactly that state; every
// other function shows the profile's. The zero value is the profile's tree.
// Deciding what a write does is the writable package's job: a plan only
// renders a state, so that a restart, a re-render and a write all go
// through the same planner and the same writer.
type WrittenState map[pciaddr.Address]FunctionState

// FunctionState is one function's writable state.
type FunctionState struct {
	// Driver is the driver the function is bound to; "" is unbound.
	Driver string `json:"driver,omitempty"`
	// Override is its driver_override; "" shows "(null)".
	Override string `json:"driver_override,omitempty"`
	// VFIODev is N of vfio-dev/vfioN while Driver is vfio-pci: the kernel
	// numbers a device when it binds, lowest free number first, and keeps it.
	VFIODev int `json:"vfio_dev,omitempty"`
	// NumVFs is a physical function's enabled virtual functions.
	NumVFs int `json:"sriov_numvfs,omitempty"`
	// ID is the function's Function.ID when the state was given to it: a
	// profile that puts another device at the address drops the state.
	ID string `json:"id,omitempty"`
}

// Function is what a planned function shows: the facts a write to a
// writable tree is judged by.
type Function struct {
	Address pciaddr.Address
	Dir     string // its directory, relative to the overlay root
	ID      string // vendor:device, "10de:2330"
	// Native is the driver whose id table claims the function: where
	// drivers_probe binds it when no driver_override says otherwise.
	Native string
	// State is the writable state it shows: the written state's, else the
	// profile's.
	State FunctionState
	// TotalVFs is an SR-IOV physical function's sriov_totalvfs; VFs are
	// the addresses all TotalVFs of its virtual functions would take.
	TotalVFs int
	VFs      []pciaddr.Address
}

// MockDrivers are the drivers a writable tree always lists, bound to
// devices or not, since binding names a driver's directory: the GPU's own
// and vfio-pci, the NVSwitch's, and the HCA's. DriverPCIePort is listed
// too where the tree has bridges; IsMockDriver says whether a driver is
// one of them all.
func MockDrivers() []string {
	return []string{profile.DriverNVIDIA, profile.DriverVFIO, profile.DriverNVSwitch, profile.DriverMLX5}
}

// IsMockDriver reports whether driver is one of the tree's own drivers,
// whose bind and unbind a writable tree answers: the mock drivers and the
// bridges' DriverPCIePort, never a driver of the node.
func IsMockDriver(driver string) bool {
	return slices.Contains(MockDrivers(), driver) || driver == DriverPCIePort
}

// Paths of a writable tree.
const (
	// DriversDir holds a directory per driver; a writable tree's is
	// mounted at /sys/bus/pci/drivers.
	DriversDir = "sys/bus/pci/drivers"
	// DriversProbe binds an unbound device to the driver that claims it.
	DriversProbe = "sys/bus/pci/drivers_probe"
	// HostSysDir is where a writable tree's consumers mount the node's own
	// /sys/bus/pci/drivers and /sys/devices (as HostSysDir/bus/pci/drivers
	// and HostSysDir/devices), so that the node's drivers, linked from
	// DriversDir, resolve as the kernel's do.
	HostSysDir = "host-sys"
	// ModulesAlias stands in for the node's
	// /lib/modules/<release>/modules.alias, which go-nvlib's
	// FindBestVFIOVariant and the NVIDIA DRA driver read before they bind a
	// GPU to vfio-pci, and fail without. It holds the line every kernel
	// with vfio-pci has (its match-all entry for driver_override, since
	// Linux 5.16), so the module is named vfio_pci as on a real node; a
	// node of mock GPUs has no vfio_pci variant driver for them.
	ModulesAlias = "lib/modules.alias"
	// VFIOPCIAlias is that line: vfio_pci's match-all entry, as a kernel
	// built with vfio-pci as a module lists it in modules.alias.
	VFIOPCIAlias = "alias vfio_pci:v*d*sv*sd*bc*sc*i* vfio_pci"
)

// driverControlFiles are a driver directory's files: the kernel's,
// write-only.
func driverControlFiles() []string {
	return []string{"bind", "unbind", "new_id", "remove_id", "uevent"}
}

// SR-IOV layout of a ConnectX physical function with one port: its first
// virtual function is the next routing ID, the rest follow one by one.
const (
	vfOffset = 1
	vfStride = 1
)

// VFAddress is the address of pf's i-th virtual function, from its
// routing ID as the kernel computes it (pci_iov_virtfn_bus, _devfn); false
// when it would leave pf's bus, which the planner does not give a VF.
func VFAddress(pf pciaddr.Address, i int) (pciaddr.Address, bool) {
	rid := int(pf.Bus)<<8 | int(pf.DevFn())
	rid += vfOffset + vfStride*i
	if rid>>8 != int(pf.Bus) {
		return pciaddr.Address{}, false
	}
	devfn := uint8(rid & 0xff)
	return pciaddr.Address{Domain: pf.Domain, Bus: pf.Bus, Device: devfn >> 3, Function: devfn & 7}, true
}

// addVFs gives each SR-IOV physical function its enabled virtual functions,
// as siblings of it, as the kernel adds them. Every other function keeps
// the position it had without them, so that IOMMU groups, IRQs and slots
// do not renumber when VFs come and go; VFs take the numbers after.
func addVFs(t *Tree, m *profile.Machine, ws WrittenState) error {
	if m.HCAs == nil || m.HCAs.TotalVFs == 0 {
		return nil
	}
	used := map[pciaddr.Address]bool{}
	for _, n := range t.Nodes() {
		used[n.Address] = true
	}
	base := len(t.Nodes())
	var vfs []*Node
	for _, h := range t.HCAs {
		pf := h.Node
		pf.TotalVFs = m.HCAs.TotalVFs
		for i := range pf.TotalVFs {
			a, ok := VFAddress(pf.Address, i)
			if !ok {
				return fmt.Errorf("HCA %s: virtual function %d would leave its bus; lower infiniband.sriov_totalvfs", pf.Address, i)
			}
			pf.vfAddresses = append(pf.vfAddresses, a)
		}
		num := ws[pf.Address].NumVFs
		if num > pf.TotalVFs {
			return fmt.Errorf("HCA %s: %d virtual functions enabled, but sriov_totalvfs is %d", pf.Address, num, pf.TotalVFs)
		}
		if num > 0 && pf.Parent == nil {
			return fmt.Errorf("HCA %s: virtual functions of a function on a root bus are not planned", pf.Address)
		}
		for i := range num {
			a := pf.vfAddresses[i]
			if used[a] {
				return fmt.Errorf("HCA %s: virtual function %d would take %s, which another function has", pf.Address, i, a)
			}
			used[a] = true
			d := *pf.Device
			d.Address, d.DeviceID, d.Index = a, m.HCAs.VFDevice, -1
			vf := endpointNode(&d, pf.Parent)
			vf.Identity.Device = m.HCAs.VFDevice
			vf.Anchor, vf.PhysFn = pf.Anchor, pf
			pf.Parent.Children = append(pf.Parent.Children, vf)
			pf.VFs = append(pf.VFs, vf)
			vfs = append(vfs, vf)
		}
	}
	if len(vfs) == 0 {
		return nil
	}
	ordinals := make(map[*Node]int, base)
	for _, n := range t.Nodes() {
		ordinals[n] = n.ordinal
	}
	t.index()
	for _, n := range t.Nodes() {
		if o, ok := ordinals[n]; ok {
			n.ordinal = o
		}
	}
	for i, vf := range vfs {
		vf.ordinal = base + i
	}
	return nil
}

// nativeDriver is the driver whose id table claims n: the GPU's is nvidia
// even where the profile binds it to vfio-pci, whose id table is empty
// (it binds through driver_override alone).
func nativeDriver(n *Node) string {
	if n.Role == Endpoint && n.Device.Kind == profile.GPU {
		return profile.DriverNVIDIA
	}
	return driverOf(n)
}

// sriovFiles adds a physical function's SR-IOV attributes and virtfnN links
// (drivers/pci/iov.c), and a virtual function's physfn link.
func (b *builder) sriovFiles(n *Node, dir string, numVFs int) {
	if n.PhysFn != nil {
		b.inTree = append(b.inTree, link(dir+"/physfn", "../"+n.PhysFn.Address.String()))
		return
	}
	if n.TotalVFs == 0 {
		return
	}
	b.decimal(dir, "sriov_totalvfs", n.TotalVFs)
	b.decimal(dir, "sriov_numvfs", numVFs)
	b.decimal(dir, "sriov_offset", vfOffset)
	b.decimal(dir, "sriov_stride", vfStride)
	b.text(dir, "sriov_vf_device", strconv.FormatUint(uint64(b.vfDevice()), 16)+"\n")
	b.text(dir, "sriov_drivers_autoprobe", "1\n")
	b.decimal(dir, "sriov_vf_total_msix", 0)
	for i, vf := range n.VFs {
		b.inTree = append(b.inTree, link(dir+"/virtfn"+strconv.Itoa(i), "../"+vf.Address.String()))
	}
}

func (b *builder) vfDevice() uint16 {
	if b.machine.HCAs == nil {
		return 0
	}
	return b.machine.HCAs.VFDevice
}

// writableFiles adds what a writable tree has beyond the rendered one:
// every mock driver's directory with its control files, whether a device
// is bound to it or not (mlx5_core's only where the tree has HCAs); the bus's drivers_probe and drivers_autoprobe;
// and a link to each of the node's own drivers, beside the mock ones.
func (b *builder) writableFiles(bridges bool) {
	drivers := MockDrivers()
	if len(b.tree.HCAs) == 0 {
		// A node without ConnectX adapters has no mlx5_core loaded, so no
		// such driver: the module view follows the drivers listed.
		drivers = slices.DeleteFunc(drivers, func(d string) bool { return d == profile.DriverMLX5 })
	}
	if bridges {
		drivers = append(drivers, DriverPCIePort)
	}
	for _, d := range drivers {
		dir := DriversDir + "/" + d
		b.dir(dir)
		for _, f := range driverControlFiles() {
			b.fileMode(dir+"/"+f, nil, 0o200)
		}
	}
	b.fileMode(DriversProbe, nil, 0o200)
	b.text("lib", "modules.alias", "# nvml-mock-sysfs: a stand-in for the node's modules.alias. It lists what a\n# kernel with vfio-pci lists, vfio_pci's driver_override match-all line, and\n# no variant driver: go-nvlib binds every GPU to vfio-pci.\n"+VFIOPCIAlias+"\n")
	b.text("sys/bus/pci", "drivers_autoprobe", "1\n")
	b.dir(HostSysDir + "/bus/pci/drivers")
	b.dir(HostSysDir + "/devices")
	for _, d := range b.opts.HostDrivers {
		if slices.Contains(drivers, d) {
			continue // the mock driver of that name is the one devices bind to
		}
		b.inTree = append(b.inTree, link(DriversDir+"/"+d, b.fromContainerRoot(DriversDir, HostSysDir+"/bus/pci/drivers/"+d)))
	}
}

// driverLinkTarget is the text of a driver directory's link to a device.
// A writable tree's drivers directory is also mounted at
// /sys/bus/pci/drivers, one level below the links directory, so its links
// escape to the container root as the links directory's bridges do; the
// rendered tree keeps the kernel's plain form, which resolves in the
// overlay alone.
func (b *builder) driverLinkTarget(ddir string, n *Node) string {
	if !b.opts.Writable {
		return upToSys(ddir) + n.SysPath()
	}
	return b.fromContainerRoot(ddir, "sys/"+n.SysPath())
}
