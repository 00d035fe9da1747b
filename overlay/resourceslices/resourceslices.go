// Package resourceslices plans the ResourceSlices DRA drivers publish on a
// node served a profile, without running them, device by device and
// attribute by attribute as they publish them on the tree this tool
// renders: the NVIDIA DRA driver's gpu.nvidia.com pool (NVIDIAGPU, in
// nvidiagpu.go), as its gpu-kubelet-plugin publishes it with nvml-mock's
// NVML reading the profile, and dranet's dra.net pool of the profile's
// HCAs (DRANet, in dranet.go). A node that runs no driver (a KWOK node)
// can carry them all the same. RecordedRuns are the real runs they are
// proven equal to.
//
// Each driver is a Driver, reading the profile as Parse gives it, parsed
// and normalised once for them all; a Planner lists the drivers
// (DefaultDrivers, unless told others) and gives a node their slices
// (ForNode).
package resourceslices

import (
	"fmt"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
)

// Profile is a profile as the drivers read it: the machine the tree
// renders, and what nvml-mock's NVML reports of its GPUs. Parse makes it
// once for every driver, so that no driver parses or normalises the
// profile again, and all read the same machine.
type Profile struct {
	// Source names the profile in refusals.
	Source string
	// Machine is the profile normalised, as the tree renders it.
	Machine *profile.Machine
	// NVMLGPUs are the GPUs nvml-mock's NVML lists, in its order.
	NVMLGPUs []profile.NVMLGPU
	// NVML are the NVML-only fields the profile gives them.
	NVML *profile.NVMLFields
}

// Parse reads the profile data (source names it in refusals) as the
// drivers read it: as nvml-mock's NVML does (profile.ParseNVML), and
// normalised as the tree renders it.
func Parse(source string, data []byte) (*Profile, error) {
	p, gpus, nv, err := profile.ParseNVML(source, data)
	if err != nil {
		return nil, err
	}
	m, err := profile.Normalize(source, p, profile.Options{})
	if err != nil {
		return nil, err
	}
	return &Profile{Source: source, Machine: m, NVMLGPUs: gpus, NVML: nv}, nil
}

// MockDefaults says, one line each, which NVML facts the profile leaves
// to nvml-mock's A100 defaults, naming the field and the default the
// slices then carry as if they were the board's
// (profile.NVMLFields.MockDefaults); none for a profile that states them
// all, as every built-in does.
func (p *Profile) MockDefaults() []string {
	var out []string
	for _, d := range p.NVML.MockDefaults(p.NVMLGPUs) {
		out = append(out, fmt.Sprintf("profile %s: %s not set: nvml-mock's NVML reports its A100 default, %s", p.Source, d.Field, d.Default))
	}
	return out
}

// nodeSlices is the one slice a driver's kubelet plugin publishes for its
// devices on node, none without devices: a pool named for the node,
// generation 1, of one slice, with the generateName the ResourceSlice
// controller (k8s.io/dynamic-resource-allocation/resourceslice) gives it;
// the API server adds the rest of the name.
func nodeSlices(driver, node string, devices []resourcev1.Device) []resourcev1.ResourceSlice {
	if len(devices) == 0 {
		return nil
	}
	return []resourcev1.ResourceSlice{{
		TypeMeta: metav1.TypeMeta{APIVersion: resourcev1.SchemeGroupVersion.String(), Kind: "ResourceSlice"},
		// The controller's scheme: [slice index, 5 hex digits]-[driver]-[owner]-,
		// the owner being the Node.
		ObjectMeta: metav1.ObjectMeta{GenerateName: "00000-" + driver + "-" + node + "-"},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   driver,
			Pool:     resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			NodeName: &node,
			Devices:  devices,
		},
	}}
}

// pcieRootAttribute is deviceattribute's name for the pcieRoot attribute.
const pcieRootAttribute = resourcev1.QualifiedName(deviceattribute.StandardDeviceAttributePCIeRoot)

// ReadProfile reads a built-in's name or a profile file as nvml-mock's
// NVML reads it on a node this tool serves, for Parse: a file's bytes;
// a built-in's as `profiles --show` prints it (shipped.File), which is the
// file the suites give nvml-mock for it. It returns the name refusals give
// it.
func ReadProfile(nameOrPath string) (source string, data []byte, err error) {
	_, source, err = shipped.Load(nameOrPath)
	if err != nil {
		return "", nil, err
	}
	if source != nameOrPath {
		if data, ok, err := shipped.File(nameOrPath); ok {
			return source, data, err
		}
	}
	data, err = profile.ReadRegularFile(nameOrPath, profile.MaxSize)
	if err != nil {
		return "", nil, &profile.Error{Source: nameOrPath, Err: err}
	}
	return source, data, nil
}

// RecordedRuns are the real runs the plans are proven equal to, by
// driver: each a directory of overlay/resourceslices holding, per profile
// of the DRA suite (deploy/e2e/dra, its slug of the row), the slices the
// driver published there, named for the driver's version. make docs
// records them again from the suite's run of the supplied drivers;
// TestRecordedRun compares them with the plans, and
// docs/evidence/resourceslices.md says which versions they are.
func RecordedRuns() map[string]string {
	return map[string]string{
		NVIDIAGPUDriver: "testdata/dra-driver-nvidia-gpu-0.5.0-dev-95932046",
		DRANetDriver:    "testdata/dranet-1.4.0-70-gf258477",
	}
}
