package compat

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

func TestGFDMode(t *testing.T) {
	t.Parallel()
	for class, want := range map[uint32]string{0x030200: "compute", 0x030000: "graphics", 0x030201: "unknown", 0x068000: "unknown"} {
		require.Equal(t, want, GFDMode(class), "class 0x%06x", class)
	}
}

// gpuModeRows renders a profile with a VGA-class GPU and returns the
// gpu.mode rows by device.
func gpuModeRows(t *testing.T, mutate func(sysfs string)) map[string]Result {
	t.Helper()
	root := filepath.Join(t.TempDir(), "overlay")
	const prof = "../testdata/two-domains.yaml"
	_, _, err := overlay.Render(overlay.Options{Profile: prof, Root: root, Writer: writer.Options{SkipSync: true}})
	require.NoError(t, err)
	sysfs := filepath.Join(root, "sys")
	mutate(sysfs)
	m, err := overlay.LoadMachine(prof, "")
	require.NoError(t, err)
	rows := map[string]Result{}
	for _, r := range Run(m, sysfs).Results {
		if r.Check == GPUMode {
			rows[r.Device] = r
		}
	}
	require.Len(t, rows, len(m.GPUs()))
	return rows
}

func TestGPUModeRow(t *testing.T) {
	t.Parallel()
	rows := gpuModeRows(t, func(string) {})
	for dev, r := range rows {
		require.True(t, r.OK, "%s: %s", dev, r.Detail)
	}
	require.Equal(t, "class 0x030000 -> graphics", rows["0002:9d:00.0"].Detail, "the profile's VGA-class L40S")
	require.Equal(t, "class 0x030200 -> compute", rows["0002:3b:00.0"].Detail)

	// A GPU whose class file says VGA, though the profile says 3D controller.
	rows = gpuModeRows(t, func(sysfs string) {
		require.NoError(t, os.WriteFile(filepath.Join(sysfs, "bus/pci/devices/000a:05:00.0/class"), []byte("0x030000\n"), 0o644))
	})
	require.False(t, rows["000a:05:00.0"].OK)
	require.Equal(t, "class 0x030000 -> graphics, want compute (class 0x030200)", rows["000a:05:00.0"].Detail)
}
