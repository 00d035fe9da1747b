package shipped

import (
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

func TestBuiltinsMatchTheirBoards(t *testing.T) {
	want := map[string]struct {
		device, subsystem uint16
		bar1              uint64
		gpus, switches    int
		hierarchy         boards.Hierarchy
		numa              []int
	}{
		"dgx-a100":   {0x20b0, 0x134f, 64 << 30, 8, 6, boards.DGX, []int{0, 1}},
		"hgx-h100":   {0x2330, 0x16c1, 128 << 30, 8, 4, boards.HGX, []int{0, 1}},
		"gb200-tray": {0x2941, 0x2046, 256 << 30, 4, 0, boards.Flat, []int{0, 1}},
		"t4-vm":      {0x1eb8, 0x12a2, 256 << 20, 4, 0, boards.Flat, []int{-1}},
	}
	require.Len(t, All(), len(want))
	require.Equal(t, "dgx-a100", Default)
	for _, b := range All() {
		t.Run(b.Name, func(t *testing.T) {
			w := want[b.Name]
			m, err := profile.Normalize(b.Name, b.New(), profile.Options{})
			require.NoError(t, err)
			require.Len(t, m.GPUs(), w.gpus)
			require.Len(t, m.Devices, w.gpus+w.switches)
			require.Equal(t, w.hierarchy, m.Hierarchy)
			numa := map[int]bool{}
			for _, d := range m.GPUs() {
				require.Equal(t, w.device, d.DeviceID)
				require.Equal(t, boards.VendorNVIDIA, d.SubsystemVendor)
				require.Equal(t, w.subsystem, d.SubsystemDevice, "the real board's subsystem")
				require.Equal(t, w.bar1, d.BAR1Bytes)
				require.Equal(t, uint8(0xa1), d.Revision)
				board, ok := boards.Lookup(d.DeviceID)
				require.True(t, ok)
				require.Equal(t, board.Name, d.Name)
				numa[d.NUMANode] = true
			}
			for _, n := range w.numa {
				require.True(t, numa[n], "NUMA node %d", n)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	_, src, err := Load("")
	require.NoError(t, err)
	require.Equal(t, "built-in dgx-a100", src)
	_, _, err = Load("b300")
	require.ErrorContains(t, err, `profile "b300": not a built-in (dgx-a100, hgx-h100, gb200-tray, t4-vm) and not a file: `)
	_, _, err = Load("h100")
	require.ErrorContains(t, err, `profile "h100": not a built-in (dgx-a100, hgx-h100, gb200-tray, t4-vm) and not a file; for nvml-mock's h100, pass its profile file (the config.yaml its NVML reads): `)

	dir := t.TempDir()
	file := filepath.Join(dir, "mine.yaml")
	require.NoError(t, os.WriteFile(file, []byte("devices:\n  - pci: {bus_id: \"0000:18:00.0\", device_id: 0x233010DE}\n"), 0o644))
	p, src, err := Load(file)
	require.NoError(t, err)
	require.Equal(t, file, src)
	require.Len(t, p.Devices, 1)
}

// nvmlMockProfiles lists nvml-mock's own profiles by name, or skips when
// ../shared is not beside the checkout.
func nvmlMockProfiles(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), "*.yaml"))
	require.NoError(t, err)
	out := map[string]string{}
	for _, f := range files {
		out[strings.TrimSuffix(filepath.Base(f), ".yaml")] = f
	}
	return out
}

// mismatches compares a built-in's GPUs with what nvml-mock's NVML reports
// for one of its profiles.
func mismatches(t *testing.T, b Profile, nvmlProfile string) []string {
	t.Helper()
	p, err := profile.LoadFile(nvmlProfile)
	require.NoError(t, err)
	gpus, err := profile.NVMLGPUs(nvmlProfile, p)
	require.NoError(t, err)
	m, err := profile.Normalize(b.Name, b.New(), profile.Options{})
	require.NoError(t, err)
	var ours []profile.Identity
	for _, d := range m.GPUs() {
		ours = append(ours, profile.IdentityOf(d))
	}
	return profile.MatchIdentities(profile.Identities(gpus), "built-in "+b.Name, ours)
}

// TestBuiltinNamesNeverMislead: a built-in that takes the name of one of
// nvml-mock's profiles has exactly the GPUs (bus ids, device and subsystem
// ids) that nvml-mock's NVML reports for it, so --profile NAME can never
// give a sysfs that disagrees with nvml-mock's NAME.
func TestBuiltinNamesNeverMislead(t *testing.T) {
	shared := nvmlMockProfiles(t)
	for name := range shared {
		require.Contains(t, NVMLMockNames(), name, "NVMLMockNames lists every nvml-mock profile")
	}
	for _, b := range All() {
		if !slices.Contains(NVMLMockNames(), b.Name) {
			continue
		}
		f, ok := shared[b.Name]
		require.True(t, ok, "built-in %s takes an nvml-mock name: its profile must be in ../shared to compare", b.Name)
		require.Empty(t, mismatches(t, b, f), "built-in %s", b.Name)
	}

	// Negative controls: the built-ins that gave up nvml-mock's names would
	// fail this test under them. dgx-a100 has nvml-mock's a100 bus ids but
	// the real board's subsystem; hgx-h100 has a real capture's bus ids.
	byName := map[string]Profile{}
	for _, b := range All() {
		byName[b.Name] = b
	}
	a100 := mismatches(t, byName["dgx-a100"], shared["a100"])
	require.Len(t, a100, 8)
	require.Contains(t, a100, "NVML reports 0000:07:00.0 10de:20b0 subsystem 10de:1347, built-in dgx-a100 shows 0000:07:00.0 10de:20b0 subsystem 10de:134f")
	h100 := mismatches(t, byName["hgx-h100"], shared["h100"])
	require.Contains(t, h100, "NVML reports 0000:1a:00.0 10de:2330 subsystem 10de:1658, built-in hgx-h100 has no GPU at 0000:1a:00.0")
	require.Contains(t, h100, "built-in hgx-h100 shows 0000:53:00.0 10de:2330 subsystem 10de:16c1, NVML reports no GPU at 0000:53:00.0")
	for name, b := range map[string]string{"gb200": "gb200-tray", "t4": "t4-vm"} {
		require.NotEmpty(t, mismatches(t, byName[b], shared[name]), "%s differs from nvml-mock's %s", b, name)
	}
}

// TestBuiltinsAreCompleteNVMLProfiles: each built-in, as `profiles --show`
// prints it (File), is a profile nvml-mock's NVML serves as it is (a
// format version, a driver version, a uuid and a minor number on every
// GPU) and leaves nothing to nvml-mock's A100 defaults; and what NVML
// reports of its GPUs is its board's: name, brand, architecture, memory
// and driver versions as the real capture of the board shows them
// (../shared/testdata/nvidia-smi-captures, read here apart from the
// product's reader), compute capability as nvml-mock's own profile of
// the board states it.
func TestBuiltinsAreCompleteNVMLProfiles(t *testing.T) {
	sources := map[string]string{"dgx-a100": "a100", "hgx-h100": "h100", "gb200-tray": "gb200", "t4-vm": "t4"}
	require.Len(t, All(), len(sources))
	for _, b := range All() {
		t.Run(b.Name, func(t *testing.T) {
			data, ok, err := File(b.Name)
			require.NoError(t, err)
			require.True(t, ok)
			var doc map[string]any
			require.NoError(t, yaml.Unmarshal(data, &doc))
			require.Equal(t, "1.0", doc["version"], "version")
			require.True(t, profile.IdentifyDevices(doc), "every GPU states its uuid and minor_number")
			_, gpus, nv, err := profile.ParseNVML(b.Name, data)
			require.NoError(t, err)
			require.Empty(t, nv.MockDefaults(gpus), "nothing left to nvml-mock's A100 defaults")
			for _, g := range gpus {
				d, _, _ := nv.Device(g.Index)
				require.Equal(t, uint32(g.Index), d.Minor(), "GPU %d's minor number is its index", g.Index)
				require.Equal(t, profile.DeviceUUID(g.Index, g.Address.String()), d.UUID, "GPU %d's uuid, IdentifyDevices' rule", g.Index)
			}

			capture := readCapture(t, sources[b.Name])
			def := nv.DeviceDefaults
			require.Equal(t, capture.Driver, nv.System.DriverVersion, "driver version")
			require.Equal(t, capture.CUDA, nv.System.CUDAVersion, "CUDA version")
			cuda, err := nv.CUDAVersion(b.Name)
			require.NoError(t, err)
			require.Equal(t, capture.CUDA, fmt.Sprintf("%d.%d", cuda/1000, cuda%1000/10), "CUDA version, as NVML encodes it")
			require.Equal(t, capture.GPU.Name, def.Name, "name")
			require.Equal(t, strings.ToLower(capture.GPU.Brand), def.Brand, "brand")
			require.Equal(t, strings.ToLower(capture.GPU.Architecture), def.Architecture, "architecture")
			mib, ok := strings.CutSuffix(capture.GPU.Memory, " MiB")
			require.True(t, ok, "capture's fb_memory_usage total %q", capture.GPU.Memory)
			require.Equal(t, mib, fmt.Sprint(*def.Memory.TotalBytes>>20), "memory in MiB")
			require.Zero(t, *def.Memory.TotalBytes%(1<<20), "memory is whole MiB")

			var mock struct {
				DeviceDefaults struct {
					ComputeCapability struct{ Major, Minor int } `yaml:"compute_capability"`
				} `yaml:"device_defaults"`
			}
			mockData, err := os.ReadFile(nvmlMockProfiles(t)[sources[b.Name]])
			require.NoError(t, err)
			require.NoError(t, yaml.Unmarshal(mockData, &mock))
			require.Equal(t, mock.DeviceDefaults.ComputeCapability.Major, *def.ComputeCapability.Major, "compute capability major")
			require.Equal(t, mock.DeviceDefaults.ComputeCapability.Minor, *def.ComputeCapability.Minor, "compute capability minor")
		})
	}
}

// capturedNode is what a real node's nvidia-smi -q -x shows of its
// driver and first GPU.
type capturedNode struct {
	Driver string `xml:"driver_version"`
	CUDA   string `xml:"cuda_version"`
	GPU    struct {
		Name         string `xml:"product_name"`
		Brand        string `xml:"product_brand"`
		Architecture string `xml:"product_architecture"`
		Memory       string `xml:"fb_memory_usage>total"`
	} `xml:"gpu"`
}

func readCapture(t *testing.T, board string) capturedNode {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(overlaytest.SharedTestdata(t, "nvidia-smi-captures"), "qx-"+board+".xml"))
	require.NoError(t, err)
	var c capturedNode
	require.NoError(t, xml.Unmarshal(data, &c))
	require.NotEmpty(t, c.GPU.Name, "qx-%s.xml's first GPU", board)
	return c
}
