package main

import (
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/compat/fidelity"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

func TestFidelityCommand(t *testing.T) {
	t.Parallel()
	root, out := renderPassingFidelity(t, "hgx-h100")
	require.Regexp(t, `0000:53:00.0\s+driver\s+consumer\s+present\s+-> \.\./\.\./\.\./\.\./\.\./\.\./bus/pci/drivers/nvidia\n`, out)
	require.Regexp(t, `0000:53:00.0\s+resource0\s+kernel\s+missing\s+real nodes show it for functions with memory BARs \(mmap files\)\n`, out)
	require.Regexp(t, `420 attributes at .*/sys: \d+ present, \d+ missing, 0 different; 0 failing`, out)

	code, out, _ := runCapture(t, "fidelity", "--root", root, "--device", "0000:53:00.0", "--format", "json", "--gaps")
	require.Equal(t, 0, code)
	var r fidelity.Report
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.NotEmpty(t, r.Rows)
	for _, row := range r.Rows {
		require.Equal(t, "0000:53:00.0", row.Device)
		require.NotEqual(t, fidelity.Present, row.Status, "--gaps lists only gaps")
	}

	// A class GPU Feature Discovery would read as graphics: different, and
	// the command fails.
	class := filepath.Join(root, "sys/bus/pci/devices/0000:64:00.0/class")
	require.NoError(t, os.Remove(class))
	require.NoError(t, os.WriteFile(class, []byte("0x030000\n"), 0o644))
	code, out, _ = runCapture(t, "fidelity", "--root", root, "--gaps")
	require.Equal(t, 1, code)
	require.Regexp(t, `0000:64:00.0\s+class\s+consumer\s+different \(FAIL\)\s+0x030000, profile says 0x030200\n`, out)

	code, _, stderr := runCapture(t, "fidelity", "--root", root, "--device", "0000:01:00.0")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "fidelity: 0000:01:00.0 is not a device of")

	code, _, stderr = runCapture(t, "fidelity", "--root", root, "--sysfs", "/sys")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "give --root or --sysfs, not both")
}

// TestFidelityPassthrough checks a passthrough node's render against
// fidelity: each GPU is held to the driver its profile binds it to, so the
// vfio-bound GPUs pass with vfio-pci and the nvidia-bound one with nvidia.
// The control points a vfio GPU's driver link at nvidia, as a render that
// ignored pci.driver would, and must fail.
func TestFidelityPassthrough(t *testing.T) {
	t.Parallel()
	root, out := renderPassingFidelity(t, "../../testdata/profiles/vfio-passthrough.yaml")
	require.Regexp(t, `0000:18:00.0\s+driver\s+consumer\s+present\s+-> (\.\./)+bus/pci/drivers/`+regexp.QuoteMeta(profile.DriverVFIO)+`\n`, out)
	require.Regexp(t, `0000:db:00.0\s+driver\s+consumer\s+present\s+-> (\.\./)+bus/pci/drivers/`+profile.DriverNVIDIA+`\n`, out)
	require.Regexp(t, ` 0 different; 0 failing`, out)

	link := filepath.Join(root, "sys", sysfs.LinksDir, "0000:18:00.0", "driver")
	text, err := os.Readlink(link)
	require.NoError(t, err)
	require.NoError(t, os.Remove(link))
	require.NoError(t, os.Symlink(path.Join(path.Dir(text), profile.DriverNVIDIA), link))
	code, out, _ := runCapture(t, "fidelity", "--root", root, "--gaps")
	require.Equal(t, 1, code, out)
	require.Regexp(t, `0000:18:00.0\s+driver\s+consumer\s+different \(FAIL\)\s+-> (\.\./)+bus/pci/drivers/nvidia, want driver `+regexp.QuoteMeta(profile.DriverVFIO)+`\n`, out)
}

// TestFidelityOnThisNode runs the command as on a real node: no profile,
// formats only, against the kernel's own sysfs.
func TestFidelityOnThisNode(t *testing.T) {
	t.Parallel()
	entries, err := os.ReadDir(sysfs.KernelLinksDir)
	if err != nil || len(entries) == 0 {
		overlaytest.Missing(t, "this machine shows no PCI devices in /sys/bus/pci/devices (%v)", err)
	}
	// A device bound to a driver, as a GPU bound to nvidia is.
	bound := ""
	for _, e := range entries {
		if _, err := os.Lstat(filepath.Join(sysfs.KernelLinksDir, e.Name(), "driver")); err == nil {
			bound = e.Name()
			break
		}
	}
	if bound == "" {
		overlaytest.Missing(t, "no PCI device of this machine is bound to a driver")
	}
	code, out, stderr := runCapture(t, "fidelity", "--sysfs", "/sys", "--container-root", t.TempDir(), "--device", bound)
	require.Equal(t, 0, code, stderr+out)
	require.Regexp(t, bound+`\s+vendor\s+consumer\s+present\s+0x[0-9a-f]{4}\n`, out)
	require.Contains(t, out, " 0 different; 0 failing")
}

// renderPassingFidelity renders profile and runs fidelity on it, which
// must pass; it returns the root and fidelity's report.
func renderPassingFidelity(t *testing.T, profile string) (root, report string) {
	t.Helper()
	root = t.TempDir()
	code, _, stderr := runCapture(t, "render", "--root", root, "--profile", profile, "--no-binary")
	require.Equal(t, 0, code, stderr)
	code, report, stderr = runCapture(t, "fidelity", "--root", root)
	require.Equal(t, 0, code, stderr+report)
	return root, report
}
