package plan_test

import (
	"cmp"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
)

// A GPU's information file, in the driver's layout: its NVML name, its
// irq file's IRQ, NVML's uuid and minor number, its address, and the
// stand-ins no profile states.
func TestGPUInformation(t *testing.T) {
	shared := overlaytest.SharedTestdata(t, "nvml-mock-profiles")
	for _, c := range []struct {
		profile, bdf, want string
	}{
		{"t4-vm", "0000:00:1e.0", "Model: \t\t Tesla T4\nIRQ:   \t\t 29\nGPU UUID: \t GPU-051cb68e-8efa-ee8b-5efa-a1585375873e\n" +
			"Video BIOS: \t ??.??.??.??.??\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n" +
			"Bus Location: \t 0000:00:1e.0\nDevice Minor: \t 3\nGPU Firmware: \t 595.91.07\nGPU Excluded:\t No\n"},
		// nvml-mock's own H100 profile states its uuids and minor numbers.
		{filepath.Join(shared, "h100.yaml"), "0000:1b:00.0", "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 39\nGPU UUID: \t GPU-01000100-0000-0000-0000-000000000001\n" +
			"Video BIOS: \t ??.??.??.??.??\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n" +
			"Bus Location: \t 0000:1b:00.0\nDevice Minor: \t 1\nGPU Firmware: \t 550.163.01\nGPU Excluded:\t No\n"},
	} {
		t.Run(filepath.Base(c.profile), func(t *testing.T) {
			p := mustPlan(t, machine(t, c.profile, ""), plan.Options{})
			require.Equal(t, c.want, text(t, files(p), plan.NVIDIAGPUsDir+"/"+c.bdf+"/information"))
		})
	}
}

// Every profile renders its /proc files beside this node's own
// /proc/devices without refusal, with an information file for each GPU
// bound to nvidia and for no other device: its Model, GPU UUID and Device
// Minor NVML's for the profile (as profile.ParseNVML reads the file the
// suites serve nvml-mock), its IRQ its irq file's.
func TestGPUInformationEveryProfile(t *testing.T) {
	node, err := plan.ReadHostProcDevices(os.DirFS("/proc"))
	require.NoError(t, err)
	for _, name := range profilesUnderTest(t) {
		t.Run(filepath.Base(name), func(t *testing.T) {
			data, ok, err := shipped.File(name)
			require.NoError(t, err)
			if !ok {
				data, err = os.ReadFile(name)
				require.NoError(t, err)
			}
			_, gpus, nv, err := profile.ParseNVML(name, data)
			require.NoError(t, err)
			p := mustPlan(t, machine(t, name, ""), plan.Options{HostProcDevices: node})
			fs := files(p)
			var want, got []string
			for _, f := range p.Functions {
				n := slices.IndexFunc(p.Machine.Devices, func(d profile.Device) bool { return d.Address == f.Address })
				if n >= 0 && p.Machine.Devices[n].Kind == profile.GPU && f.State.Driver == profile.DriverNVIDIA {
					want = append(want, f.Address.String())
				}
			}
			for _, e := range p.Entries {
				if path.Dir(path.Dir(e.Path)) == plan.NVIDIAGPUsDir {
					got = append(got, path.Base(path.Dir(e.Path)))
				}
			}
			require.ElementsMatch(t, want, got)
			for _, g := range gpus {
				if !slices.Contains(got, g.Address.String()) {
					continue
				}
				fields := informationFields(text(t, fs, plan.NVIDIAGPUsDir+"/"+g.Address.String()+"/information"))
				own, _, _ := nv.Device(g.Index)
				require.Equal(t, cmp.Or(own.Name, nv.DeviceDefaults.Name, profile.MockNVMLName), fields["Model"])
				require.Equal(t, own.UUID, fields["GPU UUID"])
				require.Equal(t, strconv.FormatUint(uint64(own.Minor()), 10), fields["Device Minor"])
				require.Equal(t, g.Address.String(), fields["Bus Location"])
				irq := p.Functions[g.Address].Dir + "/irq"
				require.Equal(t, strings.TrimSpace(text(t, fs, irq)), fields["IRQ"])
			}
		})
	}
}

// A write that binds a GPU to vfio-pci takes its information file away,
// as the driver removes a GPU's directory when it lets go of it.
func TestGPUInformationFollowsWrites(t *testing.T) {
	m := machine(t, "t4-vm", "")
	gpu := m.GPUs()[0].Address
	p, err := plan.New(m, plan.Options{Writable: true})
	require.NoError(t, err)
	f := p.Functions[gpu]
	dir := plan.NVIDIAGPUsDir + "/" + gpu.String()
	require.Contains(t, files(p), dir+"/information")
	p, err = plan.New(m, plan.Options{Writable: true, Written: plan.WrittenState{gpu: {Driver: profile.DriverVFIO, Override: profile.DriverVFIO, ID: f.ID}}})
	require.NoError(t, err)
	require.Equal(t, profile.DriverVFIO, p.Functions[gpu].State.Driver)
	fs := files(p)
	require.NotContains(t, fs, dir)
	require.Contains(t, fs, plan.NVIDIAGPUsDir+"/"+m.GPUs()[1].Address.String()+"/information")
}

// informationFields reads an information file's "Name: \t value" lines.
func informationFields(s string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		k, v, _ := strings.Cut(line, ":")
		out[k] = strings.TrimSpace(v)
	}
	return out
}
