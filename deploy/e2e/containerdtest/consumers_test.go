package containerdtest_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
)

// consumerContainer runs an invocation in a CRI container with the host's
// /usr, the consumer's build, the mock NVML and the profile mounted, and
// an output directory it may write.
func (s *served) consumerContainer(name, buildDir, mockNVML, out string, inv programs.Invocation, extra ...containerdtest.Mount) containerdtest.Container {
	return containerdtest.Container{
		Name:    name,
		Image:   containerdtest.ConsumerImage,
		Command: inv.Args,
		Env:     inv.Env,
		Mounts: append(append(containerdtest.ConsumerMounts(buildDir, mockNVML),
			containerdtest.Mount{HostPath: s.profile, ContainerPath: profileInImage, ReadOnly: true},
			containerdtest.Mount{HostPath: out, ContainerPath: containerdtest.InConsumerOutput},
		), extra...),
	}
}

// The containers of the consumers' pod. On a node, GFD and the DRA
// driver's kubelet plugin ask for no device: the pod's annotation names
// ours per container, and serve --nri (--nri-inject annotated, so that a
// container the annotation does not name is the control) serves it. nvml-list stands for
// the DRA driver's discovery: it asks deviceattribute, the library the
// driver publishes pcieRoot with, for the root of each bus id NVML lists.
const (
	gfdContainer  = "gpu-feature-discovery"
	nvmlContainer = "nvml-list"
)

// testConsumers runs GPU Feature Discovery and nvml-list's deviceattribute
// in CRI containers of a pod whose annotation has serve --nri give them
// our CDI device's edits, and, as the negative controls, in containers of
// the same pod that the annotation does not name. Their NVML is nvml-mock's where it is supplied, else our stand-in,
// and the rows say which.
func testConsumers(t *testing.T, s *served) {
	nvml := programs.NeedNVML(t)
	const route = "NRI serve --nri --nri-inject annotated, "
	type row struct {
		name, consumer, asks, want string
		run                        func(t *testing.T)
	}
	var pod *containerdtest.Sandbox
	// gfd runs GFD in the container name and returns its labels (none
	// where it wrote none) and its result.
	gfd := func(t *testing.T, name string) (map[string]string, containerdtest.Result) {
		t.Helper()
		out := t.TempDir()
		inv := programs.GFDRun{
			Binary:     containerdtest.InConsumerBuild + "/gpu-feature-discovery",
			NVMLDir:    containerdtest.InMockNVML,
			Profile:    profileInImage,
			OutputFile: containerdtest.InConsumerOutput + "/labels",
		}.Invocation()
		res := pod.Run(t, s.consumerContainer(name, programs.Need(t, programs.GFD()), nvml.Dir, out, inv))
		data, _ := os.ReadFile(filepath.Join(out, "labels"))
		labels, err := programs.ParseGFDLabels(data)
		require.NoError(t, err)
		return labels, res
	}
	nvmlList := func(t *testing.T, name string) []programs.NVMLDevice {
		t.Helper()
		inv := programs.NVMLListRun{Binary: containerdtest.InConsumerBuild + "/nvml-list", NVMLDir: containerdtest.InMockNVML, Profile: profileInImage}.Invocation()
		res := pod.Run(t, s.consumerContainer(name, programs.Need(t, programs.NVMLList()), nvml.Dir, t.TempDir(), inv))
		require.Equal(t, 0, res.ExitCode, "nvml-list: %s%s", res.Stdout, res.Stderr)
		found, err := programs.ParseNVMLDevices([]byte(res.Stdout))
		require.NoError(t, err)
		return found
	}
	// GFD's machine label, with no flag: the injected CDI device sets
	// GFD_MACHINE_TYPE_FILE at the overlay's machine type, the profile's
	// system.product_name. A profile that names none (a PCIe board's, or
	// one whose board's machine only the renderer infers) is not judged
	// there: the rows judge the rest, and say so.
	machine := ""
	if s.facts.MachineFrom == profilefacts.FromProfile {
		machine = programs.GFDMachineLabel(s.facts.Machine)
	}
	servedWant, unservedWant := "`nvidia.com/gpu.mode=compute`", "no `nvidia.com/gpu.mode=compute`, not the profile's machine"
	if machine == "" {
		servedWant += ", `gpu.machine` not judged (the profile names no machine)"
		unservedWant = "no `nvidia.com/gpu.mode=compute`, `gpu.machine` not judged (the profile names no machine)"
	}
	gpus := s.facts.GPUs
	rows := []row{
		{"GFD labels compute", "GPU Feature Discovery", "`cdi-devices.noderesource.dev/container.<name>`", servedWant + " (" + nvml.Name() + ")", func(t *testing.T) {
			labels, res := gfd(t, gfdContainer)
			require.Equal(t, 0, res.ExitCode, "GFD: %s", res.Stderr)
			require.Equal(t, "compute", labels["nvidia.com/gpu.mode"], "labels: %v", labels)
			if machine != "" {
				require.Equal(t, machine, labels["nvidia.com/gpu.machine"], "the profile's machine, through the spec's variable")
			}
			t.Logf("GFD: nvidia.com/gpu.mode=%s, nvidia.com/gpu.count=%s, nvidia.com/gpu.product=%s", labels["nvidia.com/gpu.mode"], labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.product"])
		}},
		{"GFD without the device fails", "GPU Feature Discovery", "nothing (a container the annotation does not name)", unservedWant + " (" + nvml.Name() + ")", func(t *testing.T) {
			// GFD v0.17.4 either labels gpu.mode=unknown or exits: it
			// reads each GPU's PCI vendor from sysfs.
			labels, res := gfd(t, gfdContainer+"-unannotated")
			require.NotEqual(t, "compute", labels["nvidia.com/gpu.mode"], "exit %d, labels %v: %s", res.ExitCode, labels, res.Stderr)
			if machine != "" {
				require.NotEqual(t, machine, labels["nvidia.com/gpu.machine"], "the node's own machine without the device")
			}
		}},
		{"deviceattribute finds pcieRoot", "deviceattribute on NVML's bus ids (nvml-list)", "`cdi-devices.noderesource.dev/container.<name>`", "each GPU's `resource.kubernetes.io/pcieRoot` is its root complex (" + nvml.Name() + ")", func(t *testing.T) {
			want, got := map[string]string{}, map[string]string{}
			// A root the profile does not give is required present, its
			// value not compared.
			const anyRoot = "a root (not given by the profile: not compared)"
			for _, d := range gpus {
				want[d.BusID] = d.Root
				if d.Root == "" {
					want[d.BusID] = anyRoot
				}
			}
			found := nvmlList(t, nvmlContainer)
			require.Len(t, found, len(gpus), "NVML lists the profile's GPUs")
			for _, d := range found {
				a, err := d.Address()
				require.NoError(t, err)
				got[a.String()] = d.PCIeRoot
				if want[a.String()] == anyRoot && d.PCIeRoot != "" {
					got[a.String()] = anyRoot
				}
				t.Logf("deviceattribute: %s %s=%s %s", d.BusID, programs.PCIeRootAttribute, d.PCIeRoot, d.PCIeRootError)
			}
			require.Equal(t, want, got, "each GPU's pcieRoot is its root complex")
		}},
		{"deviceattribute without the device finds no pcieRoot", "deviceattribute on NVML's bus ids (nvml-list)", "nothing (a container the annotation does not name)", "no GPU has a pcieRoot (" + nvml.Name() + ")", func(t *testing.T) {
			found := nvmlList(t, nvmlContainer+"-unannotated")
			require.Len(t, found, len(gpus), "NVML still lists every GPU")
			for _, d := range found {
				require.Empty(t, d.PCIeRoot, "%s has a pcieRoot without the mock sysfs", d.BusID)
			}
		}},
	}
	s.startServeNRI(t, false, "--nri-inject", "annotated")
	pod = s.h.RunPod(t, containerdtest.Pod{Name: "consumers", Annotations: map[string]string{
		"cdi-devices.noderesource.dev/container." + gfdContainer:  "- " + device,
		"cdi-devices.noderesource.dev/container." + nvmlContainer: "- " + device,
	}})
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			s.routes.expect(t, route+r.consumer, r.asks, r.want)
			r.run(t)
		})
	}
}
