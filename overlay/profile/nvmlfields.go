package profile

import (
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// MockNVMLDriverVersion is the driver version nvml-mock's NVML is given
// for a profile without one (it refuses such a profile, and the suites
// serve it one): nvml-mock's own default (DefaultConfig in
// pkg/gpu/mocknvml/engine/config.go).
const MockNVMLDriverVersion = "550.163.01"

// MockNVMLCUDAVersion is the CUDA version nvml-mock's NVML reports for a
// profile without one, in NVML's 1000*major + 10*minor: 12.4, the CUDA of
// MockNVMLDriverVersion's driver (go-nvml's dgxa100 mock, which the engine
// starts from).
const MockNVMLCUDAVersion = 12040

// nvml-mock's defaults for a GPU its profile leaves blank, in the
// profile's form: go-nvml's dgxa100 mock device (gpus.A100_SXM4_40GB), an
// A100-SXM4-40GB, which its engine starts every device from.
const (
	MockNVMLName         = "Mock NVIDIA A100-SXM4-40GB"
	MockNVMLBrand        = "nvidia"
	MockNVMLArchitecture = "ampere"
	MockNVMLMemoryBytes  = uint64(40960) << 20
	MockNVMLComputeMajor = 8
	MockNVMLComputeMinor = 0
)

// MockDefault is an NVML fact a profile leaves to nvml-mock's defaults:
// the field to set (device_defaults' where a GPU lacks it) and the
// default NVML reports in its place.
type MockDefault struct {
	Field, Default string
}

// MockDefaults lists, in a fixed order and each once, the NVML facts the
// profile leaves to nvml-mock's defaults for any of gpus (NVMLGPUs'):
// the driver version, without which nvml-mock's NVML refuses the profile
// and serves its own eight A100s, the CUDA version, and each GPU's name,
// brand, architecture, compute capability and memory, which it fills from
// its A100-SXM4-40GB. The DRA driver and GPU Feature Discovery publish
// the defaults as if they were the board's.
func (f *NVMLFields) MockDefaults(gpus []NVMLGPU) []MockDefault {
	var out []MockDefault
	s := f.System
	if s.DriverVersion == "" {
		out = append(out, MockDefault{"system.driver_version", MockNVMLDriverVersion + " (nvml-mock's NVML refuses the profile without it and serves its own 8 A100s)"})
	}
	if s.CUDAVersion == "" && s.CUDAVersionMajor == nil && s.CUDAVersionMinor == nil {
		out = append(out, MockDefault{"system.cuda_version", fmt.Sprintf("%d.%d", MockNVMLCUDAVersion/1000, MockNVMLCUDAVersion%1000/10)})
	}
	def := f.DeviceDefaults
	lacks := func(has func(d NVMLDevice) bool) bool {
		for _, g := range gpus {
			if d, _, _ := f.Device(g.Index); !has(d) && !has(def) {
				return true
			}
		}
		return false
	}
	for _, c := range []struct {
		field, value string
		has          func(d NVMLDevice) bool
	}{
		{"name", MockNVMLName, func(d NVMLDevice) bool { return d.Name != "" }},
		{"brand", MockNVMLBrand, func(d NVMLDevice) bool { return d.Brand != "" }},
		{"architecture", MockNVMLArchitecture, func(d NVMLDevice) bool { return d.Architecture != "" }},
		{"memory.total_bytes", fmt.Sprintf("%d (%d MiB)", MockNVMLMemoryBytes, MockNVMLMemoryBytes>>20), func(d NVMLDevice) bool { return d.Memory.TotalBytes != nil }},
	} {
		if lacks(c.has) {
			out = append(out, MockDefault{"device_defaults." + c.field, c.value})
		}
	}
	// nvml-mock merges no devices[] entry's compute capability.
	if cc := def.ComputeCapability; cc.Major == nil && cc.Minor == nil && len(gpus) > 0 {
		out = append(out, MockDefault{"device_defaults.compute_capability", fmt.Sprintf("%d.%d", MockNVMLComputeMajor, MockNVMLComputeMinor)})
	}
	return out
}

// NVMLFacts is what NVML reports of a GPU beyond its name and PCI
// identity, as an nvml-mock profile states it (devices[] or
// device_defaults): NVMLDevice reads it, and DeviceConfig carries it so
// that a built-in profile states it (the built-ins' boards' facts).
type NVMLFacts struct {
	UUID         string  `yaml:"uuid,omitempty"`
	MinorNumber  *uint32 `yaml:"minor_number,omitempty"`
	Brand        string  `yaml:"brand,omitempty"`
	Architecture string  `yaml:"architecture,omitempty"`
	// ComputeCapability counts in device_defaults only: nvml-mock merges
	// no devices[] entry's (its mergeDeviceOverride leaves it out).
	ComputeCapability ComputeCapability `yaml:"compute_capability,omitempty"`
	Memory            NVMLMemory        `yaml:"memory,omitempty"`
}

// ComputeCapability is compute_capability.
type ComputeCapability struct {
	Major *int `yaml:"major,omitempty"`
	Minor *int `yaml:"minor,omitempty"`
}

// NVMLMemory is memory: the frame buffer NVML reports
// (nvmlDeviceGetMemoryInfo), not bar1_memory.
type NVMLMemory struct {
	TotalBytes *uint64 `yaml:"total_bytes,omitempty"`
}

// NVMLSystem is the part of the system block that NVML reports: the
// driver and CUDA versions. nvml-mock's NVML refuses a profile without
// driver_version.
type NVMLSystem struct {
	DriverVersion    string `yaml:"driver_version,omitempty"`
	CUDAVersion      string `yaml:"cuda_version,omitempty"`
	CUDAVersionMajor *int   `yaml:"cuda_version_major,omitempty"`
	CUDAVersionMinor *int   `yaml:"cuda_version_minor,omitempty"`
}

// NVMLDevice is the part of a devices[] entry (or device_defaults) that
// NVML reports beyond the PCI identity NVMLGPUs resolves.
type NVMLDevice struct {
	Index     *int   `yaml:"index"`
	Name      string `yaml:"name"`
	NVMLFacts `yaml:",inline"`
	MIG       struct {
		ModeCurrent     string `yaml:"mode_current"`
		MaxGPUInstances *int   `yaml:"max_gpu_instances"`
	} `yaml:"mig"`
}

// Minor is the device's minor number, which DecodeNVMLFields gives every
// GPU it lists (0 for a devices[] entry it has none for).
func (d NVMLDevice) Minor() uint32 {
	if d.MinorNumber == nil {
		return 0
	}
	return *d.MinorNumber
}

// NVMLFields is the NVML-only part of an nvml-mock profile, which the
// render ignores (Profile carries it only so that the built-ins can state
// it): what NVML reports of the system and of each GPU.
type NVMLFields struct {
	System         NVMLSystem   `yaml:"system"`
	DeviceDefaults NVMLDevice   `yaml:"device_defaults"`
	Devices        []NVMLDevice `yaml:"devices"`
}

// DecodeNVMLFields decodes the fields of data that NVML reports and
// Profile ignores, every GPU of gpus with a devices[] entry holding a uuid
// and a minor_number: the profile's, else those IdentifyDevices gives, as
// the suites serve a profile to nvml-mock. GPUs that system.num_devices
// alone brings into being get an entry of their own first, so they are
// identified by the same rule.
func DecodeNVMLFields(source string, data []byte, gpus []NVMLGPU) (*NVMLFields, error) {
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("profile %s: %w", source, err)
	}
	if doc == nil {
		doc = map[string]any{}
	}
	devices, _ := doc["devices"].([]any)
	listed := map[int]bool{}
	for pos, d := range devices {
		index := pos
		if dev, ok := d.(map[string]any); ok {
			if n, ok := dev["index"].(int); ok {
				index = n
			}
		}
		listed[index] = true
	}
	for _, g := range gpus {
		if !listed[g.Index] {
			devices = append(devices, map[string]any{"index": g.Index})
		}
	}
	doc["devices"] = devices
	IdentifyDevices(doc)
	identified, err := yaml.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("profile %s: %w", source, err)
	}
	var nv NVMLFields
	if err := yaml.Unmarshal(identified, &nv); err != nil {
		return nil, fmt.Errorf("profile %s: %w", source, err)
	}
	return &nv, nil
}

// Device is the devices[] entry of the GPU of NVML index index (the entry
// whose index it is, its position when it names none, as NVMLGPUs matches
// them) and its position; ok is false when there is none, which
// DecodeNVMLFields never leaves for a GPU NVMLGPUs lists.
func (f *NVMLFields) Device(index int) (d NVMLDevice, pos int, ok bool) {
	for i, e := range f.Devices {
		if n := i; (e.Index != nil && *e.Index == index) || (e.Index == nil && n == index) {
			d, pos, ok = e, i, true
		}
	}
	return d, pos, ok
}

// DriverVersion is system.driver_version, else MockNVMLDriverVersion.
func (f *NVMLFields) DriverVersion() string { return driverVersionOr(f.System.DriverVersion) }

// driverVersionOr is a profile's driver version v, else
// MockNVMLDriverVersion: the one rule NVML's report and the module view's
// /sys/module/nvidia/version share.
func driverVersionOr(v string) string {
	if v != "" {
		return v
	}
	return MockNVMLDriverVersion
}

// CUDAVersion is the profile's CUDA version in NVML's encoding:
// system.cuda_version_major/minor, else system.cuda_version, else
// MockNVMLCUDAVersion.
func (f *NVMLFields) CUDAVersion(source string) (int, error) {
	s := f.System
	major, minor := s.CUDAVersionMajor, s.CUDAVersionMinor
	if major == nil && minor == nil && s.CUDAVersion != "" {
		ma, mi, ok := strings.Cut(s.CUDAVersion, ".")
		x, errX := strconv.Atoi(ma)
		y, errY := strconv.Atoi(mi)
		if !ok || errX != nil || errY != nil {
			return 0, refuseNVML(source, "system.cuda_version", s.CUDAVersion, "want major.minor such as 12.4")
		}
		major, minor = &x, &y
	}
	switch {
	case major == nil && minor == nil:
		return MockNVMLCUDAVersion, nil
	case major == nil || minor == nil:
		return 0, refuseNVML(source, "system.cuda_version_major", fmt.Sprint(orUnknown(major), ".", orUnknown(minor)), "want both cuda_version_major and cuda_version_minor")
	case *major < 1 || *major > 999 || *minor < 0 || *minor > 99:
		return 0, refuseNVML(source, "system.cuda_version_major", fmt.Sprintf("%d.%d", *major, *minor), "want a CUDA version such as 12.4")
	}
	return *major*1000 + *minor*10, nil
}

// IdentifyDevices gives each device of doc (a profile decoded as a YAML
// mapping) that lacks them a uuid (stable: a digest of its index and bus
// id) and a minor_number (its index), and reports whether every device had
// both already. nvml-mock's NVML would give a device without a uuid a
// random one, and every device without a minor number minor 0, which the
// DRA driver names gpu-0, refusing the pool ("duplicate device").
func IdentifyDevices(doc map[string]any) bool {
	devices, _ := doc["devices"].([]any)
	had := true
	for i, d := range devices {
		dev, ok := d.(map[string]any)
		if !ok {
			continue
		}
		index := i
		if n, ok := dev["index"].(int); ok {
			index = n
		}
		if dev["minor_number"] == nil {
			dev["minor_number"], had = index, false
		}
		if dev["uuid"] == nil {
			pci, _ := dev["pci"].(map[string]any)
			dev["uuid"], had = DeviceUUID(index, fmt.Sprint(pci["bus_id"])), false
		}
	}
	return had
}

// gpuNVMLIdentity is the uuid and minor number of the GPU of NVML index
// index whose devices[] entry is own (nil for none): the entry's, else
// those IdentifyDevices gives it, by its rule on the Profile's fields (a
// bus id it lacks spells "<nil>", as fmt.Sprint spells the missing key).
// TestNormalizeIdentifiesAsDecodeNVMLFields holds the two to one answer.
func gpuNVMLIdentity(index int, own *DeviceConfig) (uuid string, minor uint32) {
	busID := "<nil>"
	minor = uint32(index)
	if own != nil {
		uuid, busID = own.UUID, cmp.Or(own.PCI.BusID, busID)
		if own.MinorNumber != nil {
			minor = *own.MinorNumber
		}
	}
	return cmp.Or(uuid, DeviceUUID(index, busID)), minor
}

// DeviceUUID is the uuid IdentifyDevices gives the device of NVML index
// index at bus id busID (as the profile spells it, "<nil>" for none):
// stable, a digest of both, in NVML's GPU-8-4-4-4-12 form. The built-ins
// state the same uuids.
func DeviceUUID(index int, busID string) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%d %s", index, busID))
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// refuseNVML is the package's one-line refusal, for the fields only NVML
// reads.
func refuseNVML(source, field, value, why string) error {
	return &Error{Source: source, Field: field, Value: value, Err: errors.New(why)}
}

func orUnknown(p *int) string {
	if p == nil {
		return "?"
	}
	return strconv.Itoa(*p)
}

// ParseNVML parses the profile data (source names it in refusals) and
// returns it with what nvml-mock's NVML reports for it: its GPUs
// (NVMLGPUs) and their NVML-only fields (DecodeNVMLFields).
func ParseNVML(source string, data []byte) (*Profile, []NVMLGPU, *NVMLFields, error) {
	p, err := Parse(source, data)
	if err != nil {
		return nil, nil, nil, err
	}
	gpus, err := NVMLGPUs(source, p)
	if err != nil {
		return nil, nil, nil, err
	}
	nv, err := DecodeNVMLFields(source, data, gpus)
	if err != nil {
		return nil, nil, nil, err
	}
	return p, gpus, nv, nil
}
