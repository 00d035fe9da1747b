package writer_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
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
	t.Parallel()
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
			_, err := writer.Apply(root, planOf(t, "hgx-h100", nil), writer.Options{SkipSync: true})
			var another *writer.AnotherRendererError
			require.True(t, errors.As(err, &another), "%v", err)
			msg := err.Error()
			require.NotContains(t, msg, "\n", "one line")
			require.Contains(t, msg, "root "+root+" holds another renderer's PCI tree "+tt.evidence)
			require.Contains(t, msg, "left untouched; render into another --root, or stop render-pci-sysfs and remove "+root+"/sys first (docs/user/nvml-mock.md")
			overlaytest.RequireSameTree(t, before, overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{Identity: true}), "the refused root")
		})
	}

	// Negative control: our own tree, with a README and notes beside it,
	// renders as before.
	root := filepath.Join(t.TempDir(), "overlay")
	apply(t, root, planOf(t, "t4-vm", nil))
	require.NoError(t, os.WriteFile(filepath.Join(root, plan.LinksDir, "README"), []byte("stray"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "sys/devices/notes"), []byte("mine"), 0o644))
	_, err := writer.Apply(root, planOf(t, "hgx-h100", nil), writer.Options{SkipSync: true})
	require.NoError(t, err)
}

// TestHostDevicesMergeToggles renders with and without the node's devices
// on one root, in turns: a mock root port and its bridge take the addresses
// that are the host's links in the other plan (a directory becomes a link
// with a mock subtree gone, and back). Each render matches a fresh one.
func TestHostDevicesMergeToggles(t *testing.T) {
	t.Parallel()
	m := planOf(t, "t4-vm", nil).Machine
	host := []plan.HostDevice{
		{Address: pciaddr.Address{Bus: 0, Device: 1}, Target: "../../../devices/pci0000:00/0000:00:01.0"},
		{Address: pciaddr.Address{Bus: 0, Device: 2}, Target: "../../../devices/pci0000:00/0000:00:02.0"},
	}
	merged, err := plan.New(m, plan.Options{HostDevices: host})
	require.NoError(t, err)
	alone, err := plan.New(m, plan.Options{})
	require.NoError(t, err)
	require.Equal(t, plan.Dir.String(), kindAt(alone, "sys/devices/pci0000:00/0000:00:01.0"), "alone, a mock root port sits where the host's device is")
	require.Equal(t, plan.Symlink.String(), kindAt(merged, "sys/devices/pci0000:00/0000:00:01.0"))

	root := filepath.Join(t.TempDir(), "overlay")
	for i, p := range []*plan.Plan{merged, alone, merged, alone} {
		apply(t, root, p)
		fresh := filepath.Join(t.TempDir(), "fresh")
		apply(t, fresh, p)
		overlaytest.RequireSameTree(t, overlaytest.Snapshot(t, fresh, overlaytest.SnapshotOptions{}), overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{}), fmt.Sprintf("render %d against a fresh render", i))
	}
}

func kindAt(p *plan.Plan, path string) string {
	for _, e := range p.Entries {
		if e.Path == path {
			return e.Kind.String()
		}
	}
	return "absent"
}
