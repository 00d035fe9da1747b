// Package profile reads the nvml-mock profile YAML that users already have
// and turns it into a Machine: the normalised, validated description of the
// PCI devices to render.
//
// The split follows the CDI library: schema.go holds the data types of the
// file, load.go the I/O and YAML decoding, normalize.go the validation that
// names the file, field and value of every refusal.
package profile

import (
	"fmt"
	"strconv"

	"gopkg.in/yaml.v3"
)

// Profile is the part of an nvml-mock profile that shapes PCI sysfs. Every
// other field of the file is ignored.
type Profile struct {
	Version        string         `yaml:"version,omitempty" json:"version,omitempty,omitzero"`
	System         SystemConfig   `yaml:"system,omitempty" json:"system,omitempty,omitzero"`
	DeviceDefaults DeviceConfig   `yaml:"device_defaults,omitempty" json:"device_defaults,omitempty,omitzero"`
	Devices        []DeviceConfig `yaml:"devices,omitempty" json:"devices,omitempty,omitzero"`
	NVLink         *NVLink        `yaml:"nvlink,omitempty" json:"nvlink,omitempty,omitzero"`
	PCIeTopology   *PCIeTopology  `yaml:"pcie_topology,omitempty" json:"pcie_topology,omitempty,omitzero"`
	InfiniBand     *InfiniBand    `yaml:"infiniband,omitempty" json:"infiniband,omitempty,omitzero"`

	// Unknown holds, from Parse, one error per key that nvml-mock's schema
	// does not know (see known_keys.go): warnings, or refusals with --strict.
	Unknown []*Error `yaml:"-" json:"-"`
}

// SystemConfig is the system block; only the device count matters here.
type SystemConfig struct {
	// NumDevices, as in nvml-mock, brings devices into being beyond those
	// devices[] lists: they take device_defaults.
	NumDevices *int `yaml:"num_devices,omitempty" json:"num_devices,omitempty,omitzero"`
	// ProductName is this tool's extension: the machine type rendered at
	// <overlay>/dmi/product_name for GPU Feature Discovery's
	// --machine-type-file. Without it, the GPU board's machine is used.
	ProductName string `yaml:"product_name,omitempty" json:"product_name,omitempty,omitzero"`
	// NVMLSystem is what NVML reads. The render uses driver_version alone
	// (the module view's /sys/module/nvidia/version), and the effective
	// profile keeps only that (EffectiveDriverVersion). The built-ins state
	// it, so that nvml-mock's NVML serves them as they are.
	NVMLSystem `yaml:",inline" json:"-"`
	// EffectiveDriverVersion writes driver_version into the effective
	// profile (JSON, which Parse reads back into NVMLSystem as YAML): the
	// module view's /sys/module/nvidia/version is rendered from it, so a
	// render that re-uses the effective profile keeps the version.
	EffectiveDriverVersion string `yaml:"-" json:"driver_version,omitempty"`
}

// DeviceConfig is one entry of devices[], or device_defaults. As in
// nvml-mock, devices[] entries override device_defaults for the device
// whose index they name.
type DeviceConfig struct {
	Index *int   `yaml:"index,omitempty" json:"index,omitempty,omitzero"`
	Name  string `yaml:"name,omitempty" json:"name,omitempty,omitzero"`
	// NVMLFacts is what NVML reads (uuid, minor number, brand,
	// architecture, compute capability, memory): the render reads only
	// the uuid and minor number (Device.UUID, Minor), and the effective
	// profile leaves it out but for those. The built-ins state it,
	// their boards' facts, so that NVML reports their boards and not
	// nvml-mock's A100 defaults.
	NVMLFacts `yaml:",inline" json:"-"`
	// EffectiveUUID and EffectiveMinorNumber write a GPU's uuid and
	// minor_number into the effective profile (JSON, which Parse reads
	// back into NVMLFacts as YAML) where IdentifyDevices would not give
	// the written-back entry the same: the driver's /proc files name the
	// GPU by them, so a render that re-uses the effective profile keeps
	// them. Left out where the rule gives them, as for every built-in.
	EffectiveUUID        string       `yaml:"-" json:"uuid,omitempty"`
	EffectiveMinorNumber *uint32      `yaml:"-" json:"minor_number,omitempty"`
	PCI                  PCIConfig    `yaml:"pci,omitempty" json:"pci,omitempty,omitzero"`
	PCIe                 PCIeConfig   `yaml:"pcie,omitempty" json:"pcie,omitempty,omitzero"`
	BAR1Memory           MemoryConfig `yaml:"bar1_memory,omitempty" json:"bar1_memory,omitempty,omitzero"`
}

// PCIConfig holds a device's PCI identity. DeviceID and SubsystemID are the
// packed words NVML reports: (device<<16)|vendor.
type PCIConfig struct {
	BusID       string `yaml:"bus_id,omitempty" json:"bus_id,omitempty,omitzero"`
	DeviceID    *Word  `yaml:"device_id,omitempty" json:"device_id,omitempty,omitzero"`
	SubsystemID *Word  `yaml:"subsystem_id,omitempty" json:"subsystem_id,omitempty,omitzero"`
	// Class is this tool's extension; the default is 0x030200 (3D controller).
	Class *Word `yaml:"class,omitempty" json:"class,omitempty,omitzero"`
	// Driver is this tool's extension: the driver the GPU is bound to,
	// DriverNVIDIA (the default) or DriverVFIO for a passthrough node.
	Driver string `yaml:"driver,omitempty" json:"driver,omitempty,omitzero"`
}

// PCIeConfig holds the link generation and width.
type PCIeConfig struct {
	MaxLinkGen       *int `yaml:"max_link_gen,omitempty" json:"max_link_gen,omitempty,omitzero"`
	CurrentLinkGen   *int `yaml:"current_link_gen,omitempty" json:"current_link_gen,omitempty,omitzero"`
	MaxLinkWidth     *int `yaml:"max_link_width,omitempty" json:"max_link_width,omitempty,omitzero"`
	CurrentLinkWidth *int `yaml:"current_link_width,omitempty" json:"current_link_width,omitempty,omitzero"`
}

// MemoryConfig is bar1_memory; only the total size matters to sysfs.
type MemoryConfig struct {
	TotalBytes *uint64 `yaml:"total_bytes,omitempty" json:"total_bytes,omitempty,omitzero"`
}

// NVLink is the nvlink block; its switches become NVSwitch PCI devices.
type NVLink struct {
	Switches []NVSwitchConfig `yaml:"switches,omitempty" json:"switches,omitempty,omitzero"`
}

// NVSwitchConfig is one nvlink.switches[] entry.
type NVSwitchConfig struct {
	BDF string `yaml:"bdf" json:"bdf"`
	// DeviceID is this tool's extension, packed like pci.device_id.
	DeviceID *Word `yaml:"device_id,omitempty" json:"device_id,omitempty,omitzero"`
	// Driver is this tool's extension: an NVSwitch keeps its own driver
	// (DriverNVSwitch); only a GPU can be bound to vfio-pci.
	Driver string `yaml:"driver,omitempty" json:"driver,omitempty,omitzero"`
}

// PCIeTopology places devices under root complexes.
type PCIeTopology struct {
	// Hierarchy is this tool's extension: flat, hgx or dgx.
	Hierarchy     string              `yaml:"hierarchy,omitempty" json:"hierarchy,omitempty,omitzero"`
	RootComplexes []RootComplexConfig `yaml:"root_complexes" json:"root_complexes"`
}

// RootComplexConfig is one pcie_topology.root_complexes[] entry.
type RootComplexConfig struct {
	ID       string   `yaml:"id" json:"id"`
	NUMANode *int     `yaml:"numa_node,omitempty" json:"numa_node,omitempty,omitzero"`
	Devices  []string `yaml:"devices" json:"devices"`
}

// InfiniBand is nvml-mock's infiniband block: the ConnectX HCAs beside each
// GPU. Only enabled, hca_type, link_layer and hcas_per_gpu (and this tool's
// sriov_totalvfs and gpus) shape PCI sysfs; the rest are listed so that they
// count as known keys, and are ignored.
type InfiniBand struct {
	Enabled    bool   `yaml:"enabled,omitempty" json:"enabled,omitempty,omitzero"`
	HCAType    string `yaml:"hca_type,omitempty" json:"hca_type,omitempty,omitzero"`
	LinkLayer  string `yaml:"link_layer,omitempty" json:"link_layer,omitempty,omitzero"`
	HCAsPerGPU *int   `yaml:"hcas_per_gpu,omitempty" json:"hcas_per_gpu,omitempty,omitzero"`
	// SRIOVTotalVFs is this tool's extension: the virtual functions each
	// HCA's physical function can have (its sriov_totalvfs). A writable
	// tree creates them on a write to sriov_numvfs; 0 or unset, none.
	SRIOVTotalVFs *int `yaml:"sriov_totalvfs,omitempty" json:"sriov_totalvfs,omitempty,omitzero"`
	// GPUs is this tool's extension: the devices[].index of the GPUs that
	// carry HCAs, as a PCIe server has NICs beside some GPUs only. A
	// pointer, so that unset (every GPU) and an empty list (none) stay
	// apart when the profile is written back.
	GPUs             *[]int `yaml:"gpus,omitempty" json:"gpus,omitempty,omitzero"`
	FWVersion        string `yaml:"fw_version,omitempty" json:"-"`
	HWRev            string `yaml:"hw_rev,omitempty" json:"-"`
	BoardID          string `yaml:"board_id,omitempty" json:"-"`
	RateGbps         *int   `yaml:"rate_gbps,omitempty" json:"-"`
	PortState        string `yaml:"port_state,omitempty" json:"-"`
	PhysState        string `yaml:"phys_state,omitempty" json:"-"`
	GUIDPrefix       string `yaml:"guid_prefix,omitempty" json:"-"`
	NodeDescTemplate string `yaml:"node_desc_template,omitempty" json:"-"`
}

// Word is a 32-bit value written as a YAML integer (0x20B010DE) or a string
// holding one ("0x20B010DE").
type Word uint32

// UnmarshalYAML accepts an integer scalar in any base YAML allows, or a string.
func (w *Word) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("want a 32-bit number, found a %s", kindName(n.Kind))
	}
	v, err := strconv.ParseUint(n.Value, 0, 32)
	if err != nil {
		return fmt.Errorf("want a 32-bit number such as 0x20B010DE")
	}
	*w = Word(v)
	return nil
}

// MarshalJSON writes the hex form as a string, which UnmarshalYAML reads
// back; the effective profile is JSON, itself valid YAML.
func (w Word) MarshalJSON() ([]byte, error) {
	return fmt.Appendf(nil, "\"0x%08X\"", uint32(w)), nil
}

// MarshalYAML writes the upper-case hex form nvml-mock profiles use.
func (w Word) MarshalYAML() (any, error) {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: fmt.Sprintf("0x%08X", uint32(w))}, nil
}

// Pack makes the NVML word (device<<16)|vendor.
func Pack(vendor, device uint16) *Word {
	w := Word(uint32(device)<<16 | uint32(vendor))
	return &w
}

// Unpack splits the NVML word into vendor and device.
func (w Word) Unpack() (vendor, device uint16) { return uint16(w), uint16(w >> 16) }

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "sequence"
	case yaml.AliasNode:
		return "alias"
	default:
		return "scalar"
	}
}
