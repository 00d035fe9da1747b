package profile

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
)

// HCASpec is a normalised infiniband block: the HCAs each GPU that carries
// any gets (Carries).
type HCASpec struct {
	Type      string // hca_type as the table spells it: MT4129
	Name      string // ConnectX-7
	Device    uint16 // the PCI device id: the number in MT<n>
	LinkLayer string // LinkLayerInfiniBand or LinkLayerEthernet
	Class     uint32 // ClassInfiniBand or ClassEthernet, from the link layer
	PerGPU    int    // 1..MaxHCAsPerGPU
	Link      Link   // the adapter's own link
	// TotalVFs is each physical function's sriov_totalvfs; VFDevice is
	// their virtual functions' device id.
	TotalVFs int
	VFDevice uint16
	// GPUs are the indexes of the GPUs that carry HCAs, sorted; nil, every
	// GPU (infiniband.gpus unset). Never empty: a block that gives no GPU
	// an HCA normalises to no HCASpec at all.
	GPUs []int
}

// Carries reports whether the GPU of device index carries PerGPU HCAs (else
// none): the one place that answers it, for the planner and its checks.
func (s *HCASpec) Carries(index int) bool {
	if s == nil {
		return false
	}
	if s.GPUs == nil {
		return true
	}
	_, ok := slices.BinarySearch(s.GPUs, index)
	return ok
}

// Link layers, spelt as nvml-mock's profiles and the kernel's
// /sys/class/infiniband/*/ports/*/link_layer spell them.
const (
	LinkLayerInfiniBand = "InfiniBand"
	LinkLayerEthernet   = "Ethernet"
)

// MaxHCAsPerGPU bounds hcas_per_gpu: real boards carry one or two.
const MaxHCAsPerGPU = 8

// MaxTotalVFs bounds sriov_totalvfs: a ConnectX physical function offers
// at most 127 virtual functions (its firmware's NUM_OF_VFS), and the
// virtual functions' routing IDs must fit the function's bus.
const MaxTotalVFs = 127

// maxProductName bounds system.product_name: GFD labels it as
// nvidia.com/gpu.machine, and a label value holds at most 63 characters.
const maxProductName = 63

// machineExtras resolves what the machine carries beside its PCI devices:
// the infiniband block and the machine type.
func (n *normalizer) machineExtras(m *Machine) error {
	gpus := m.GPUs()
	hcas, err := n.hcas(gpus, len(m.Devices))
	if err != nil {
		return err
	}
	m.HCAs = hcas
	m.ProductName, m.ProductNameFrom, err = n.productName(gpus)
	if err != nil {
		return err
	}
	m.DriverVersion, err = n.driverVersion()
	return err
}

func (n *normalizer) hcas(gpus []Device, devices int) (*HCASpec, error) {
	ib := n.p.InfiniBand
	if ib == nil || !ib.Enabled || len(gpus) == 0 {
		return nil, nil
	}
	per := 1
	if ib.HCAsPerGPU != nil {
		per = *ib.HCAsPerGPU
		if per < 0 || per > MaxHCAsPerGPU {
			return nil, n.fail("infiniband.hcas_per_gpu", fmt.Sprint(per), "want 0..%d", MaxHCAsPerGPU)
		}
	}
	if per == 0 {
		return nil, nil
	}
	carriers, err := n.hcaGPUs(gpus)
	if err != nil {
		return nil, err
	}
	carrying := len(gpus)
	if carriers != nil {
		carrying = len(carriers)
	}
	if carrying == 0 {
		return nil, nil
	}
	if devices+per*carrying > MaxDevices {
		return nil, n.fail("infiniband.hcas_per_gpu", fmt.Sprint(per), "%d GPUs with %d HCAs each make more than %d devices in all", carrying, per, MaxDevices)
	}
	typ := ib.HCAType
	if typ == "" {
		typ = boards.DefaultHCA
		if b, ok := gpus[0].Board(); ok && b.HCA != "" {
			typ = b.HCA
		}
	}
	h, err := boards.LookupHCA(typ)
	if err != nil {
		return nil, n.fail("infiniband.hca_type", ib.HCAType, "%s", reason(err))
	}
	spec := &HCASpec{
		Type: h.Type, Name: h.Name, Device: h.Device, PerGPU: per,
		Link:     Link{MaxGen: h.LinkGen, CurrentGen: h.LinkGen, MaxWidth: h.LinkWidth, CurrentWidth: h.LinkWidth},
		VFDevice: h.VFDevice,
		GPUs:     carriers,
	}
	if ib.SRIOVTotalVFs != nil {
		spec.TotalVFs = *ib.SRIOVTotalVFs
		if spec.TotalVFs < 0 || spec.TotalVFs > MaxTotalVFs {
			return nil, n.fail("infiniband.sriov_totalvfs", fmt.Sprint(spec.TotalVFs), "want 0..%d", MaxTotalVFs)
		}
	}
	switch strings.ToLower(strings.TrimSpace(ib.LinkLayer)) {
	case "", "infiniband", "ib":
		spec.LinkLayer, spec.Class = LinkLayerInfiniBand, ClassInfiniBand
	case "ethernet", "eth", "roce":
		spec.LinkLayer, spec.Class = LinkLayerEthernet, ClassEthernet
	default:
		return nil, n.fail("infiniband.link_layer", ib.LinkLayer, "want InfiniBand or Ethernet")
	}
	return spec, nil
}

// hcaGPUs resolves infiniband.gpus: the indexes of the GPUs that carry
// HCAs, sorted; nil when unset (every GPU), empty when the list is. Each
// must be a GPU's devices[].index, listed once.
func (n *normalizer) hcaGPUs(gpus []Device) ([]int, error) {
	list := n.p.InfiniBand.GPUs
	if list == nil {
		return nil, nil
	}
	isGPU := map[int]bool{}
	for _, g := range gpus {
		isGPU[g.Index] = true
	}
	listedAt := map[int]int{}
	out := make([]int, 0, len(*list))
	for i, index := range *list {
		field := fmt.Sprintf("infiniband.gpus[%d]", i)
		if !isGPU[index] {
			return nil, n.fail(field, fmt.Sprint(index), "no GPU has devices[].index %d", index)
		}
		if other, dup := listedAt[index]; dup {
			return nil, n.fail(field, fmt.Sprint(index), "the same GPU as infiniband.gpus[%d]", other)
		}
		listedAt[index] = i
		out = append(out, index)
	}
	slices.Sort(out)
	return out, nil
}

// productName resolves the machine type and says where it came from: the
// profile's system.product_name always wins; else the machine the first
// GPU's board ships in, where it names one.
func (n *normalizer) productName(gpus []Device) (string, string, error) {
	name := strings.TrimSpace(n.p.System.ProductName)
	if name == "" {
		if len(gpus) == 0 {
			return "", "", nil
		}
		if b, ok := gpus[0].Board(); ok && b.Machine != "" {
			return b.Machine, ProductNameFromBoard, nil
		}
		return "", "", nil
	}
	if len(name) > maxProductName {
		return "", "", n.fail("system.product_name", name, "longer than %d bytes, the most a Kubernetes label value (nvidia.com/gpu.machine) holds", maxProductName)
	}
	if strings.ContainsFunc(name, unicode.IsControl) {
		return "", "", n.fail("system.product_name", name, "a control character: the machine type is one line of text")
	}
	return name, ProductNameFromProfile, nil
}

// maxDriverVersion bounds system.driver_version: a real one is a dozen
// bytes (550.163.01), and it is one line of /sys/module/nvidia/version.
const maxDriverVersion = 64

// driverVersion checks system.driver_version, which the module view
// writes as /sys/module/nvidia/version: one word, as the kernel prints a
// module's MODULE_VERSION and as nvml-mock's NVML reports it.
func (n *normalizer) driverVersion() (string, error) {
	v := n.p.System.DriverVersion
	if len(v) > maxDriverVersion {
		return "", n.fail("system.driver_version", v, "longer than %d bytes; want one version such as %s", maxDriverVersion, MockNVMLDriverVersion)
	}
	if !utf8.ValidString(v) || strings.ContainsFunc(v, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return "", n.fail("system.driver_version", v, "want one version such as %s, without spaces or control characters", MockNVMLDriverVersion)
	}
	return v, nil
}

// NVIDIAVersion is the NVIDIA driver a node with this profile runs: the
// profile's system.driver_version, else the version nvml-mock's NVML
// reports without one, so that /sys/module/nvidia/version and NVML agree.
func (m *Machine) NVIDIAVersion() string { return driverVersionOr(m.DriverVersion) }

// effectiveExtras writes the infiniband block and the machine type back,
// as Effective does the devices.
func (m *Machine) effectiveExtras(p *Profile) {
	if s := m.HCAs; s != nil {
		p.InfiniBand = &InfiniBand{Enabled: true, HCAType: s.Type, LinkLayer: s.LinkLayer, HCAsPerGPU: ptr(s.PerGPU)}
		if s.TotalVFs > 0 {
			p.InfiniBand.SRIOVTotalVFs = ptr(s.TotalVFs)
		}
		if s.GPUs != nil {
			p.InfiniBand.GPUs = ptr(slices.Clone(s.GPUs))
		}
	}
	// A board's machine follows from the devices written back.
	if m.ProductNameFrom == ProductNameFromProfile {
		p.System.ProductName = m.ProductName
	}
	// The version the module view renders: NVMLSystem's for a reader of
	// the struct or its YAML, EffectiveDriverVersion's in the JSON file.
	p.System.DriverVersion, p.System.EffectiveDriverVersion = m.DriverVersion, m.DriverVersion
}
