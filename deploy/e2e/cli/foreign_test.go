package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// TestRenderRefusesAnotherRenderersTree: render refuses, with one line that
// says what to do, a root holding a tree that the real render-pci-sysfs
// (nvml-mock's own renderer, supplied: no registry serves it) wrote from
// nvml-mock's h100 profile, alone or over one of ours, as nvml-mock's setup
// does on every start of its pod; and leaves it untouched. Without it, the
// writer's own test of a foreign tree of the same shape stands
// (overlay/writer TestAnotherRenderersTreeIsRefused), and this one says it is not run.
func TestRenderRefusesAnotherRenderersTree(t *testing.T) {
	t.Parallel()
	renderPCISysfs, supplied := programs.NeedSupplied(t, programs.RenderPCISysfs)
	if !supplied {
		t.Log(programs.NotRun(t.Name(), programs.RenderPCISysfs))
		return
	}
	bin := binaries.Binary(t)
	h100 := filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), "h100.yaml")
	theirs := func(t *testing.T, root string) {
		t.Helper()
		out, err := exec.Command(renderPCISysfs, "--config", h100, "--output", root).CombinedOutput()
		require.NoError(t, err, "render-pci-sysfs: %s", out)
		target, err := os.Readlink(filepath.Join(root, plan.LinksDir, "0000:1a:00.0"))
		require.NoError(t, err)
		require.Equal(t, "../../../devices/pci0000:00/0000:1a:00.0", target, "its 3-level links")
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, root string)
	}{
		{"its tree alone", theirs},
		{"its tree over ours", func(t *testing.T, root string) {
			out, err := exec.Command(bin, "render", "--root", root, "--profile", "t4-vm", "--no-binary").CombinedOutput()
			require.NoError(t, err, "%s", out)
			theirs(t, root)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "nvml-mock")
			tt.setup(t, root)
			before := overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{Identity: true})

			var errOut strings.Builder
			cmd := exec.Command(bin, "render", "--root", root, "--profile", h100)
			cmd.Stderr = &errOut
			err := cmd.Run()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit)
			require.Equal(t, 1, exit.ExitCode(), "render exits 1 on a refused root")
			stderr := errOut.String()
			require.Equal(t, 1, strings.Count(stderr, "\n"), stderr)
			require.Regexp(t, `^nvml-mock-sysfs: render into `+regexp.QuoteMeta(root)+`: root `+regexp.QuoteMeta(root)+` holds another renderer's PCI tree \(sys/bus/pci/devices/0000:[0-9a-f]{2}:00\.0 -> \.\./\.\./\.\./devices/pci0000:[08]0/0000:[0-9a-f]{2}:00\.0, which no render of nvml-mock-sysfs made;`, stderr)
			require.Contains(t, stderr, "render into another --root, or stop render-pci-sysfs and remove "+root+"/sys first")
			overlaytest.RequireSameTree(t, before, overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{Identity: true}), "the refused root")
			t.Logf("%s: %s", tt.name, strings.TrimSpace(stderr))
		})
	}
}
