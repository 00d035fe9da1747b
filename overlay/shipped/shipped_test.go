package shipped

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

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
