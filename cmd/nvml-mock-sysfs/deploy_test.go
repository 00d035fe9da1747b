package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

func renderedRoot(t *testing.T, flags ...string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "overlay")
	code, _, stderr := runCLI(t, append([]string{"render", "--root", root, "--profile", "t4-vm"}, flags...)...)
	require.Equal(t, exitOK, code, stderr)
	return root
}

func TestRenderInstallsItsBinary(t *testing.T) {
	t.Parallel()
	root := renderedRoot(t)
	b, err := os.ReadFile(filepath.Join(root, plan.BinaryFile))
	require.NoError(t, err)
	require.Equal(t, "#!binary\n", string(b))
	st, err := os.Stat(filepath.Join(root, plan.BinaryFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o755), st.Mode().Perm(), "executable, so a served container can run it")

	bare := filepath.Join(t.TempDir(), "overlay")
	code, _, stderr := runCLI(t, "render", "--root", bare, "--profile", "t4-vm", "--no-binary")
	require.Equal(t, exitOK, code, stderr)
	_, err = os.Stat(filepath.Join(bare, plan.BinaryFile))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestCDIUsage(t *testing.T) {
	t.Parallel()
	root := renderedRoot(t)
	out := filepath.Join(t.TempDir(), "spec.yaml")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"neither output nor merge", []string{"cdi", "--root", root}, "one of them"},
		{"both", []string{"cdi", "--root", root, "--output", out, "--merge-into", out}, "one of them"},
		{"kind with merge", []string{"cdi", "--root", root, "--merge-into", out, "--kind", "a.b/c"}, "--kind applies to --output"},
		{"bad kind", []string{"cdi", "--root", root, "--output", out, "--kind", "pcisysfs"}, "want vendor/class"},
		{"bad depth", []string{"cdi", "--root", root, "--output", out, "--also-at", "/host/sys/bus/pci/devices"}, `--also-at "/host/sys/bus/pci/devices": is 5 levels deep`},
		{"target twice", []string{"cdi", "--root", root, "--output", out, "--also-at", "/sys/bus/pci/devices"}, `--also-at "/sys/bus/pci/devices": already a mount target`},
		{"relative root", []string{"cdi", "--root", "overlay", "--output", out}, "absolute"},
		{"mounts format", []string{"mounts", "--root", root, "--format", "yaml"}, "want table or json"},
		{"verify format", []string{"verify", "--format", "yaml"}, "want table or json"},
		{"verify container root", []string{"verify", "--container-root", "/sys/x"}, "container root"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, tc.args...)
			require.Equal(t, exitUsage, code)
			require.Contains(t, stderr, tc.want)
			_, err := os.Stat(out)
			require.ErrorIs(t, err, os.ErrNotExist, "nothing written")
		})
	}
}

func TestCDIGate(t *testing.T) {
	t.Parallel()
	unrendered := filepath.Join(t.TempDir(), "never-rendered")
	out := filepath.Join(t.TempDir(), "spec.yaml")

	code, _, stderr := runCLI(t, "cdi", "--root", unrendered, "--output", out)
	require.Equal(t, exitFailure, code)
	require.Contains(t, stderr, "holds no complete render")
	_, err := os.Stat(out)
	require.ErrorIs(t, err, os.ErrNotExist, "refused: no spec at all")

	code, _, stderr = runCLI(t, "cdi", "--root", unrendered, "--output", out, "--fail-open")
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stderr, "leaving the sysfs mounts out")
	s, err := cdi.ReadSpec(out, 0)
	require.NoError(t, err)
	require.Empty(t, s.Devices[0].ContainerEdits.Mounts, "no bind mount of a missing source")

	code, _, stderr = runCLI(t, "mounts", "--root", unrendered, "--format", "json")
	require.Equal(t, exitFailure, code)
	require.Contains(t, stderr, "holds no complete render")
	code, stdout, _ := runCLI(t, "mounts", "--root", unrendered, "--format", "json", "--fail-open")
	require.Equal(t, exitOK, code)
	require.JSONEq(t, "[]", stdout)
}

func TestCDIAndMountsShareTheMountSet(t *testing.T) {
	t.Parallel()
	root := renderedRoot(t, "--container-root", "/usr/local/nvml-mock")
	out := filepath.Join(t.TempDir(), "spec.yaml")
	flags := []string{"--root", root, "--container-root", "/usr/local/nvml-mock", "--also-at", "/host-sys/bus/pci/devices"}

	code, stdout, stderr := runCLI(t, append([]string{"mounts", "--format", "json"}, flags...)...)
	require.Equal(t, exitOK, code, stderr)
	var listed []cdispec.Mount
	require.NoError(t, json.Unmarshal([]byte(stdout), &listed))
	require.Len(t, listed, 6, "the overlay, the links twice, the module view twice, the node's modules")

	code, stdout, stderr = runCLI(t, append([]string{"cdi", "--output", out}, flags...)...)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "cdiVersion 0.3.0")
	s, err := cdi.ReadSpec(out, 0)
	require.NoError(t, err)
	var inSpec []cdispec.Mount
	for _, m := range s.Devices[0].ContainerEdits.Mounts {
		inSpec = append(inSpec, cdispec.Mount{Source: m.HostPath, Destination: m.ContainerPath, Options: m.Options})
	}
	require.Equal(t, listed, inSpec)
	require.Equal(t, filepath.Join(root, plan.LinksDir), listed[2].Source)
	require.Equal(t, "/host-sys/bus/pci/devices", listed[2].Destination)
}

func TestCDIMergeInto(t *testing.T) {
	t.Parallel()
	root := renderedRoot(t)
	file := filepath.Join(t.TempDir(), "nvidia.yaml")
	orig, err := os.ReadFile("../../deploy/cdispec/testdata/nvidia.yaml")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(file, orig, 0o644))

	code, stdout, stderr := runCLI(t, "cdi", "--root", root, "--merge-into", file)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "removed 3 mounts, added 4")
	require.Contains(t, stdout, "- /var/lib/nvidia-mock/sys/devices -> /sys/devices\n")
	merged, err := os.ReadFile(file)
	require.NoError(t, err)

	code, stdout, stderr = runCLI(t, "cdi", "--root", root, "--merge-into", file)
	require.Equal(t, exitOK, code, stderr)
	require.True(t, strings.HasPrefix(stdout, "unchanged "), stdout)
	again, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, string(merged), string(again), "running it twice changes nothing")
}

func TestCDIMergeRefusesAnInvalidSpec(t *testing.T) {
	t.Parallel()
	root := renderedRoot(t)
	tests := map[string]string{
		"unknown field":   "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n  - name: all\n    containerEdits:\n      env: [A=1]\nextra: true\n",
		"no devices":      "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n",
		"bad version":     "cdiVersion: 9.9.9\nkind: nvidia.com/gpu\ndevices:\n  - name: all\n    containerEdits:\n      env: [A=1]\n",
		"not yaml at all": "{{{\n",
		// Valid only with the /sys/devices mount: removing it leaves the
		// device with no edits, which the CDI library refuses.
		"empty after the merge": "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n  - name: all\n    containerEdits:\n      mounts:\n        - {hostPath: /x, containerPath: /sys/devices, options: [ro, bind]}\n",
	}
	for name, content := range tests {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "nvidia.yaml")
			require.NoError(t, os.WriteFile(file, []byte(content), 0o644))
			code, _, stderr := runCLI(t, "cdi", "--root", root, "--merge-into", file)
			require.Equal(t, exitFailure, code)
			require.Contains(t, stderr, "left as it was")
			b, err := os.ReadFile(file)
			require.NoError(t, err)
			require.Equal(t, content, string(b))
		})
	}
}
