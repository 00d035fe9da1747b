package sabotage_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/docmatrix"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// TestFailingSuppliedProgram supplies programs that fail (a script that
// exits 1 under the upstream name) and requires the rows that run them red:
// a supplied program is run, not merely found. The DRA suite gets a failing
// gpu-kubelet-plugin beside a file named libnvidia-ml.so.1 (the plugin
// fails before it loads one); the CLI's test of nvml-mock's renderer a
// failing render-pci-sysfs.
func TestFailingSuppliedProgram(t *testing.T) {
	programs.SkipShort(t)
	overlaytest.RequireRoot(t)
	goTool := overlaytest.RequireProgram(t, "go", "golang")
	failing := []byte("#!/bin/sh\necho 'a supplied program that fails, on purpose' >&2\nexit 1\n")
	run := func(t *testing.T, pkg, runPattern string, files map[string][]byte) ([]byte, docmatrix.Verdicts, error) {
		t.Helper()
		dir := t.TempDir()
		for name, data := range files {
			require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o755))
		}
		matrix := filepath.Join(t.TempDir(), "matrix.md")
		cmd := exec.Command(goTool, "test", "-count=1", "-timeout", "10m", "-run", runPattern, pkg)
		cmd.Dir = hosttest.Wing(t)
		cmd.Env = append(withoutSuiteEnv(os.Environ()), programs.SuppliedEnv+"="+dir, "NVML_MOCK_SYSFS_K8S_MATRIX="+matrix)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		table, _ := os.ReadFile(matrix)
		return out.Bytes(), docmatrix.ReadVerdicts(string(table)), err
	}

	t.Run(programs.GPUKubeletPlugin, func(t *testing.T) {
		out, v, err := run(t, "./dra", "^TestDRA$/^built-in_dgx-a100$", map[string][]byte{
			programs.GPUKubeletPlugin: failing,
			programs.MockNVML:         []byte("not loaded: the plugin exits first"),
		})
		require.Error(t, err, "the DRA suite with a failing plugin must fail:\n%s", out)
		require.NotEmpty(t, v.Red, "its rows must turn red:\n%s", out)
		require.Empty(t, v.Green, "no row passes with a failing plugin")
		require.Contains(t, string(out), "the kubelet plugin exited", "the suite says the plugin exited")
	})
	t.Run(programs.RenderPCISysfs, func(t *testing.T) {
		out, _, err := run(t, "./cli", "^TestRenderRefusesAnotherRenderersTree$", map[string][]byte{
			programs.RenderPCISysfs: failing,
		})
		require.Error(t, err, "the renderer's test with a failing renderer must fail:\n%s", out)
		require.Contains(t, string(out), "render-pci-sysfs: a supplied program that fails, on purpose")
	})
}
