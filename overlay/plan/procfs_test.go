package plan_test

import (
	"cmp"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// The rendered proc/modules holds, in the kernel's format, a line per
// module of the view: its holders each followed by a comma (or "-"), the
// view's refcnt, Live, the address as an unprivileged reader sees it, and
// (POE) on the NVIDIA modules alone; /proc/driver/nvidia/version names the
// version of the view's version files.
func TestProcModulesLines(t *testing.T) {
	shared := overlaytest.SharedTestdata(t, "nvml-mock-profiles")
	for _, c := range []struct {
		profile string
		want    string
	}{
		{"hgx-h100", `nvidia 39059456 3 nvidia_modeset,nvidia_peermem,nvidia_uvm, Live 0x0000000000000000 (POE)
nvidia_uvm 1507328 0 - Live 0x0000000000000000 (POE)
nvidia_modeset 1314816 0 - Live 0x0000000000000000 (POE)
nvidia_peermem 16384 0 - Live 0x0000000000000000 (POE)
mlx5_core 2318336 1 mlx5_ib, Live 0x0000000000000000
mlx5_ib 475136 0 - Live 0x0000000000000000
ib_core 483328 2 mlx5_ib,nvidia_peermem, Live 0x0000000000000000
`},
		// nvml-mock's own T4 profile: no HCAs, the driver container's stack.
		{filepath.Join(shared, "t4.yaml"), `nvidia 39059456 2 nvidia_modeset,nvidia_uvm, Live 0x0000000000000000 (POE)
nvidia_uvm 1507328 0 - Live 0x0000000000000000 (POE)
nvidia_modeset 1314816 0 - Live 0x0000000000000000 (POE)
`},
	} {
		t.Run(filepath.Base(c.profile), func(t *testing.T) {
			m := machine(t, c.profile, "")
			p := mustPlan(t, m, plan.Options{})
			fs := files(p)
			require.Equal(t, c.want, text(t, fs, plan.ProcModulesFile))
			// The third column is the view's refcnt, module by module.
			for _, line := range strings.Split(strings.TrimSuffix(c.want, "\n"), "\n") {
				f := strings.Fields(line)
				require.Equal(t, f[2]+"\n", text(t, fs, plan.ModulesDir+"/"+f[0]+"/refcnt"), line)
			}
			require.Equal(t, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  "+m.NVIDIAVersion()+"  Tue Oct 14 22:38:19 UTC 2025\n"+
				"GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n", text(t, fs, plan.NVIDIAVersionFile))
		})
	}
}

// The node's own lines come first, as read; a node line of one of our
// names gives way to ours, as in the module view. A kernel without
// loadable modules has no /proc/modules: then only ours.
func TestProcModulesNodeLines(t *testing.T) {
	node := fstest.MapFS{"modules": {Data: []byte(
		"overlay 151552 2 - Live 0x0000000000000000\n" +
			"nvidia 62754816 12 nvidia_uvm,nvidia_modeset, Live 0x0000000000000000 (POE)\n" +
			"ext4 1028096 1 - Live 0x0000000000000000\n")}}
	lines, err := plan.ReadHostProcModules(node)
	require.NoError(t, err)
	require.Len(t, lines, 3)
	p := mustPlan(t, machine(t, "t4-vm", ""), plan.Options{HostProcModules: lines})
	require.Equal(t, `overlay 151552 2 - Live 0x0000000000000000
ext4 1028096 1 - Live 0x0000000000000000
nvidia 39059456 2 nvidia_modeset,nvidia_uvm, Live 0x0000000000000000 (POE)
nvidia_uvm 1507328 0 - Live 0x0000000000000000 (POE)
nvidia_modeset 1314816 0 - Live 0x0000000000000000 (POE)
`, text(t, files(p), plan.ProcModulesFile))

	none, err := plan.ReadHostProcModules(fstest.MapFS{})
	require.NoError(t, err)
	require.Nil(t, none)
}

// A node line no reader could parse is refused in one line naming the
// file, the field and the value, at read and at plan.
func TestProcModulesBadNodeLine(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{"ext4 big 1 - Live 0x0000000000000000", `node /proc/modules: line "ext4 big 1 - Live 0x0000000000000000": size: value "big": want a decimal number`},
		{"ext/4 1028096 1 - Live 0x0000000000000000", `node /proc/modules: line "ext/4 1028096 1 - Live 0x0000000000000000": name: value "ext/4": not a module name (letters, digits, '_', '-' and '.')`},
		{"ext4 1028096 x - Live 0x0000000000000000", `node /proc/modules: line "ext4 1028096 x - Live 0x0000000000000000": refcnt: value "x": want a decimal number or -`},
		{"ext4 1028096", `node /proc/modules: line "ext4 1028096": fields: value "2": want at least name, size, refcnt, holders, state and address`},
	} {
		_, err := plan.ReadHostProcModules(fstest.MapFS{"modules": {Data: []byte("overlay 151552 2 - Live 0x0000000000000000\n" + c.line + "\n")}})
		require.EqualError(t, err, c.want)
		require.NotContains(t, err.Error(), "\n")
		_, err = plan.New(machine(t, "t4-vm", ""), plan.Options{HostProcModules: []string{c.line}})
		require.ErrorContains(t, err, c.want)
	}
}

// nodeDevices is a node's /proc/devices: kernel lines from 245 to 254
// (the dynamic range's top), 497 (whose slot, 497 % 255, is 242's), the
// real NVIDIA driver's 195 under its pre-550.40 name and its nvidia-uvm
// at 510, and block lines.
const nodeDevices = `Character devices:
  1 mem
  4 /dev/vc/0
195 nvidia-frontend
226 drm
245 hidraw
246 usbmon
247 bsg
248 watchdog
249 ptp
250 pps
251 rtc
252 dax
253 tpm
254 gpiochip
497 mmpmem
510 nvidia-uvm

Block devices:
  8 sd
259 blkext
`

// proc/devices lists the node's majors with the NVIDIA modules' beside
// them: 195 for the GPUs, nvidia-modeset and nvidiactl (from 550.40;
// before, one nvidia-frontend), and dynamic majors where the kernel would
// put them: the first free from 254 down, skipping a major whose slot a
// major above 255 takes (242, for 497), in the order the driver registers
// them. A node line of one of our names, or at 195, gives way to ours.
func TestProcDevices(t *testing.T) {
	node := fstest.MapFS{plan.HostProcDevices: {Data: []byte(nodeDevices)}}
	// The node's lines below and above ours, which stay as they were.
	kept := "  1 mem\n  4 /dev/vc/0\n"
	keptTop := nodeDevices[strings.Index(nodeDevices, "245 hidraw"):strings.Index(nodeDevices, "510 ")] + "\nBlock devices:\n  8 sd\n259 blkext\n"
	for _, c := range []struct {
		name, version string
		node          fstest.MapFS
		want          string
	}{
		{"580 beside the node's", "580.105.08", node, "Character devices:\n" + kept + `195 nvidia
195 nvidia-modeset
195 nvidiactl
226 drm
239 nvidia-uvm
240 nvidia-nvswitch
241 nvidia-nvlink
243 nvidia-caps
244 nvidia-caps-imex-channels
` + keptTop},
		{"535 beside the node's", "535.104.05", node, "Character devices:\n" + kept + `195 nvidia-frontend
226 drm
240 nvidia-uvm
241 nvidia-nvswitch
243 nvidia-nvlink
244 nvidia-caps
` + keptTop},
		{"no node file", "580.105.08", fstest.MapFS{}, `Character devices:
195 nvidia
195 nvidia-modeset
195 nvidiactl
250 nvidia-uvm
251 nvidia-nvswitch
252 nvidia-nvlink
253 nvidia-caps
254 nvidia-caps-imex-channels

Block devices:
`},
	} {
		t.Run(c.name, func(t *testing.T) {
			devices, err := plan.ReadHostProcDevices(c.node)
			require.NoError(t, err)
			m := machine(t, "t4-vm", "")
			m.DriverVersion = c.version
			p := mustPlan(t, m, plan.Options{HostProcDevices: devices})
			got := text(t, files(p), plan.ProcDevicesFile)
			require.Equal(t, c.want, got)
			// As nvidia-container-toolkit reads it: every "%d %s" line.
			majors := map[string]string{}
			for _, line := range strings.Split(got, "\n") {
				if f := strings.Fields(line); len(f) == 2 {
					if _, err := strconv.Atoi(f[0]); err == nil {
						majors[f[1]] = f[0]
					}
				}
			}
			require.Equal(t, "195", majors[map[bool]string{true: "nvidia", false: "nvidia-frontend"}[c.version >= "550"]])
			require.NotEmpty(t, majors["nvidia-uvm"])
			require.NotEmpty(t, majors["nvidia-caps"])
		})
	}
}

// A node line no reader could take is refused in one line naming the
// file, the field and the value, at read and at plan; and a node without
// a dynamic major left refuses the render in one line.
func TestProcDevicesBadNodeLine(t *testing.T) {
	for _, c := range []struct{ devices, want string }{
		{"Character devices:\nabc mem\n", `node /proc/devices: line "abc mem": major: value "abc": want a decimal number 0..511`},
		{"Character devices:\n600 mem\n", `node /proc/devices: line "600 mem": major: value "600": want a decimal number 0..511`},
		{"Character devices:\n  1 mem\n  4 tty ttyS\n", `node /proc/devices: line "  4 tty ttyS": fields: value "3": want "<major> <name>" below "Character devices:" or "Block devices:"`},
		{"  1 mem\n", `node /proc/devices: line "  1 mem": fields: value "2": want "<major> <name>" below "Character devices:" or "Block devices:"`},
		{"Block devices:\n  8 s\x01d\n", `node /proc/devices: line "  8 s\x01d": name: value "s\x01d": want one name without spaces or control characters`},
	} {
		_, err := plan.ReadHostProcDevices(fstest.MapFS{plan.HostProcDevices: {Data: []byte(c.devices)}})
		require.EqualError(t, err, c.want)
		require.NotContains(t, err.Error(), "\n")
	}
	_, err := plan.New(machine(t, "t4-vm", ""), plan.Options{HostProcDevices: plan.ProcDevices{Block: []plan.DeviceMajor{{Major: 600, Name: "sd"}}}})
	require.ErrorContains(t, err, `node /proc/devices: line "600 sd": major: value "600": want a decimal number 0..511`)

	var full plan.ProcDevices
	for m := 234; m <= 511; m++ {
		if m <= 254 || m >= 384 {
			full.Char = append(full.Char, plan.DeviceMajor{Major: m, Name: fmt.Sprint("d", m)})
		}
	}
	_, err = plan.New(machine(t, "t4-vm", ""), plan.Options{HostProcDevices: full})
	require.ErrorContains(t, err, `node /proc/devices: majors: value "149": no dynamic character major left for nvidia-caps-imex-channels`)
	require.NotContains(t, err.Error(), "\n")
}

// A re-profile re-renders the /proc files: a node whose GPUs all go to
// vfio-pci has no nvidia loaded, so proc/devices is the node's alone and
// proc/driver/nvidia is gone from the disk, under the same completion
// marker.
func TestProcFilesReProfile(t *testing.T) {
	root := t.TempDir()
	node, err := plan.ReadHostProcDevices(fstest.MapFS{plan.HostProcDevices: {Data: []byte(nodeDevices)}})
	require.NoError(t, err)
	apply := func(m *profile.Machine) *plan.Plan {
		p := mustPlan(t, m, plan.Options{HostProcDevices: node})
		_, err := writer.Apply(root, p, writer.Options{SkipSync: true})
		require.NoError(t, err)
		_, err = writer.ReadMarker(os.DirFS(root))
		require.NoError(t, err, "the completion marker vouches for the /proc files")
		return p
	}
	apply(machine(t, "t4-vm", ""))
	gpus, err := os.ReadDir(filepath.Join(root, plan.NVIDIAGPUsDir))
	require.NoError(t, err)
	require.Len(t, gpus, 4)
	m := machine(t, "t4-vm", "")
	for i := range m.Devices {
		m.Devices[i].Driver = profile.DriverVFIO
	}
	p := apply(m)
	require.NotContains(t, p.Modules, "nvidia")
	data, err := os.ReadFile(filepath.Join(root, plan.ProcDevicesFile))
	require.NoError(t, err)
	require.Equal(t, nodeDevices, string(data), "the node's lines alone, its own NVIDIA driver's kept: no module of ours stands in for it")
	require.NoDirExists(t, filepath.Join(root, filepath.Dir(plan.NVIDIAVersionFile)))
	require.DirExists(t, filepath.Join(root, plan.ProcDir))
}

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
