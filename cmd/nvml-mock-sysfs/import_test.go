package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

func runCapture(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(&env{stdout: &out, stderr: &errOut, skipSync: true}, args)
	return code, out.String(), errOut.String()
}

const t4Capture = `<?xml version="1.0" ?>
<nvidia_smi_log>
	<driver_version>595.91.07</driver_version>
	<gpu id="00000000:00:1E.0">
		<product_name>Tesla T4</product_name>
		<pci>
			<pci_base_class>3</pci_base_class>
			<pci_sub_class>2</pci_sub_class>
			<pci_device_id>1EB810DE</pci_device_id>
			<pci_bus_id>00000000:00:1E.0</pci_bus_id>
			<pci_sub_system_id>12A210DE</pci_sub_system_id>
			<pci_gpu_link_info>
				<pcie_gen><max_link_gen>3</max_link_gen><current_link_gen>3</current_link_gen></pcie_gen>
				<link_widths><max_link_width>16x</max_link_width><current_link_width>8x</current_link_width></link_widths>
			</pci_gpu_link_info>
		</pci>
		<bar1_memory_usage><total>256 MiB</total></bar1_memory_usage>
	</gpu>
</nvidia_smi_log>
`

func TestImportCommand(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "t4.xml")
	require.NoError(t, os.WriteFile(file, []byte(t4Capture), 0o644))
	tests := []struct {
		name     string
		args     []string
		code     int
		stdout   []string // substrings
		stderr   string
		topology string // root complex id the profile must name
	}{
		{"defaults", []string{"import", "nvidia-smi", file}, 0,
			[]string{"# nvml-mock-sysfs profile imported from nvidia-smi -q -x capture " + file, "name: Tesla T4", "bus_id: 0000:00:1E.0", "hierarchy: flat", "current_link_width: 8", "total_bytes: 268435456"}, "", "pci0000:00"},
		{"flags after the file", []string{"import", "nvidia-smi", file, "--numa-node", "0"}, 0,
			[]string{"numa_node: 0"}, "", "pci0000:00"},
		{"explicit host bridge", []string{"import", "nvidia-smi", "--root-complex", "pci0000:00=1", file}, 0,
			[]string{"numa_node: 1", "root complexes as given"}, "", "pci0000:00"},
		{"help explains the inference", []string{"import", "nvidia-smi", "-h"}, 0, []string{"per-gpu (default): each GPU bus gets its own host bridge"}, "", ""},
		{"no format", []string{"import", file}, 2, nil, "nvml-mock-sysfs import: \"" + file + "\" is not a capture format: want nvidia-smi; run 'nvml-mock-sysfs import -h' for usage\n", ""},
		{"no file", []string{"import", "nvidia-smi"}, 2, nil, "import: want exactly one capture file, got 0", ""},
		{"bad inference", []string{"import", "nvidia-smi", "--root-complexes", "per-socket", file}, 2, nil, `--root-complexes "per-socket": want one of [per-gpu per-domain]`, ""},
		{"bad host bridge", []string{"import", "nvidia-smi", "--root-complex", "0000:00", file}, 2, nil, `invalid value "0000:00" for flag --root-complex`, ""},
		{"forced hierarchy on a VM capture", []string{"import", "nvidia-smi", "--hierarchy", "hgx", file}, 1, nil,
			"nvml-mock-sysfs: import: nvidia-smi capture " + file + `: gpu 0000:00:1e.0: value "hgx": the GPU sits on the root bus of pci0000:00, where only the flat hierarchy puts a GPU`, ""},
		{"missing file", []string{"import", "nvidia-smi", filepath.Join(t.TempDir(), "none.xml")}, 1, nil, "no such file or directory", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCapture(t, tc.args...)
			require.Equal(t, tc.code, code, stderr)
			for _, s := range tc.stdout {
				require.Contains(t, stdout, s)
			}
			require.Contains(t, stderr, tc.stderr)
			if tc.topology == "" {
				return
			}
			p, err := profile.Parse("out.yaml", []byte(stdout))
			require.NoError(t, err)
			m, err := profile.Normalize("out.yaml", p, profile.Options{})
			require.NoError(t, err)
			require.Equal(t, tc.topology, m.Devices[0].RootComplex.String())
		})
	}
}

// TestImportRealCapturesRender runs the command on each real capture and
// renders its output with the render command.
func TestImportRealCapturesRender(t *testing.T) {
	t.Parallel()
	// The T4 VM capture above always runs; the real ones need ../shared,
	// and only that subtest skips without it.
	inRepo := filepath.Join(t.TempDir(), "t4.xml")
	require.NoError(t, os.WriteFile(inRepo, []byte(t4Capture), 0o644))
	t.Run("in-repo/t4.xml", func(t *testing.T) { importAndRender(t, inRepo) })
	t.Run("shared", func(t *testing.T) {
		dir := overlaytest.SharedTestdata(t, "nvidia-smi-captures")
		files, err := filepath.Glob(filepath.Join(dir, "*.xml"))
		require.NoError(t, err)
		for _, f := range files {
			t.Run(filepath.Base(f), func(t *testing.T) { importAndRender(t, f) })
		}
	})
}

func importAndRender(t *testing.T, capture string) {
	code, stdout, stderr := runCapture(t, "import", "nvidia-smi", capture)
	require.Equal(t, 0, code, stderr)
	require.Empty(t, stderr, "captures import without notes")
	prof := filepath.Join(t.TempDir(), "imported.yaml")
	require.NoError(t, os.WriteFile(prof, []byte(stdout), 0o644))
	root := filepath.Join(t.TempDir(), "overlay")
	code, out, stderr := runCapture(t, "render", "--root", root, "--profile", prof, "--no-binary")
	require.Equal(t, 0, code, stderr)
	gpus := strings.Count(stdout, "bus_id:")
	require.Contains(t, out, "GPUs "+strconv.Itoa(gpus)+",")
}
