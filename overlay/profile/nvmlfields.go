package profile

import (
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

// NVMLDevice is the part of a devices[] entry (or device_defaults) that
// NVML reports beyond the PCI identity NVMLGPUs resolves.
type NVMLDevice struct {
	Index        *int   `yaml:"index"`
	Name         string `yaml:"name"`
	UUID         string `yaml:"uuid"`
	MinorNumber  uint32 `yaml:"minor_number"`
	Brand        string `yaml:"brand"`
	Architecture string `yaml:"architecture"`
	Memory       struct {
		TotalBytes *uint64 `yaml:"total_bytes"`
	} `yaml:"memory"`
	ComputeCapability struct {
		Major *int `yaml:"major"`
		Minor *int `yaml:"minor"`
	} `yaml:"compute_capability"`
	MIG struct {
		ModeCurrent     string `yaml:"mode_current"`
		MaxGPUInstances *int   `yaml:"max_gpu_instances"`
	} `yaml:"mig"`
}

// NVMLFields is the NVML-only part of an nvml-mock profile, which Profile
// ignores: what NVML reports of the system and of each GPU.
type NVMLFields struct {
	System struct {
		DriverVersion    string `yaml:"driver_version"`
		CUDAVersion      string `yaml:"cuda_version"`
		CUDAVersionMajor *int   `yaml:"cuda_version_major"`
		CUDAVersionMinor *int   `yaml:"cuda_version_minor"`
	} `yaml:"system"`
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
func (f *NVMLFields) DriverVersion() string {
	if v := f.System.DriverVersion; v != "" {
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
			h := sha256.Sum256(fmt.Appendf(nil, "%d %v", index, pci["bus_id"]))
			dev["uuid"], had = fmt.Sprintf("GPU-%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16]), false
		}
	}
	return had
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
