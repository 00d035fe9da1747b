package consumermatrix_test

// The checks of issue 15 in the real programs: the HCAs of a profile's
// infiniband block in nfd-worker's labels and ghw's listing, and the
// machine type GFD labels when served the CDI spec's variables.

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// GFD's labels that the tree changes.
const (
	gfdModeLabel    = "nvidia.com/gpu.mode"
	gfdMachineLabel = "nvidia.com/gpu.machine"
)

// gfdMachine checks nvidia.com/gpu.machine: the profile's machine type
// where GFD ran as a served pod does, with the CDI spec's variables and no
// flag (the tree row); the node's own without them, with no tree and with
// the tree served (the escaped row serves the same file), so the file is
// read only through the variable. The machine is system.product_name, else
// the suite's literal of its board's (our inference; none for a PCIe
// card's, whose render sets no variable: GFD labels the node's own). An
// extra profile that names none is not judged: the row says so.
func gfdMachine(t *testing.T, x *subject, gfd map[string]map[string]string, row func(string) *row) {
	t.Helper()
	// The node's own machine is what GFD labels without the variable: the
	// escaped run's (the run without a tree may exit, GFD v0.17.4 reading
	// each GPU's vendor from sysfs).
	node := gfd[servedEscaped][gfdMachineLabel]
	got := gfd[servedTree][gfdMachineLabel]
	if x.facts.MachineFrom == "" {
		row(servedTree).notRun(t, colGFDMachine, programs.NotRunPrefix+"gpu.machine "+got+" not judged: the profile names no machine (system.product_name), and no literal of the suite's gives its board's")
		return
	}
	want, from := node, "the node's: "+x.facts.MachineFrom+" is none"
	if x.facts.Machine != "" {
		want, from = programs.GFDMachineLabel(x.facts.Machine), x.facts.MachineFrom+" "+x.facts.Machine
	}
	if x.facts.MachineFrom == profilefacts.FromLiteral {
		got += " (" + profilefacts.FromLiteral + ")"
	}
	row(servedTree).check(t, colGFDMachine, got+" (spec's "+cdispec.MachineTypeFileEnv+", no flag)", gfd[servedTree][gfdMachineLabel] == want,
		fmt.Sprintf("want %q, %s as GFD labels it", want, from))
	row(servedEscaped).check(t, colGFDMachine, node+" (tree served, no variable: the node's)", node != "" && (x.facts.Machine == "" || node != want),
		fmt.Sprintf("want the node's own machine without the variable, got %q, the profile's %q: the check cannot fail", node, want))
}

// operatorNFD is nfd-worker's PCI source as the GPU Operator's chart
// configures it (the Network Operator's is alike): network and display
// classes, labels named by vendor only, so a node with ConnectX adapters
// gets feature.node.kubernetes.io/pci-15b3.present.
func operatorNFD() programs.NFDWorkerRun {
	return programs.NFDWorkerRun{
		DeviceClassWhitelist: []string{"02", "0200", "0207", "0300", "0302"},
		DeviceLabelFields:    []string{"vendor"},
	}
}

// nfdLabel is nfd-worker's PCI label named by what (vendor, or
// class_vendor).
func nfdLabel(what string) string { return "feature.node.kubernetes.io/pci-" + what + ".present" }

// nfdClassLabel is nfd-worker's label of a class and vendor with its
// default label fields: pci-0302_10de.
func nfdClassLabel(class uint32, vendor uint16) string {
	return nfdLabel(fmt.Sprintf("%04x_%04x", class>>8, vendor))
}

// hcaClassLabels are the class labels nfd-worker gives the HCAs with 0200
// and 0207 whitelisted.
func hcaClassLabels(hcas []plan.HCA) map[string]string {
	labels := map[string]string{}
	for _, h := range hcas {
		labels[nfdClassLabel(h.Node.Device.Class, boards.VendorMellanox)] = "true"
	}
	return labels
}

// anyHCAClassLabel are the class labels of HCAs in either link layer.
func anyHCAClassLabel() map[string]string {
	return map[string]string{
		nfdClassLabel(profile.ClassEthernet, boards.VendorMellanox):   "true",
		nfdClassLabel(profile.ClassInfiniBand, boards.VendorMellanox): "true",
	}
}

// labelList is labelNames followed by ", ", or "" for no labels.
func labelList(labels map[string]string) string {
	if len(labels) == 0 {
		return ""
	}
	return labelNames(labels) + ", "
}

// nfdVendorLabels runs nfd-worker with the operators' config on the tree
// of a profile with HCAs: exactly pci-10de and pci-15b3; the node without
// the tree has neither. A profile without HCAs is not run this way (the
// whitelisted run already shows it has no HCA class label).
func (s *suite) nfdVendorLabels(t *testing.T, x *subject, tree string, row func(string) *row) {
	t.Helper()
	if len(x.hcas) == 0 {
		return
	}
	want := map[string]string{
		nfdLabel(fmt.Sprintf("%04x", boards.VendorNVIDIA)):   "true",
		nfdLabel(fmt.Sprintf("%04x", boards.VendorMellanox)): "true",
	}
	got := s.runNFD(t, nfdServed(tree), operatorNFD())
	row(servedTree).check(t, colNFDVendor, labelNames(got), maps.Equal(got, want), "want exactly "+labelNames(want))
	node := s.nodeNFDVendorLabels
	row(servedNone).check(t, colNFDVendor, labelNames(node), !hasAny(node, want), "the node's own labels include the tree's "+labelNames(want))
}

// findHCAs counts the profile's HCAs among what ghw listed with their ids,
// class, driver and the parent the plan gave them, and, for a parent that
// is a switch downstream port, whether ghw puts that port under the same
// upstream port as the GPU's.
func (f *ghwFound) findHCAs(hcas []plan.HCA, byAddr map[string]programs.GHWDevice) {
	for _, h := range hcas {
		addr, dev := h.Node.Address.String(), h.Node.Device
		d, ok := byAddr[addr]
		if !ok {
			f.problems = append(f.problems, "HCA "+addr+" not listed")
			continue
		}
		got := fmt.Sprintf("%s:%s class %s%s driver %s parent %s", d.Vendor, d.Product, d.Class, d.Subclass, d.Driver, d.ParentAddress)
		want := fmt.Sprintf("%04x:%04x class %04x driver %s parent %s", dev.Vendor, dev.DeviceID, dev.Class>>8, "mlx5_core", h.Node.Parent.Address)
		if got != want {
			f.problems = append(f.problems, fmt.Sprintf("HCA %s: %s, want %s", addr, got, want))
			continue
		}
		if h.Node.Parent.Role == plan.SwitchDown {
			gpuPort := byAddr[h.GPU.Address.String()].ParentAddress
			if up, gpuUp := byAddr[d.ParentAddress].ParentAddress, byAddr[gpuPort].ParentAddress; up == "" || up != gpuUp {
				f.problems = append(f.problems, fmt.Sprintf("HCA %s: its port %s is under %q, its GPU %s's port %s under %q", addr, d.ParentAddress, up, h.GPU.Address, gpuPort, gpuUp))
				continue
			}
			f.underSwitch++
		}
		f.hcas++
	}
}

// hcaText says how many HCAs ghw listed as planned, for profiles with any.
func (f *ghwFound) hcaText(hcas []plan.HCA) string {
	if len(hcas) == 0 {
		return ""
	}
	var where []string
	if f.underSwitch > 0 {
		where = append(where, fmt.Sprintf("%d under their GPU's switch", f.underSwitch))
	}
	if own := f.hcas - f.underSwitch; own > 0 {
		where = append(where, fmt.Sprintf("%d on a root port of their own", own))
	}
	text := fmt.Sprintf("HCAs %d/%d", f.hcas, len(hcas))
	if len(where) > 0 {
		text += " (" + strings.Join(where, ", ") + ")"
	}
	return text + ", "
}
