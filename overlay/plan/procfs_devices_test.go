package plan_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

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
