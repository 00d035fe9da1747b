package mountns_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// hostDevices lists this machine's PCI devices, or skips.
func hostDevices(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(sysfs.KernelLinksDir)
	if err != nil || len(entries) == 0 {
		overlaytest.Missing(t, "this machine shows no PCI devices in %s to merge (%v)", sysfs.KernelLinksDir, err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// TestHostDevicesMerge renders each built-in with --host-devices merge from
// this machine's real /sys, mounts it as a container would, and checks that
// the container loses nothing: every device lspci listed before is still
// listed with the same ids, every entry resolves, and go-nvlib's scan (which
// reads every entry) and deviceattribute work at their default /sys.
func TestHostDevicesMerge(t *testing.T) {
	requireNamespace(t)
	host := hostDevices(t)
	before, err := exec.Command("lspci", "-D", "-n").Output()
	require.NoError(t, err)
	for _, name := range []string{"dgx-a100", "hgx-h100", "gb200-tray", "t4-vm"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			root, p := render(t, overlay.Options{Profile: name, HostDevices: overlay.HostDevicesMerge, HostSysfs: "/sys"})
			out := inNamespace(t, root, `for e in /sys/bus/pci/devices/*; do
	readlink -e "$e" >/dev/null || { echo "dangling $e" >&2; exit 1; }
	cat "$e/vendor" >/dev/null
done
lspci -D -n
echo ==tree==
lspci -tv`)
			listed, tree, _ := strings.Cut(out, "==tree==\n")
			for _, l := range lines(string(before)) {
				require.Contains(t, listed, l+"\n", "the container still sees the host's %s", strings.Fields(l)[0])
			}
			for _, n := range p.Tree.Nodes() {
				require.Contains(t, listed, n.Address.String()+" ", "lspci lists the mock %s", n.Address)
			}
			require.Len(t, lines(listed), len(host)+len(p.Tree.Nodes()))
			require.Contains(t, tree, "[0000:00]")

			r := consumersInNamespace(t, root)
			require.True(t, r.Compat.OK(), "%+v", r.Compat.Failures())
			requireRow(t, r.Compat, compat.AllDevices)
			for _, row := range r.Fidelity {
				require.False(t, row.Failing(), "%+v", row)
			}

			// On the host, shadow links carry the kernel-form text on into
			// the real /sys/devices, so checks at <root>/sys pass too.
			m := p.Machine
			report := compat.Run(m, filepath.Join(root, "sys"))
			require.True(t, report.OK(), "%+v", report.Failures())
			for _, bdf := range host {
				_, err := filepath.EvalSymlinks(filepath.Join(root, plan.LinksDir, bdf, "vendor"))
				require.NoError(t, err, "host device %s resolves on the host too", bdf)
			}
		})
	}
}

func requireRow(t *testing.T, r *compat.Report, check string) {
	t.Helper()
	for _, x := range r.Results {
		if x.Check == check {
			require.True(t, x.OK, "%+v", x)
			return
		}
	}
	require.Failf(t, "no row", "compat has no %s row", check)
}

// TestHostDeviceCollision puts a mock GPU at the address of one of this
// machine's real devices: merging must refuse, naming both.
func TestHostDeviceCollision(t *testing.T) {
	t.Parallel()
	host := hostDevices(t)
	bdf := host[len(host)-1]
	target, err := os.Readlink(sysfs.KernelLinksDir + "/" + bdf)
	require.NoError(t, err)
	prof := filepath.Join(t.TempDir(), "collide.yaml")
	require.NoError(t, os.WriteFile(prof, []byte(fmt.Sprintf(`device_defaults:
  pci:
    device_id: 0x1EB810DE
devices:
  - pci:
      bus_id: %q
pcie_topology:
  hierarchy: flat
  root_complexes:
    - id: pci%s
      devices: [%q]
`, bdf, bdf[:7], bdf)), 0o644))

	_, _, err = overlay.Render(overlay.Options{Profile: prof, Root: t.TempDir(), HostDevices: overlay.HostDevicesMerge, HostSysfs: "/sys"})
	require.ErrorContains(t, err, fmt.Sprintf("mock gpu %s collides with host device %s (%s)", bdf, bdf, target))

	_, _, err = overlay.Render(overlay.Options{Profile: prof, Root: t.TempDir()})
	require.NoError(t, err, "without merging, the mock may take any address")
}
