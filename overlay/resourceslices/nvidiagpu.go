package resourceslices

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// NVIDIAGPUDriver is the NVIDIA DRA driver's name for its GPUs.
const NVIDIAGPUDriver = "gpu.nvidia.com"

// NVIDIAGPUVersion names the NVIDIA DRA driver NVIDIAGPU predicts, which
// publishes numaNode on every GPU with a NUMA node. The May 2026 driver
// (22407113) published the same slices without numaNode; a selector that
// does not test numaNode sees no difference, so no flag keeps that form.
const NVIDIAGPUVersion = "sigs.k8s.io/dra-driver-nvidia-gpu at its August 2026 head (95932046, chart 0.5.0-dev)"

// architectures maps a profile's architecture to what the driver
// publishes: nvml-mock's parseArchitecture (lower case only, anything else
// DEVICE_ARCH_UNKNOWN) then go-nvlib's GetArchitectureAsString.
var architectures = map[string]string{
	"kepler": "Kepler", "maxwell": "Maxwell", "pascal": "Pascal", "volta": "Volta",
	"turing": "Turing", "ampere": "Ampere", "ada": "Ada Lovelace", "ada_lovelace": "Ada Lovelace",
	"hopper": "Hopper", "blackwell": "Blackwell",
}

// brands maps a profile's brand likewise: nvml-mock's parseBrand then
// go-nvlib's GetBrandAsString.
var brands = map[string]string{
	"nvidia": "Nvidia", "tesla": "Tesla", "quadro": "Quadro", "geforce": "GeForce",
	"titan": "Titan", "nvidia_rtx": "NvidiaRTX",
}

// NVIDIAGPU is the NVIDIA DRA driver (gpu.nvidia.com), as its
// gpu-kubelet-plugin (sigs.k8s.io/dra-driver-nvidia-gpu) publishes its
// slices with nvml-mock's NVML reading the profile.
//
// Where its values come from, as the NVIDIA driver reads them:
//
//   - which GPUs, and their order, bus ids and identities: NVML's, as
//     profile.NVMLGPUs models nvml-mock's engine (at most
//     profile.NVMLMaxDevices); GPUs bound to vfio-pci are not listed, as a
//     passthrough node's NVML lists none of them;
//   - uuid, minor number, name, brand, architecture, compute capability,
//     memory, driver and CUDA versions: the profile's NVML-only fields
//     (profile.NVMLFields), with nvml-mock's defaults (go-nvml's dgxa100
//     mock, an A100-SXM4-40GB) where the profile gives none, which
//     Profile.MockDefaults names;
//   - pcieRoot: the root complex the plan puts the GPU under, the first
//     element of its directory under sys/devices that the link
//     /sys/bus/pci/devices/<bus id> leads to, which is what the driver's
//     deviceattribute reads (compat's PCIeRoot row checks that it does);
//   - resource.kubernetes.io/numaNode: the NUMA node of the GPU's root
//     complex, which the driver reads from the GPU's numa_node in the
//     tree (go-nvlib's nvpci), none where it is -1.
//
// The NVIDIA driver's own choices: a device is gpu-<minor number>; one
// pool named for the node, generation 1, of one slice; version
// attributes are semantic versions (550.163.01 is 550.163.1); numaNode is
// a scalar, its default (under its DRAListTypeAttributes gate, off by
// default, a one-element list). NVIDIAGPUVersion names the driver this
// predicts.
type NVIDIAGPU struct{}

// Name is the driver's name for its GPUs.
func (NVIDIAGPU) Name() string { return NVIDIAGPUDriver }

// Slices are the ResourceSlices the NVIDIA DRA driver publishes on node
// for p: one slice (nodeSlices) holding a device per GPU NVML lists,
// ordered by name (the driver's order is a Go map's). A profile whose
// every GPU is bound to vfio-pci gives none.
func (NVIDIAGPU) Slices(p *Profile, node string) ([]resourcev1.ResourceSlice, error) {
	source, nv := p.Source, p.NVML
	system, err := systemAttributes(source, nv)
	if err != nil {
		return nil, err
	}
	rendered := map[pciaddr.Address]profile.Device{}
	for _, g := range p.Machine.GPUs() {
		rendered[g.Address] = g
	}
	var devices []resourcev1.Device
	for _, g := range p.NVMLGPUs {
		r, ok := rendered[g.Address]
		if !ok {
			return nil, fmt.Errorf("profile %s: NVML lists GPU %d at %s, which the plan does not render", source, g.Index, g.Address)
		}
		if r.Driver == profile.DriverVFIO {
			continue
		}
		d, err := gpuDevice(source, nv, g, r, system)
		if err != nil {
			return nil, err
		}
		devices = append(devices, d)
	}
	slices.SortFunc(devices, func(a, b resourcev1.Device) int { return cmp.Compare(minorOf(a.Name), minorOf(b.Name)) })
	return nodeSlices(NVIDIAGPUDriver, node, devices), nil
}

// systemAttributes are the attributes every GPU shares: the driver's and
// CUDA's versions.
func systemAttributes(source string, nv *profile.NVMLFields) (map[resourcev1.QualifiedName]resourcev1.DeviceAttribute, error) {
	driver, ok := semver(nv.DriverVersion())
	if !ok {
		return nil, &profile.Error{Source: source, Field: "system.driver_version", Value: nv.DriverVersion(),
			Err: fmt.Errorf("want a version such as 550.163.01: the DRA driver cannot parse it")}
	}
	cuda, err := nv.CUDAVersion(source)
	if err != nil {
		return nil, err
	}
	return map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
		"driverVersion": {VersionValue: &driver},
		// The driver prints NVML's 1000*major+10*minor as major.minor.
		"cudaDriverVersion": {VersionValue: new(fmt.Sprintf("%d.%d.0", cuda/1000, cuda%1000/10))},
	}, nil
}

// gpuDevice is the device the driver publishes for NVML's GPU g, rendered
// as r.
func gpuDevice(source string, nv *profile.NVMLFields, g profile.NVMLGPU, r profile.Device, system map[resourcev1.QualifiedName]resourcev1.DeviceAttribute) (resourcev1.Device, error) {
	own, pos, _ := nv.Device(g.Index)
	def := nv.DeviceDefaults
	if mode := cmp.Or(own.MIG.ModeCurrent, def.MIG.ModeCurrent); mode == "enabled" {
		field := "device_defaults.mig.mode_current"
		if own.MIG.ModeCurrent != "" {
			field = fmt.Sprintf("devices[%d].mig.mode_current", pos)
		}
		return resourcev1.Device{}, &profile.Error{Source: source, Field: field, Value: mode,
			Err: fmt.Errorf("the DRA driver publishes MIG devices for it, which this tool does not plan: want disabled")}
	}
	busID, err := deviceattribute.GetPCIBusIDAttribute(r.Address.String())
	if err != nil {
		return resourcev1.Device{}, fmt.Errorf("profile %s: GPU %d: %w", source, g.Index, err)
	}
	attrs := map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
		"type":                  {StringValue: new("gpu")},
		"uuid":                  {StringValue: new(own.UUID)},
		"productName":           {StringValue: new(cmp.Or(own.Name, def.Name, profile.MockNVMLName))},
		"brand":                 {StringValue: new(lookup(brands, cmp.Or(own.Brand, def.Brand, profile.MockNVMLBrand)))},
		"architecture":          {StringValue: new(lookup(architectures, cmp.Or(own.Architecture, def.Architecture, profile.MockNVMLArchitecture)))},
		busID.Name:              busID.Value,
		pcieRootAttribute:       {StringValue: new(r.RootComplex.String())},
		"cudaComputeCapability": computeCapability(def),
	}
	for k, v := range system {
		attrs[k] = v
	}
	if r.NUMANode >= 0 {
		// The driver's default form, its DRAListTypeAttributes gate off:
		// a scalar, as deviceattribute's ScalarAttribute.
		numa, err := deviceattribute.GetNUMANodeAttribute(r.NUMANode, deviceattribute.ScalarAttribute)
		if err != nil {
			return resourcev1.Device{}, fmt.Errorf("profile %s: GPU %d: %w", source, g.Index, err)
		}
		attrs[numa.Name] = numa.Value
	}
	memory := profile.MockNVMLMemoryBytes
	if b := cmp.Or(own.Memory.TotalBytes, def.Memory.TotalBytes); b != nil {
		memory = *b
	}
	return resourcev1.Device{
		Name:       fmt.Sprintf("gpu-%d", own.Minor()),
		Attributes: attrs,
		Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
			"memory": {Value: *resource.NewQuantity(int64(memory), resource.BinarySI)},
		},
	}, nil
}

// computeCapability is device_defaults' compute capability: nvml-mock
// merges no devices[] entry's (mergeDeviceOverride leaves it out).
func computeCapability(def profile.NVMLDevice) resourcev1.DeviceAttribute {
	major, minor := profile.MockNVMLComputeMajor, profile.MockNVMLComputeMinor
	if cc := def.ComputeCapability; cc.Major != nil || cc.Minor != nil {
		major, minor = 0, 0
		if cc.Major != nil {
			major = *cc.Major
		}
		if cc.Minor != nil {
			minor = *cc.Minor
		}
	}
	return resourcev1.DeviceAttribute{VersionValue: new(fmt.Sprintf("%d.%d.0", major, minor))}
}

// lookup is names[key], else "Unknown", as nvml-mock's parsers fall back
// and go-nvlib prints it.
func lookup(names map[string]string, key string) string {
	if v, ok := names[key]; ok {
		return v
	}
	return "Unknown"
}

// semver is v as the driver publishes it, parsed by Masterminds/semver
// and printed back: one to three numbers, leading zeros dropped, missing
// ones zero (550.163.01 is 550.163.1).
func semver(v string) (string, bool) {
	parts := strings.Split(v, ".")
	if len(parts) > 3 {
		return "", false
	}
	n := [3]int{}
	for i, s := range parts {
		x, err := strconv.Atoi(s)
		if err != nil || x < 0 || strings.HasPrefix(s, "+") {
			return "", false
		}
		n[i] = x
	}
	return fmt.Sprintf("%d.%d.%d", n[0], n[1], n[2]), true
}

// minorOf is the number of a device named gpu-N, for ordering.
func minorOf(name string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(name, "gpu-"))
	return n
}
