package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
)

func TestMain(m *testing.M) {
	os.Exit(overlaytest.Main(m))
}

// runCLI runs the command in-process, as main would.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return runCLIEnv(t, nil, args...)
}

// runCLIEnv runs the command line with exactly the environment given, so
// that the test's own (a MOCK_NVML_CONFIG, say) never leaks in.
func runCLIEnv(t *testing.T, environ map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	e := &env{stdout: &stdout, stderr: &stderr, executable: fakeExecutable(t, "#!binary\n"), skipSync: true,
		lookupEnv: func(k string) (string, bool) {
			v, ok := environ[k]
			return v, ok
		}}
	code := run(e, args)
	return code, stdout.String(), stderr.String()
}

func TestUsageErrorsExitTwo(t *testing.T) {
	t.Parallel()
	tests := [][]string{
		nil,
		{"frobnicate"},
		{"render", "--no-such-flag"},
		{"render", "--hierarchy", "mesh"},
		{"render", "--host-devices", "all"},
		{"render", "--root", "relative"},
		{"render", "--root", "/"},
		{"render", "--container-root", "/sys/x"},
		{"render", "extra-arg"},
		{"compat", "--format", "xml"},
		{"compat", "--root", "/x", "--sysfs", "/sys"},
		{"profiles", "--show", "b300"},
	}
	for _, args := range tests {
		code, _, stderr := runCLI(t, args...)
		require.Equal(t, exitUsage, code, "%v: %s", args, stderr)
		require.NotEmpty(t, stderr)
	}
	code, _, _ := runCLI(t, "render", "-h")
	require.Equal(t, exitOK, code)
}

// The README's quick start, run: render the default profile into a fresh
// root, and compat finds nothing failed.
func TestRenderThenCompat(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "overlay")
	code, out, stderr := runCLI(t, "render", "--root", root)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, out, "rendered built-in dgx-a100 into "+root)
	require.Contains(t, out, "GPUs 8, NVSwitches 6, root complexes 5")
	bin, err := os.ReadFile(filepath.Join(root, plan.BinaryFile))
	require.NoError(t, err)
	require.Equal(t, "#!binary\n", string(bin), "render installs its own binary")
	info, err := os.Stat(filepath.Join(root, plan.BinaryFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o755), info.Mode().Perm())

	code, out, stderr = runCLI(t, "compat", "--root", root)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, out, "deviceattribute.pcieRoot         0000:07:00.0  ok      pci0000:00")
	require.Contains(t, out, ", 0 failed")

	code, out, _ = runCLI(t, "compat", "--root", root, "--format", "json")
	require.Equal(t, exitOK, code)
	var r compat.Report
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.True(t, r.OK())
	require.Equal(t, filepath.Join(root, "sys"), r.Sysfs)

	// Checked against another profile, the same tree fails: exit 1.
	code, out, _ = runCLI(t, "compat", "--root", root, "--profile", "hgx-h100")
	require.Equal(t, exitFailure, code)
	require.Contains(t, out, "FAIL")
}

// TestCompatNVMLProfile: compat compares the GPUs nvml-mock's NVML reports
// with the tree's, from --nvml-profile or, at a container's --sysfs, from
// MOCK_NVML_CONFIG; our hgx-h100 beside nvml-mock's h100 fails, naming both.
func TestCompatNVMLProfile(t *testing.T) {
	t.Parallel()
	h100 := filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), "h100.yaml")
	ours := filepath.Join(t.TempDir(), "overlay")
	code, _, stderr := runCLI(t, "render", "--root", ours, "--profile", "hgx-h100", "--no-binary")
	require.Equal(t, exitOK, code, stderr)
	theirs := filepath.Join(t.TempDir(), "overlay")
	code, _, stderr = runCLI(t, "render", "--root", theirs, "--profile", h100, "--no-binary")
	require.Equal(t, exitOK, code, stderr)

	code, out, _ := runCLI(t, "compat", "--root", theirs, "--nvml-profile", h100)
	require.Equal(t, exitOK, code, out)
	require.Regexp(t, `nvml-mock: same GPUs +\S+h100.yaml +ok +the 8 GPUs NVML reports \(00000000:1A:00.0 `, out)

	code, out, _ = runCLI(t, "compat", "--root", ours, "--nvml-profile", h100)
	require.Equal(t, exitFailure, code)
	require.Contains(t, out, "FAIL    NVML reports 0000:1a:00.0 10de:2330 subsystem 10de:1658, sysfs has no GPU at 0000:1a:00.0;")
	require.Contains(t, out, "sysfs shows 0000:53:00.0 10de:2330 subsystem 10de:16c1, NVML reports no GPU at 0000:53:00.0")
	require.Contains(t, out, ", 1 failed", "only the NVML row: the tree is what was rendered")

	// At a container's sysfs, MOCK_NVML_CONFIG names NVML's profile.
	nvml := map[string]string{compat.NVMLProfileEnv: h100}
	code, out, _ = runCLIEnv(t, nvml, "compat", "--sysfs", filepath.Join(ours, "sys"), "--container-root", ours)
	require.Equal(t, exitFailure, code)
	require.Contains(t, out, "sysfs has no GPU at 0000:1a:00.0")
	code, out, _ = runCLIEnv(t, nvml, "compat", "--sysfs", filepath.Join(theirs, "sys"), "--container-root", theirs)
	require.Equal(t, exitOK, code, out)
	require.Contains(t, out, compat.NVMLAgreement)
	// On the host (--root), the environment is not the container's.
	code, out, _ = runCLIEnv(t, nvml, "compat", "--root", ours)
	require.Equal(t, exitOK, code, out)
	require.NotContains(t, out, compat.NVMLAgreement)
}

func TestRenderBadProfileIsOneLine(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("devices:\n  - pci: {bus_id: \"0000:zz:00.0\", device_id: 0x233010DE}\n"), 0o644))
	code, _, stderr := runCLI(t, "render", "--root", filepath.Join(dir, "root"), "--profile", bad)
	require.Equal(t, exitFailure, code)
	require.Equal(t, 1, strings.Count(stderr, "\n"), stderr)
	require.Contains(t, stderr, bad+": devices[0].pci.bus_id: value \"0000:zz:00.0\"")
	_, err := os.Stat(filepath.Join(dir, "root"))
	require.ErrorIs(t, err, os.ErrNotExist, "nothing written for a bad profile")
}

func TestDryRunWritesNothing(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "overlay")
	code, out, _ := runCLI(t, "render", "--dry-run", "--profile", "t4-vm", "--root", root)
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "0000:01:00.0 [1b36:000e] PCI bridge, buses 02-02, anchor")
	_, err := os.Stat(root)
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestProfiles(t *testing.T) {
	t.Parallel()
	code, out, _ := runCLI(t, "profiles")
	require.Equal(t, exitOK, code)
	for _, name := range []string{"dgx-a100 (default)", "hgx-h100", "gb200-tray", "t4-vm"} {
		require.Contains(t, out, name)
	}
	code, out, _ = runCLI(t, "profiles", "--show", "hgx-h100")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "device_id: 0x233010DE")
	require.Contains(t, out, "hierarchy: hgx")
	require.Contains(t, out, "architecture: hopper")
	// The very bytes the suites hand nvml-mock's NVML (shipped.File).
	file, ok, err := shipped.File("hgx-h100")
	require.True(t, ok)
	require.NoError(t, err)
	require.Equal(t, string(file), out)
}

// fakeExecutable stands in for os.Executable: a file with the given content.
func fakeExecutable(t *testing.T, content string) func() (string, error) {
	path := filepath.Join(t.TempDir(), "nvml-mock-sysfs")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o755))
	return func() (string, error) { return path, nil }
}

// TestFlagHint: a library error whose remedy is an option gets the flag's
// name from the command line, and no other error does.
func TestFlagHint(t *testing.T) {
	t.Parallel()
	host := fmt.Errorf("plan p.yaml: %w", &plan.HostDevicesError{Reason: "mock gpu 0000:00:1e.0 collides with host device 0000:00:1e.0"})
	require.Equal(t, " (drop --host-devices merge)", flagHint([]any{"render", host}))
	require.Empty(t, flagHint([]any{"render", errors.New("plan p.yaml: something else")}))
	require.Empty(t, flagHint(nil))
}

// nvml-mock's newest shapes (issue 25): the Vera Rubin tray renders with no
// warning, says why its switches are off the bus and where its machine came
// from, and its CDI spec sets GFD's machine-type file; a switch with a
// device_id on a bus no root complex covers is refused in one line naming
// the file, the field and the value, and the tree is left as it was.
func TestRenderNewestShapes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	root := filepath.Join(dir, "overlay")
	vr := "../../testdata/profiles/vera-rubin-tray.yaml"
	code, out, stderr := runCLI(t, "render", "--root", root, "--profile", vr)
	require.Equal(t, exitOK, code, stderr)
	require.Empty(t, stderr, "no warning")
	require.Contains(t, out, "GPUs 4, NVSwitches 0, root complexes 2")
	require.Contains(t, out, "NVSwitches off the bus 4: on buses no root complex covers and without device_id")
	require.Contains(t, out, "HCAs 8 (MT4133 ConnectX-9, InfiniBand)")
	require.Contains(t, out, `machine     "Vera Rubin NVL72" from the board of GPU 0 (10de:307f "NVIDIA Graphics Device")`)
	require.Contains(t, out, "/sys/module: nvidia, nvidia_uvm, nvidia_modeset, nvidia_peermem, mlx5_core, mlx5_ib, ib_core, beside ")

	spec := filepath.Join(dir, "spec.yaml")
	code, out, stderr = runCLI(t, "cdi", "--root", root, "--output", spec)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, out, "  env "+cdispec.MachineTypeFileEnv+"=/opt/nvml-mock/dmi/product_name")

	before := overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{Identity: true})
	bad := filepath.Join(dir, "bad.yaml")
	data, err := os.ReadFile(vr)
	require.NoError(t, err)
	data = []byte(strings.Replace(string(data), `- bdf: "0000:03:00.0"`, `- {bdf: "0000:03:00.0", device_id: 0x22A310DE}`, 1))
	require.NoError(t, os.WriteFile(bad, data, 0o644))
	code, _, stderr = runCLI(t, "render", "--root", root, "--profile", bad)
	require.Equal(t, exitFailure, code)
	require.Equal(t, 1, strings.Count(stderr, "\n"), stderr)
	require.Contains(t, stderr, bad+`: nvlink.switches[2].device_id: value "0x22A310DE": puts the switch at 0000:03:00.0 on this tray's PCIe bus, but no root complex in pcie_topology covers bus 03`)
	require.Empty(t, overlaytest.DiffSnapshots(before, overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{Identity: true})), "a refused profile leaves the tree as it was")
}

// A passthrough profile's render says how many GPUs are bound to vfio-pci
// (issue 26).
func TestRenderVFIOSummary(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "overlay")
	code, out, stderr := runCLI(t, "render", "--root", root, "--profile", "../../testdata/profiles/vfio-passthrough.yaml", "--no-binary")
	require.Equal(t, exitOK, code, stderr)
	require.Empty(t, stderr, "no warning: pci.driver is a known key")
	require.Contains(t, out, "  vfio-pci    3 of 4 GPUs bound for passthrough (own IOMMU group, vfio-dev entry); a real node's NVML lists none of them\n")
	code, out, _ = runCLI(t, "render", "--dry-run", "--root", root, "--profile", "hgx-h100")
	require.Equal(t, exitOK, code)
	require.NotContains(t, out, "vfio-pci", "an nvidia-bound profile binds no GPU to vfio-pci")
}
