package profilefacts

import (
	"fmt"
	"maps"
	"slices"
)

// Where an expected fact comes from, as a row says it.
const (
	// FromProfile: the profile states it (system.product_name, a
	// pcie_topology root complex).
	FromProfile = "the profile's"
	// FromLiteral: the profile is silent and the renderer infers it (the
	// board's machine, a root per PCI domain); the suite judges it against
	// a literal written by hand for its own profile.
	FromLiteral = "our inference (the profile gives none), judged against the suite's literal"
)

// literal is what the renderer infers for one of the suites' own profiles
// where the profile is silent, written out by hand: the machine from the
// boards table of docs/reference/profiles.md (the names NVIDIA's
// documentation gives its systems), the roots from its rule "without
// pcie_topology, each PCI domain's devices go under one root complex
// pciDDDD:00 with NUMA node 0". gpus is the NVML name of the GPUs it was
// written for, so that a literal never judges another profile of the
// same file name.
type literal struct {
	gpus, machine string
	roots         map[string]string // GPU bus id -> root complex
}

// literals are the suites' own profiles that leave a fact to the
// renderer, by name: a built-in's, or a profile file's without .yaml
// (nvml-mock's in ../shared, the repository's testdata/profiles, the
// standalone ConfigMap's nvml-mock-config). A PCIe board's (t4, t4-vm,
// graphics, hcas-on-some-roots) has no machine: the render writes none,
// and GFD labels the node's own.
func literals() map[string]literal {
	a100, h100, gb200 := "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3", "NVIDIA GB200"
	return map[string]literal{
		"t4":                 {gpus: "NVIDIA T4"},
		"t4-vm":              {gpus: "Tesla T4"},
		"graphics":           {gpus: "NVIDIA L40S"},
		"hcas-on-some-roots": {gpus: "NVIDIA H100 PCIe"},
		"dgx-a100":           {gpus: a100, machine: "DGX A100"},
		"a100":               {gpus: a100, machine: "DGX A100"},
		"hgx-h100":           {gpus: h100, machine: "DGX H100"},
		"h100":               {gpus: h100, machine: "DGX H100"},
		"vfio-passthrough":   {gpus: h100, machine: "DGX H100"},
		"nvml-mock-config":   {gpus: h100, machine: "DGX H100"},
		"gb200-tray":         {gpus: gb200, machine: "DGX GB200"},
		"gb200":              {gpus: gb200, machine: "DGX GB200"},
		"gb300-tray":         {gpus: "NVIDIA GB300 NVL", machine: "DGX GB300"},
		"vera-rubin-tray":    {gpus: "NVIDIA Graphics Device", machine: "Vera Rubin NVL72"},
		"b200-hgx": {gpus: "NVIDIA B200", machine: "DGX B200", roots: map[string]string{
			"0000:1b:00.0": "pci0000:00", "0000:43:00.0": "pci0000:00", "0000:9b:00.0": "pci0000:00", "0000:c3:00.0": "pci0000:00"}},
	}
}

// Literal fills in, for one of the suites' own profiles (name: as
// literals keys it), the facts it leaves to the renderer: the machine
// where it names none (none, for a PCIe board's), the root of each GPU no
// pcie_topology places; and says so in MachineFrom and RootFrom. Any
// other profile keeps them unknown (MachineFrom and RootFrom empty). A literal written for other GPUs than the profile's,
// or for other bus ids, is refused: it would judge the wrong profile.
func (p *Profile) Literal(name string) error {
	l, ok := literals()[name]
	if !ok {
		return nil
	}
	if names := p.Names(); !slices.Equal(names, []string{l.gpus}) {
		return fmt.Errorf("profile %s: the suites' literal for %q was written for %s GPUs, the profile has %q", p.File, name, l.gpus, names)
	}
	if p.MachineFrom == "" {
		p.Machine, p.MachineFrom = l.machine, FromLiteral
	}
	placed := map[string]bool{}
	for i, g := range p.GPUs {
		if g.RootGiven() {
			continue
		}
		root, ok := l.roots[g.BusID]
		if !ok {
			continue
		}
		p.GPUs[i].Root, p.GPUs[i].RootFrom, p.GPUs[i].NUMANode, p.GPUs[i].NUMAGiven = root, FromLiteral, 0, true
		placed[g.BusID] = true
	}
	if len(placed) != len(l.roots) {
		return fmt.Errorf("profile %s: the suites' literal for %q places %v, the profile leaves unplaced only %v", p.File, name, slices.Sorted(maps.Keys(l.roots)), slices.Sorted(maps.Keys(placed)))
	}
	return nil
}
