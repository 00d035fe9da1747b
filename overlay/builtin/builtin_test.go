package builtin

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
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
		"a100":  {0x20b0, 0x134f, 64 << 30, 8, 6, boards.DGX, []int{0, 1}},
		"h100":  {0x2330, 0x16c1, 128 << 30, 8, 4, boards.HGX, []int{0, 1}},
		"gb200": {0x2941, 0x2046, 256 << 30, 4, 0, boards.Flat, []int{0, 1}},
		"t4":    {0x1eb8, 0x12a2, 256 << 20, 4, 0, boards.Flat, []int{-1}},
	}
	require.Len(t, All(), len(want))
	require.Equal(t, "a100", Default)
	for _, b := range All() {
		t.Run(b.Name, func(t *testing.T) {
			w := want[b.Name]
			m, err := profile.Normalize(b.Name, b.Profile(), profile.Options{})
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
	require.Equal(t, "built-in a100", src)
	_, _, err = Load("b300")
	require.ErrorContains(t, err, `profile "b300": not a built-in (a100, h100, gb200, t4) and not a file`)

	dir := t.TempDir()
	file := filepath.Join(dir, "mine.yaml")
	require.NoError(t, os.WriteFile(file, []byte("devices:\n  - pci: {bus_id: \"0000:18:00.0\", device_id: 0x233010DE}\n"), 0o644))
	p, src, err := Load(file)
	require.NoError(t, err)
	require.Equal(t, file, src)
	require.Len(t, p.Devices, 1)
}
