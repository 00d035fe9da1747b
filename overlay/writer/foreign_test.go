package writer_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// writeThreeLevelTree writes what nvml-mock's render-pci-sysfs writes for
// one GPU (pkg/system/mockpcisysfs/render): its device directory right
// under the root complex, and a 3-level link to it.
func writeThreeLevelTree(t *testing.T, root, bdf string) {
	t.Helper()
	dev := filepath.Join(root, "sys/devices/pci0000:00", bdf)
	require.NoError(t, os.MkdirAll(dev, 0o755))
	for name, v := range map[string]string{"numa_node": "0\n", "vendor": "0x10de\n", "device": "0x2330\n", "class": "0x030200\n"} {
		require.NoError(t, os.WriteFile(filepath.Join(dev, name), []byte(v), 0o644))
	}
	require.NoError(t, os.MkdirAll(filepath.Join(root, plan.LinksDir), 0o755))
	require.NoError(t, os.Symlink("../../../devices/pci0000:00/"+bdf, filepath.Join(root, plan.LinksDir, bdf)))
}

// TestAnotherRenderersTreeIsRefused: a root holding another renderer's PCI
// tree is refused with one line that says what to do, and left untouched
// down to inodes and mtimes; our own tree with foreign notes is not.
func TestAnotherRenderersTreeIsRefused(t *testing.T) {
	tests := []struct {
		name     string
		setup    func(t *testing.T, root string)
		evidence string
	}{
		{
			name:     "render-pci-sysfs's tree alone",
			setup:    func(t *testing.T, root string) { writeThreeLevelTree(t, root, "0000:1a:00.0") },
			evidence: "(sys/bus/pci/devices/0000:1a:00.0 -> ../../../devices/pci0000:00/0000:1a:00.0, which no render of nvml-mock-sysfs made;",
		},
		{
			// nvml-mock's setup runs render-pci-sysfs on every start of its
			// pod, into the same directory.
			name: "render-pci-sysfs wrote after our render",
			setup: func(t *testing.T, root string) {
				apply(t, root, planOf(t, "t4-vm", nil))
				writeThreeLevelTree(t, root, "0000:3b:00.0")
			},
			evidence: "(sys/bus/pci/devices/0000:3b:00.0 -> ../../../devices/pci0000:00/0000:3b:00.0,",
		},
		{
			name: "only its device directories are left",
			setup: func(t *testing.T, root string) {
				writeThreeLevelTree(t, root, "0000:1a:00.0")
				require.NoError(t, os.RemoveAll(filepath.Join(root, "sys/bus")))
			},
			evidence: "(sys/devices/pci0000:00/,",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "overlay")
			tt.setup(t, root)
			before := overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{Identity: true})
			_, err := writer.Apply(root, planOf(t, "hgx-h100", nil), writer.Options{})
			var another *writer.AnotherRendererError
			require.True(t, errors.As(err, &another), "%v", err)
			msg := err.Error()
			require.NotContains(t, msg, "\n", "one line")
			require.Contains(t, msg, "root "+root+" holds another renderer's PCI tree "+tt.evidence)
			require.Contains(t, msg, "left untouched; render into another --root, or stop render-pci-sysfs and remove "+root+"/sys first (docs/deploy.md")
			overlaytest.RequireSameTree(t, before, overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{Identity: true}), "the refused root")
		})
	}

	// Negative control: our own tree, with a README and notes beside it,
	// renders as before.
	root := filepath.Join(t.TempDir(), "overlay")
	apply(t, root, planOf(t, "t4-vm", nil))
	require.NoError(t, os.WriteFile(filepath.Join(root, plan.LinksDir, "README"), []byte("stray"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "sys/devices/notes"), []byte("mine"), 0o644))
	_, err := writer.Apply(root, planOf(t, "hgx-h100", nil), writer.Options{})
	require.NoError(t, err)
}
