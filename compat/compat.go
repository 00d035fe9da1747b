// Package compat runs the real consumer libraries against a rendered tree
// and compares every answer with the profile: deviceattribute (the NVIDIA
// DRA driver's pcieRoot and numaNode) and go-nvlib's nvpci (GPU Feature
// Discovery, the device plugin). It never re-implements their logic; where
// a library changes its rules, a row here turns red.
package compat

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvlib/pkg/nvpci"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/nvml-mock/nvml-mock-sysfs/compat/fidelity"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// KernelSysfs is where consumers read by default.
const KernelSysfs = sysfs.Mount

// Check names, as the matrix shows them: each is a consumer library's
// call (or a reference link check) asked of the rendered tree.
const (
	PCIeRoot        = "deviceattribute.pcieRoot"
	NUMAScalar      = "deviceattribute.numaNode"
	NUMAList        = "deviceattribute.numaNode(list)"
	AllDevices      = "nvpci.GetAllDevices"
	GPUs            = "nvpci.GetGPUs"
	GPUByBusID      = "nvpci.GetGPUByPciBusID"
	NVSwitches      = "nvpci.GetNVSwitches"
	BARMemory       = "nvpci.GetTotalAddressableMemory"
	GPUMode         = "gfd gpu.mode"
	GPUDriver       = "nvpci Driver, IommuGroup"
	Warnings        = "nvpci warnings"
	ReferencePlain  = "reference: plain escaped link"
	ReferenceAnchor = "reference: anchored link"
)

// Result is one check's answer for one device (or for the whole scan).
// Check is one of the check names above; its JSON key stays "consumer",
// which scripts reading --format json already use.
type Result struct {
	Check  string `json:"consumer"`
	Device string `json:"device"`
	OK     bool   `json:"ok"`
	// Detail is the evidence: what the library answered, or its own error.
	Detail string `json:"detail"`
}

// Report is the matrix for one sysfs location.
type Report struct {
	Sysfs   string   `json:"sysfs"`
	Results []Result `json:"results"`
}

// OK reports whether the report has rows and every one passed: a report
// of no row checked nothing (a run that stopped early, or a log that
// parsed as an empty report), so it is no pass, for verify's exit status
// or a suite that judges it.
func (r *Report) OK() bool {
	return len(r.Results) > 0 && !slices.ContainsFunc(r.Results, func(x Result) bool { return !x.OK })
}

// Failures returns the rows that failed.
func (r *Report) Failures() []Result {
	var out []Result
	for _, x := range r.Results {
		if !x.OK {
			out = append(out, x)
		}
	}
	return out
}

// FailedChecks names the checks (the Check of each failed row) that
// failed, each once, in report order.
func (r *Report) FailedChecks() []string {
	var out []string
	for _, x := range r.Failures() {
		if !slices.Contains(out, x.Check) {
			out = append(out, x.Check)
		}
	}
	return out
}

// Run checks a sysfs tree against the machine it should show. sysfs is
// "/sys" to read where consumers read by default, or <root>/sys for a tree
// on the host.
func Run(m *profile.Machine, sysfs string) *Report {
	c := &checker{m: m, sysfs: sysfs, report: &Report{Sysfs: sysfs}}
	c.deviceAttributes()
	c.nvpciScan()
	c.hcas()
	c.reference()
	return c.report
}

type checker struct {
	m      *profile.Machine
	sysfs  string
	report *Report
	// bus is go-nvlib's GetAllDevices answer, which the NVIDIA rows and the
	// HCA rows both check: one scan, as a consumer makes one. Each scan
	// parses pci.ids once per function, most of a run's time.
	bus struct {
		devs []*nvpci.NvidiaPCIDevice
		err  error
	}
}

func (c *checker) add(check, device string, ok bool, format string, args ...any) {
	c.report.Results = append(c.report.Results, Result{Check: check, Device: device, OK: ok, Detail: fmt.Sprintf(format, args...)})
}

// attrMods points deviceattribute at the tree; at /sys it runs with no
// options at all, exactly as the DRA driver does.
func (c *checker) attrMods() []deviceattribute.MachineModifier {
	if c.sysfs == KernelSysfs {
		return nil
	}
	return []deviceattribute.MachineModifier{deviceattribute.WithFSFromRoot(c.sysfs)}
}

func (c *checker) deviceAttributes() {
	for _, d := range c.m.Devices {
		bdf := d.Address.String()
		want := d.RootComplex.String()
		if p := c.pcieRoot(bdf, want); p != "" {
			c.add(PCIeRoot, bdf, false, "%s", p)
		} else {
			c.add(PCIeRoot, bdf, true, "%s", want)
		}
		for _, form := range []deviceattribute.AttributeForm{deviceattribute.ScalarAttribute, deviceattribute.ListAttribute} {
			name := NUMAScalar
			if form == deviceattribute.ListAttribute {
				name = NUMAList
			}
			attr, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(bdf, form, c.attrMods()...)
			c.numa(name, bdf, d.NUMANode, attr, err)
		}
	}
}

// pcieRoot is what is wrong with the pcieRoot deviceattribute gives bdf,
// against want: its error, or the root it gives; "" when it is want.
func (c *checker) pcieRoot(bdf, want string) string {
	attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(bdf, c.attrMods()...)
	switch {
	case err != nil:
		return err.Error()
	case attr.Value.StringValue == nil || *attr.Value.StringValue != want:
		return fmt.Sprintf("got %s, want %s", describe(attr), want)
	}
	return ""
}

func (c *checker) numa(name, bdf string, want int, attr deviceattribute.DeviceAttribute, err error) {
	if want < 0 {
		// numa_node -1: the attribute must not be published.
		if err != nil {
			c.add(name, bdf, true, "not published (numa_node=%d)", want)
		} else {
			c.add(name, bdf, false, "published %s for numa_node=%d", describe(attr), want)
		}
		return
	}
	if err != nil {
		c.add(name, bdf, false, "%v", err)
		return
	}
	v := attr.Value
	switch {
	case v.IntValue != nil && *v.IntValue == int64(want):
		c.add(name, bdf, true, "%d", want)
	case len(v.IntValues) > 0 && v.IntValues[0] == int64(want):
		c.add(name, bdf, true, "%v", v.IntValues)
	default:
		c.add(name, bdf, false, "got %s, want %d", describe(attr), want)
	}
}

func describe(a deviceattribute.DeviceAttribute) string {
	v := a.Value
	switch {
	case v.StringValue != nil:
		return *v.StringValue
	case v.IntValue != nil:
		return fmt.Sprint(*v.IntValue)
	case v.IntValues != nil:
		return fmt.Sprint(v.IntValues)
	}
	return "nothing"
}

// warnings collects go-nvlib's warnings instead of letting them reach the log.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Warningf(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, strings.TrimSpace(fmt.Sprintf(format, args...)))
}

func (c *checker) nvpci() (nvpci.Interface, *warnings) {
	w := &warnings{}
	opts := []nvpci.Option{nvpci.WithLogger(w)}
	if c.sysfs != KernelSysfs {
		opts = append(opts, nvpci.WithPCIDevicesRoot(c.sysfs+"/"+sysfs.LinksDir))
	}
	return nvpci.New(opts...), w
}

// nvpciScan runs go-nvlib's scans as GPU Feature Discovery and the device
// plugin do: the whole bus, the GPU and NVSwitch lists, then each GPU by
// its bus id; last, what the library logged on the way.
func (c *checker) nvpciScan() {
	lib, warn := c.nvpci()
	c.bus.devs, c.bus.err = lib.GetAllDevices()
	c.allDevices()
	c.setCheck(GPUs, profile.GPU, lib.GetGPUs)
	if hasKind(c.m, profile.NVSwitch) {
		c.setCheck(NVSwitches, profile.NVSwitch, lib.GetNVSwitches)
	}
	for _, d := range c.m.GPUs() {
		c.gpuByBusID(lib, d)
	}
	c.warnings(warn)
}

// allDevices checks GetAllDevices: every NVIDIA function the library finds
// must be one the profile declares, with its identity, and none missing;
// Mellanox functions are the host's.
func (c *checker) allDevices() {
	all, err := c.bus.devs, c.bus.err
	if err != nil {
		c.add(AllDevices, "*", false, "%v", err)
		return
	}
	want := map[string]profile.Device{}
	for _, d := range c.m.Devices {
		want[d.Address.String()] = d
	}
	var found, problems []string
	for _, d := range all {
		if d.Vendor != boards.VendorNVIDIA {
			continue
		}
		found = append(found, d.Address)
		exp, known := want[d.Address]
		if !known {
			problems = append(problems, d.Address+" is not in the profile")
			continue
		}
		if p := mismatch(d, exp); p != "" {
			problems = append(problems, d.Address+": "+p)
		}
	}
	if missing := missingFrom(found, keys(want)); len(missing) > 0 {
		problems = append(problems, "missing "+strings.Join(missing, ", "))
	}
	if len(problems) > 0 {
		c.add(AllDevices, "*", false, "%s", strings.Join(problems, "; "))
		return
	}
	c.add(AllDevices, "*", true, "%d NVIDIA functions, ids, class and numa_node as in the profile", len(found))
}

// gpuByBusID checks GetGPUByPciBusID for one GPU, and with its answer the
// BAR memory and GFD's gpu.mode.
func (c *checker) gpuByBusID(lib nvpci.Interface, d profile.Device) {
	bdf := d.Address.String()
	g, err := lib.GetGPUByPciBusID(bdf)
	switch {
	case err != nil:
		c.add(GPUByBusID, bdf, false, "%v", err)
		return
	case g == nil:
		c.add(GPUByBusID, bdf, false, "not a GPU to go-nvlib")
		return
	}
	if p := mismatch(g, d); p != "" {
		c.add(GPUByBusID, bdf, false, "%s", p)
	} else {
		c.add(GPUByBusID, bdf, true, "%04x:%04x class %06x, subsystem %04x:%04x", g.Vendor, g.Device, g.Class, g.SubsystemVendor, g.SubsystemDevice)
	}
	c.barMemory(g, d)
	c.gpuMode(g, d)
	c.gpuDriver(g, d)
}

// gpuDriver checks the driver go-nvlib reads through the GPU's driver
// link, as GFD's vfio strategy and kubevirt-gpu-device-plugin select on
// it, and the IOMMU group: one the GPU holds alone among the functions
// go-nvlib finds, as on a passthrough node with ACS. A vfio-pci GPU also
// has its iommufd device (vfio-dev/vfioN); an nvidia one has none.
func (c *checker) gpuDriver(g *nvpci.NvidiaPCIDevice, d profile.Device) {
	bdf := d.Address.String()
	if p, summary := c.driverProblems(g, d); len(p) > 0 {
		c.add(GPUDriver, bdf, false, "%s", strings.Join(p, ", "))
	} else {
		c.add(GPUDriver, bdf, true, "%s", summary)
	}
}

// warnings reports what go-nvlib logged. A real GPU node bound to nvidia
// (not vfio-pci) has no vfio-dev directory, and pci.ids may not name a new
// board, so those two warnings are what a real node logs too; any other
// warning means a file the library wanted is missing.
func (c *checker) warnings(w *warnings) {
	var benign, bad []string
	seen := map[string]bool{}
	for _, m := range w.msgs {
		if seen[m] {
			continue
		}
		seen[m] = true
		if strings.Contains(m, "unable to detect IOMMU FD") || strings.Contains(m, "unable to get device name") {
			benign = append(benign, m)
		} else {
			bad = append(bad, m)
		}
	}
	if len(bad) > 0 {
		c.add(Warnings, "*", false, "%s", strings.Join(bad, "; "))
		return
	}
	if len(benign) > 0 {
		c.add(Warnings, "*", true, "%d warnings a real node logs too (no vfio-dev, name not in pci.ids)", len(benign))
	}
}

func (c *checker) barMemory(g *nvpci.NvidiaPCIDevice, d profile.Device) {
	bdf := d.Address.String()
	got32, got64 := g.Resources.GetTotalAddressableMemory(false)
	want32, want64 := boards.BARTotals(d.Name, d.DeviceID, d.BAR1Bytes)
	if got32 != want32 || got64 != want64 {
		c.add(BARMemory, bdf, false, "32-bit %d, 64-bit %d; want %d and %d (BAR1 %d)", got32, got64, want32, want64, d.BAR1Bytes)
		return
	}
	c.add(BARMemory, bdf, true, "BAR1 %s, 64-bit total %s", fidelity.ByteSize(d.BAR1Bytes, fidelity.IEC), fidelity.ByteSize(got64, fidelity.IEC))
}

// gpuMode checks GPU Feature Discovery's input for nvidia.com/gpu.mode: it
// labels the class go-nvlib reads by GetGPUByPciBusID, 0x030200 compute and
// 0x030000 graphics, anything else unknown. GFD's labeler is internal to
// the device plugin, so its three-way rule is restated here.
func (c *checker) gpuMode(g *nvpci.NvidiaPCIDevice, d profile.Device) {
	bdf := d.Address.String()
	got, want := GFDMode(g.Class), GFDMode(d.Class)
	if got != want {
		c.add(GPUMode, bdf, false, "class 0x%06x -> %s, want %s (class 0x%06x)", g.Class, got, want, d.Class)
		return
	}
	c.add(GPUMode, bdf, true, "class 0x%06x -> %s", g.Class, got)
}

// GFDMode is the gpu.mode GPU Feature Discovery derives from a PCI class.
func GFDMode(class uint32) string {
	switch class {
	case profile.Class3DController:
		return "compute"
	case profile.ClassVGAController:
		return "graphics"
	}
	return "unknown"
}

// setCheck compares a go-nvlib list with the profile's devices of a kind.
func (c *checker) setCheck(name string, kind profile.DeviceKind, get func() ([]*nvpci.NvidiaPCIDevice, error)) {
	devs, err := get()
	if err != nil {
		c.add(name, "*", false, "%v", err)
		return
	}
	var got, want []string
	for _, d := range devs {
		got = append(got, d.Address)
	}
	for _, d := range c.m.Devices {
		if d.Kind == kind {
			want = append(want, d.Address.String())
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if slices.Equal(got, want) {
		c.add(name, "*", true, "exactly the profile's %d %s", len(want), kind.Plural())
		return
	}
	c.add(name, "*", false, "got %v, want %v", got, want)
}

func mismatch(d *nvpci.NvidiaPCIDevice, exp profile.Device) string {
	var p []string
	check := func(field string, got, want uint64) {
		if got != want {
			p = append(p, fmt.Sprintf("%s 0x%x, want 0x%x", field, got, want))
		}
	}
	check("vendor", uint64(d.Vendor), uint64(exp.Vendor))
	check("device", uint64(d.Device), uint64(exp.DeviceID))
	check("subsystem_vendor", uint64(d.SubsystemVendor), uint64(exp.SubsystemVendor))
	check("subsystem_device", uint64(d.SubsystemDevice), uint64(exp.SubsystemDevice))
	check("class", uint64(d.Class), uint64(exp.Class))
	if d.NumaNode != exp.NUMANode {
		p = append(p, fmt.Sprintf("numa_node %d, want %d", d.NumaNode, exp.NUMANode))
	}
	return strings.Join(p, ", ")
}

func hasKind(m *profile.Machine, k profile.DeviceKind) bool {
	return slices.ContainsFunc(m.Devices, func(d profile.Device) bool { return d.Kind == k })
}

// keys lists a map's keys in order.
func keys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

func missingFrom(found, want []string) []string {
	var out []string
	for _, w := range want {
		if !slices.Contains(found, w) {
			out = append(out, w)
		}
	}
	return out
}
